"""The frozen manifest and the integrity check (the second line of defence).

Hooks can be bypassed (a Python one-liner, a script train.py runs); this check
cannot: before every run and every score the working tree's frozen files are
compared with the pinned commit's blobs, the score-deciding config sections
with their pinned hash, and the data with the hashes in the committed
`loopwright.lock`. A mismatch is restored from the pinned commit (the tampered
copy is kept under .loopwright/tamper/ for a human), recorded as a tamper event,
and the run or score is refused.
"""
from __future__ import annotations

import fnmatch
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mcp_server.loop import config as cfgmod
from mcp_server.loop import gitops
from mcp_server.loop.workspace import LOCK_NAME, Workspace, prepare_data


@dataclass(frozen=True)
class Mismatch:
    path: str
    kind: str          # "file" | "missing" | "config" | "data" | "git"
    detail: str


# Hash cache for big data files: (size, mtime_ns, ctime_ns) -> sha256. ctime changes on any
# write and cannot be set by a user, so a rewritten file is always re-hashed.
_HASH_CACHE: dict[str, tuple[tuple[int, int, int], str]] = {}


def _cached_sha(path: Path) -> str:
    st = path.stat()
    key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    hit = _HASH_CACHE.get(str(path))
    if hit and hit[0] == key:
        return hit[1]
    digest = gitops.file_sha256(path)
    _HASH_CACHE[str(path)] = (key, digest)
    return digest


def pinned_lock(ws: Workspace, pinned: str) -> dict:
    return json.loads(gitops.verified_blob_bytes(ws.root, pinned, LOCK_NAME))


def frozen_tracked(ws: Workspace, pinned: str) -> list[str]:
    pats = ws.cfg.paths.frozen
    return [p for p in gitops.tracked_files(ws.root, pinned)
            if any(fnmatch.fnmatch(p, g) or p == g for g in pats) and p != cfgmod.CONFIG_NAME]


def check(ws: Workspace, pinned: str) -> list[Mismatch]:
    try:
        return _check(ws, pinned)
    except gitops.GitError as e:
        # The pinned commit itself cannot be trusted: nothing can be restored from it.
        return [Mismatch(".git", "git", f"{e}; the workspace history was tampered with - inspect it with "
                                        "`git fsck` and start a new workspace with `loopwright init`")]


def _check(ws: Workspace, pinned: str) -> list[Mismatch]:
    out: list[Mismatch] = []
    for rel in frozen_tracked(ws, pinned):
        path = ws.root / rel
        if not path.is_file():
            out.append(Mismatch(rel, "missing", "frozen file is missing"))
        elif path.read_bytes() != gitops.verified_blob_bytes(ws.root, pinned, rel):
            out.append(Mismatch(rel, "file", "differs from the pinned commit"))

    lock = pinned_lock(ws, pinned)
    try:
        current = cfgmod.load_config(ws.root)
        if current.frozen_hash() != lock["config_frozen"]:
            out.append(Mismatch(cfgmod.CONFIG_NAME, "config",
                                "the frozen sections [benchmark] [paths] [noise] changed"))
    except cfgmod.ConfigError as e:
        out.append(Mismatch(cfgmod.CONFIG_NAME, "config", f"unreadable: {str(e).splitlines()[0]}"))

    for name, digest in lock["data"].items():
        path = ws.data_dir / name
        if not path.is_file():
            out.append(Mismatch(f"{ws.cfg.paths.state_dir}/data/{name}", "data", "data file is missing"))
        elif _cached_sha(path) != digest:
            out.append(Mismatch(f"{ws.cfg.paths.state_dir}/data/{name}", "data", "data file hash changed"))
    return out


def restore(ws: Workspace, pinned: str, mismatches: list[Mismatch]) -> list[str]:
    """Put the pinned state back; keep tampered copies as evidence. Returns what was done."""
    done: list[str] = []
    evidence = ws.state_dir / "tamper" / time.strftime("%Y%m%d-%H%M%S")
    files = [m for m in mismatches if m.kind in ("file", "missing", "config")]
    for m in files:
        path = ws.root / m.path
        if path.is_file():
            (evidence / m.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, evidence / m.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.write_bytes(gitops.verified_blob_bytes(ws.root, pinned, m.path))
        done.append(f"restored {m.path} from the pinned commit")
    if any(m.kind == "data" for m in mismatches):
        done.append(_rebuild_data(ws, pinned))
    if files:
        ws.reload_config()
    return done


def _rebuild_data(ws: Workspace, pinned: str) -> str:
    """Data is not in git: rebuild it with the pinned prepare.py (deterministic) and re-verify."""
    lock = pinned_lock(ws, pinned)
    for name in lock["data"]:
        (ws.data_dir / name).unlink(missing_ok=True)
    try:
        prepare_data(ws.root, ws.data_dir, lock.get("corpus_arg") or ws.cfg.benchmark.corpus)
    except Exception as e:  # noqa: BLE001 - reported to the caller as text
        return f"could not rebuild the data: {e}"
    bad = [n for n, d in lock["data"].items()
           if not (ws.data_dir / n).is_file() or gitops.file_sha256(ws.data_dir / n) != d]
    if bad:
        return (f"rebuilt the data but {', '.join(bad)} still differ from loopwright.lock; the corpus changed "
                "on this machine -- start a new workspace with `loopwright init`")
    return "rebuilt the data with the pinned prepare.py; hashes match loopwright.lock again"


def describe(mismatches: list[Mismatch]) -> str:
    return "; ".join(f"{m.path}: {m.detail}" for m in mismatches)


def verify_or_raise(ws: Workspace, pinned: str) -> Optional[list[Mismatch]]:
    """Convenience for callers: None when clean, the mismatches otherwise (already restored)."""
    mism = check(ws, pinned)
    if not mism:
        return None
    restore(ws, pinned, mism)
    return mism
