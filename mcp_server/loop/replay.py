"""`loopwright replay`: does each kept change still beat its parent on seeds it has never seen?

For every kept experiment (oldest first), the parent commit and the kept commit are trained on N
fresh seeds (seeds no run of the campaign has used), interleaved parent, child, parent, child, ...
so machine load drifts over both alike. Each pair gives d = child - parent on one seed.

A keep *holds* when the paired gain (-d) is positive on every fresh seed; it *holds on most* when
the mean gain is positive and more than half the seeds agree; otherwise it does not hold. The
interval is mean gain ± t(0.975, N-1) * SD(d) / sqrt(N) from the replay's own pairs.

Replay runs are an audit, not experiments: they go to the ledger's `replays` table (marked with
the replay number and side), they are not counted in the campaign's run/hour budget, and they
never change the best version or any verdict.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Optional

from pydantic import BaseModel, Field

from mcp_server.common import procs
from mcp_server.loop import integrity, runner

# two-sided 95 % Student t quantiles for small dof (N - 1)
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


class ReplayPair(BaseModel):
    seed: int
    parent: Optional[float]
    child: Optional[float]
    d: Optional[float] = Field(None, description="child - parent (negative = the keep still helps)")


class ReplayKeep(BaseModel):
    experiment_id: int
    description: str
    parent_commit: str
    commit: str
    pairs: list[ReplayPair]
    gain: Optional[float] = Field(None, description="mean paired gain over the fresh seeds (positive = better)")
    interval: Optional[tuple[float, float]] = None
    wins: int = 0
    outcome: str = Field(description="holds | holds on most | does not hold | failed")


class ReplayResult(BaseModel):
    replay: int
    seeds_per_keep: int
    keeps: list[ReplayKeep]
    all_hold: bool
    runs: int
    seconds: float


def summarise(keep: dict, pairs: list[ReplayPair]) -> ReplayKeep:
    ds = [p.d for p in pairs if p.d is not None]
    k = ReplayKeep(experiment_id=keep["id"], description=keep["description"],
                   parent_commit=(keep["parent_commit"] or "")[:10], commit=(keep["commit_sha"] or "")[:10],
                   pairs=pairs, outcome="failed")
    if not ds or len(ds) < len(pairs):
        return k
    k.gain = round(-statistics.fmean(ds), 6)
    k.wins = sum(d < 0 for d in ds)
    if len(ds) >= 2:
        half = _T975.get(len(ds) - 1, 1.96) * statistics.stdev(ds) / math.sqrt(len(ds))
        k.interval = (round(k.gain - half, 6), round(k.gain + half, 6))
    if k.wins == len(ds):
        k.outcome = "holds"
    elif k.gain > 0 and k.wins * 2 > len(ds):
        k.outcome = "holds on most"
    else:
        k.outcome = "does not hold"
    return k


def replay(eng, seeds: int = 3, keeps_only: bool = True, on_run: Optional[Callable[[str], None]] = None,
           on_progress: Optional[runner.ProgressFn] = None) -> ReplayResult:
    """Re-run every kept change against its parent on `seeds` fresh seeds (see the module docstring)."""
    from mcp_server.loop.engine import LoopError

    if seeds < 1:
        raise LoopError("--seeds must be at least 1 (3 is a good default)")
    t0 = time.monotonic()
    say = on_run or (lambda s: None)
    with eng.exclusive():
        c = eng.campaign
        keeps = eng.ledger.kept_candidates(c["id"])
        if not keeps:
            raise LoopError("nothing to replay: this campaign has no kept experiment yet")
        eng.check_integrity(c, "before the replay")
        number = eng.ledger.next_replay_number(c["id"])
        out, runs = [], 0
        for keep in keeps:
            fresh = eng.fresh_seeds(c, seeds)
            pairs = []
            for s in fresh:
                vals: dict[str, Optional[float]] = {}
                for side, commit in (("parent", keep["parent_commit"]), ("child", keep["commit_sha"])):
                    say(f"replay {number}: #{keep['id']} {side} on seed {s}")
                    vals[side] = _run(eng, c, number, keep, side, commit, s, on_progress)
                    runs += 1
                parent, child = vals["parent"], vals["child"]
                d = None if parent is None or child is None else round(child - parent, 6)
                pairs.append(ReplayPair(seed=s, parent=parent, child=child, d=d))
            k = summarise(keep, pairs)
            say(f"replay {number}: #{keep['id']} {keep['description']}: {k.outcome} "
                f"(gain {k.gain if k.gain is not None else float('nan'):+.4f}, {k.wins}/{len(pairs)} seeds)")
            out.append(k)
    return ReplayResult(replay=number, seeds_per_keep=seeds, keeps=out, runs=runs,
                        all_hold=all(k.outcome == "holds" for k in out), seconds=round(time.monotonic() - t0, 1))


def _run(eng, c: dict, number: int, keep: dict, side: str, commit: str, seed: int, on_progress) -> Optional[float]:
    started = time.time()
    run_dir = eng.ws.runs_dir / f"replay-{number:03d}-{keep['id']:05d}-{side}-{seed}"
    status, val, steps, reason = "crash", None, None, None
    with eng.tree_at(commit):
        try:
            tr = runner.run_training(eng.ws, run_dir, seed, on_progress, sources=eng.run_tree(commit))
            steps = tr.summary.get("num_steps")
            status, reason = tr.status, tr.reason
            if tr.status != "ok" and procs.stopping():   # killed by the loop itself on its way out
                status, reason = "interrupted", f"the replay was stopped during this run ({tr.reason})"
            mism = integrity.check(eng.ws, c["pinned_commit"])
            if mism:   # a replayed version touched frozen files: restore them and do not trust the run
                integrity.restore(eng.ws, c["pinned_commit"], mism)
                status, reason = "rejected", f"changed frozen files: {integrity.describe(mism)}"
            elif tr.status == "ok":
                assert tr.model_path is not None   # an ok training run always leaves its model
                ev = runner.run_evaluation(eng.ws, c["pinned_commit"], run_dir, tr.model_path)
                if ev.ok:
                    val = ev.val_bpb
                else:
                    status, reason = "rejected", f"the evaluator rejected the model: {ev.reason}"
        except KeyboardInterrupt:   # Ctrl-C, SIGTERM/SIGHUP in the CLI
            status, reason = "interrupted", "the replay was stopped during this run"
            raise
        finally:
            eng.ledger.add_replay_run(c["id"], number, keep["id"], side, commit, seed, status, val,
                                      None if steps is None else int(steps), reason, started)
    return val


def latest(ledger, campaign_id: int) -> Optional[ReplayResult]:
    """The latest replay recorded in the ledger, summarised (None when none was run)."""
    rows = ledger.replay_runs(campaign_id)
    if not rows:
        return None
    by_keep: dict[int, dict[int, dict]] = {}
    for r in rows:
        by_keep.setdefault(r["experiment_id"], {}).setdefault(r["seed"], {})[r["side"]] = r["val_bpb"]
    keeps = []
    for eid, seeds in by_keep.items():
        exp = ledger.experiment(eid)
        pairs = [ReplayPair(seed=s, parent=v.get("parent"), child=v.get("child"),
                            d=None if v.get("parent") is None or v.get("child") is None
                            else round(v["child"] - v["parent"], 6)) for s, v in seeds.items()]
        keeps.append(summarise(exp, pairs))
    n = max(len(k.pairs) for k in keeps)
    return ReplayResult(replay=rows[0]["replay"], seeds_per_keep=n, keeps=keeps, runs=len(rows),
                        all_hold=all(k.outcome == "holds" for k in keeps),
                        seconds=round(max(r["finished_at"] or r["started_at"] for r in rows)
                                      - min(r["started_at"] for r in rows), 1))
