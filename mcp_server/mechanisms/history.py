"""The campaign's history as the mechanisms see it: each experiment with its train.py, read from git
(parsed once per version, cached on disk across server processes)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from mcp_server.mechanisms.base import History, history_from_rows
from mcp_server.mechanisms.source import export_analysis, import_analysis

log = logging.getLogger("loopwright.mechanisms")

MAX_TRIALS = 500        # the latest 500 candidates (each version: ~1 ms from git, parsed once, cached on disk)


def history_from_engine(engine) -> History:
    """The campaign's history, with each experiment's train.py read from git (cached per commit)."""
    from mcp_server.loop import gitops

    c = engine.campaign
    rel = engine.ws.cfg.paths.editable[0]
    rows = engine.ledger.experiments(c["id"])
    cand = [r["id"] for r in rows if not r["is_baseline"] and r["confirm_of"] is None]
    if len(cand) > MAX_TRIALS:
        first = cand[-MAX_TRIALS]
        # older keeps stay in: the best-so-far that later gains are measured against runs through them
        rows = [r for r in rows if r["is_baseline"] or r["verdict"] == "keep" or r["id"] >= first
                or (r["confirm_of"] or 0) >= first]
    repo = gitops.repo(engine.ws.root)
    cache: dict[str, str] = {}
    disk = _AnalysisCache(engine.ws.state_dir / "cache" / "mechanisms.json")

    def source_at(commit: str) -> str:
        if commit not in cache:
            try:
                cache[commit] = (repo.commit(commit).tree / rel).data_stream.read().decode("utf-8", "replace")
            except Exception:  # noqa: BLE001 - a missing commit or file is simply an unknown source
                cache[commit] = ""
            disk.prime(cache[commit])
        return cache[commit]

    history = history_from_rows(rows, source_at, engine.ws.cfg.noise.sigma_floor, c["best_commit"])
    disk.save()
    return history


class _AnalysisCache:
    """Parsed train.py versions on disk, by sha256: a new server process (every agent session starts
    one) would otherwise parse every tried version again (~20-40 ms each on a busy 2-core machine)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.data: dict = json.loads(path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.used: dict = {}

    def prime(self, source: str) -> None:
        if not source:
            return
        key = hashlib.sha256(source.encode()).hexdigest()
        if key in self.data:
            try:
                import_analysis(source, self.data[key])
            except (KeyError, TypeError):   # an entry from another version of loopwright: parse again
                pass
        entry = self.data.get(key) or export_analysis(source)
        if entry is not None:
            self.used[key] = entry

    def save(self) -> None:
        if set(self.used) == set(self.data):
            return
        try:   # keep only what this history used: the file stays as small as the campaign
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.used))
            os.replace(tmp, self.path)
        except OSError:
            log.warning("could not write %s; the mechanisms still work, only slower", self.path)
