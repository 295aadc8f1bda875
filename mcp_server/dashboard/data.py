"""What the dashboard shows, read from the ledger's public API and the engine's read-only paths.

Nothing here writes, takes the experiment lock or holds a read transaction open between calls: each
ledger call is one short autocommit statement (SQLite WAL: readers never block the loop's writer), so a
slow browser cannot slow a run. Values are plain data; escaping is the views' job.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from mcp_server.ledger.store import Ledger
from mcp_server.loop import approvals, gitops, replay
from mcp_server.loop.engine import Engine, LoopError
from mcp_server.loop.status import executor_view
from mcp_server.loop.workspace import RECORD_NAME, Workspace, WorkspaceError, state_home
from mcp_server.report.writer import collect

LOG_TAIL_CHARS = 8000
DIFF_CHARS = 60_000


class DashboardError(RuntimeError):
    """A workspace the dashboard cannot show, said as what to do."""


@dataclass(frozen=True)
class Source:
    """One workspace on the dashboard (index = its place in the URL: /w/<index>/)."""
    index: int
    root: Path
    db_path: Path      # the ledger, resolved (and its state directory checked) when the dashboard started

    def ledger(self) -> Ledger:
        return Ledger(self.db_path)

    def version(self) -> list[Any]:
        """A value that changes whenever anything shown changes (cheap: a few index probes)."""
        with self.ledger() as led:
            out: list[Any] = [led.progress_mark(), led.last_event_id()]
            c = led.campaign()
            if c is not None:
                out += [c["id"], c["best_commit"], c["status"], led.max_experiment_id(c["id"]),
                        led.count_running(c["id"]), [(a["id"], a["status"]) for a in led.approvals(c["id"])]]
            return out

    def engine(self) -> Engine:
        return Engine(self.root, read_only=True)


def discover() -> list[Path]:
    """Every workspace with a state directory under this user's state home (`--all`)."""
    roots = []
    for rec in sorted((state_home() / "workspaces").glob(f"*/{RECORD_NAME}")):
        try:
            root = Path(json.loads(rec.read_text())["root"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if (root / "loopwright.toml").is_file():
            roots.append(root)
    return sorted(set(roots))


def sources(roots: list[Path]) -> list[Source]:
    """Open-check every workspace now, so a bad path fails at start with a message, not on first view."""
    if not roots:
        raise DashboardError(f"no workspace to show: none under {state_home() / 'workspaces'}; pass "
                             "--workspace DIR or create one with `loopwright init DIR`")
    out = []
    for i, root in enumerate(roots):
        try:
            ws = Workspace.open(root)
        except (WorkspaceError, OSError, ValueError) as e:
            raise DashboardError(f"cannot show {root}: {e}") from None
        out.append(Source(i, ws.root, ws.db_path))
    return out


def _campaign(eng: Engine) -> Optional[dict]:
    try:
        return eng.campaign
    except LoopError:      # not on a campaign branch (e.g. checked out by hand): show the latest campaign
        return eng.ledger.campaign()


def _state(budget, waiting: list[dict], running: int) -> str:
    if running:
        return "running"
    if budget.should_stop:
        return "budget spent" if not budget.stop_requested else "stopped"
    if any(a["status"] == "pending" for a in waiting):
        return "waiting on a person"
    return "idle"


def snapshot(src: Source) -> dict:
    """Everything the workspace page shows: overview, chart points, experiment table, approvals."""
    with src.engine() as eng:
        c = _campaign(eng)
        base = {"index": src.index, "root": str(src.root)}
        if c is None:
            return {**base, "tag": None, "state": "no campaign", "points": [], "approvals": [], "overview": {}}
        led = eng.ledger
        rows = led.experiments_brief(c["id"])
        b = eng.budget(c)
        s = eng.summary(c)
        waiting = approvals.waiting(led, c["id"])
        running = led.count_running(c["id"]) + len(led.inflight(c["id"]))
        data = collect(rows, eng.ws.cfg, c["tag"])
        ex = executor_view(eng)
        trial = led.trials(c["id"], running=True)
        overview = {
            "best": s.best_val_bpb, "baseline": s.baseline_val_bpb,
            "gain": None if s.best_val_bpb is None or s.baseline_val_bpb is None
            else s.baseline_val_bpb - s.best_val_bpb,
            "best_experiment_id": s.best_experiment_id, "best_commit": s.best_commit,
            "experiments": s.experiments, "kept": s.kept, "discarded": s.discarded, "crashed": s.crashed,
            "runs_used": b.runs_used, "runs_left": b.runs_left, "hours_used": b.hours_used, "hours_left": b.hours_left,
            "cost_used": b.cost_used_usd, "cost_left": b.cost_left_usd, "reasons": b.reasons,
            "mde": b.mde, "keep_threshold": b.keep_threshold, "autonomy": approvals.mode(eng.ws),
            "executor": ex["executor"], "workers": ex["workers"], "in_flight": ex["in_flight"],
            "mechanism": f"{trial[0]['name']} v{trial[0]['version']} (on trial)" if trial else _kept_mechanism(led),
        }
        points = [{"n": p.number, "id": p.id, "description": p.description, "status": p.status,
                   "verdict": p.verdict, "val_bpb": p.val_bpb, "samples": p.samples, "commit": p.commit,
                   "reason": p.reason, "paired_gain": p.paired_gain} for p in data.points]
        appr = [{"id": a["id"], "kind": a["kind"], "status": a["status"], "experiment_id": a["experiment_id"],
                 "description": a["description"], "branch": a["branch"], "commit": a["commit_sha"],
                 "val_bpb": a["payload"].get("val_bpb"), "delta_vs_best": a["payload"].get("delta_vs_best"),
                 "created_at": a["created_at"], "expires_at": a["expires_at"], "decided_by": a["decided_by"]}
                for a in waiting]
        return {**base, "tag": c["tag"], "branch": c["branch"], "state": _state(b, waiting, running),
                "overview": overview, "points": points, "approvals": appr, "at": time.time()}


def _kept_mechanism(led: Ledger) -> Optional[str]:
    active = led.mechanisms(statuses=("active", "kept"))
    return f"{active[-1]['name']} v{active[-1]['version']}" if active else None


def experiment_detail(src: Source, experiment_id: int) -> Optional[dict]:
    """One experiment: its runs (seeds, paired references), verdict and reason, diff, log tail, replay."""
    with src.engine() as eng:
        led = eng.ledger
        e = led.experiment(experiment_id)
        if e is None:
            return None
        if e["confirm_of"] is not None:      # a seed run: show the experiment it belongs to
            return experiment_detail(src, e["confirm_of"])
        runs = []
        for r in [e] + led.confirm_runs(e["id"]):
            ref = led.experiment(r["paired_with"]) if r.get("paired_with") else None
            runs.append({"id": r["id"], "seed": r["seed"], "status": r["status"], "val_bpb": r["val_bpb"],
                         "role": r.get("role"), "num_steps": r["num_steps"],
                         "reference_id": ref["id"] if ref else None,
                         "reference_val_bpb": ref["val_bpb"] if ref else None,
                         "d": (r["val_bpb"] - ref["val_bpb"]) if ref and r["val_bpb"] is not None
                         and ref["val_bpb"] is not None else None})
        diff = ""
        if e["commit_sha"] and e["parent_commit"] and e["commit_sha"] != e["parent_commit"]:
            try:
                diff = gitops.diff_text(eng.ws.root, e["parent_commit"], e["commit_sha"],
                                        list(eng.ws.cfg.paths.editable))[:DIFF_CHARS]
            except Exception as err:  # noqa: BLE001 - a gc'd or foreign commit: say so on the page
                diff = f"(no diff: {type(err).__name__}: {err})"
        rep = replay.latest(led, e["campaign_id"])
        keep = next((k for k in rep.keeps if k.experiment_id == e["id"]), None) if rep else None
        return {"id": e["id"], "description": e["description"], "hypothesis": e["hypothesis"],
                "status": e["status"], "verdict": e["verdict"], "verdict_reason": e["verdict_reason"],
                "reason": e["reason"], "commit": e["commit_sha"], "parent": e["parent_commit"],
                "is_baseline": bool(e["is_baseline"]), "runs": runs, "diff": diff,
                "log_tail": (e["log_tail"] or "")[-LOG_TAIL_CHARS:],
                "replay": None if keep is None else {"replay": rep.replay if rep else None, "outcome": keep.outcome,
                                                     "gain": keep.gain, "pairs": [p.model_dump() for p in keep.pairs]}}
