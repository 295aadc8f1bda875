"""A run's outcome and a candidate's verdict: the steps both loops share.

The synchronous loop (Engine.run_experiment / score) and the asynchronous one (loop/asyncrun.py
record / _decide) differ in how runs are scheduled, never in how a finished run is written down or how
a candidate is judged: both call these functions, so confirms, keeps, approvals (autonomy
approve-keeps holds a keep for a person), plateau and budget-spent events behave the same on every
executor.

    write_run        a finished run's row (status, metrics, val/test) and, unsandboxed, the event saying so
    record_crash     the crash event of a failed run, and one crash_streak alert per streak
    judge            the verdict of a candidate whose runs are all in (paired differences, confirms)
    keep             a keep verdict: held for a person (approve-keeps) or recorded (the best moves)
    after_verdict    what follows any verdict: the plateau and budget-spent events
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
from typing import Any, ContextManager, Mapping, Optional, Protocol

from mcp_server.ledger.store import Ledger
from mcp_server.loop import approvals, verdict
from mcp_server.loop.models import BudgetResult, Change, PairInfo
from mcp_server.loop.workspace import Workspace, sinks_for

PLATEAU_EVERY = 10


class LoopEngine(Protocol):
    """What the shared steps (and loop/asyncrun.py) need of loop/engine.py's Engine: typed by this protocol,
    so neither imports engine.py and engine.py imports them without a cycle."""
    ws: Workspace
    ledger: Ledger

    @property
    def campaign(self) -> dict: ...
    def best(self, c: Optional[dict] = None) -> tuple[Optional[float], int]: ...
    def sigma(self, c: dict) -> float: ...
    def sigma_paired(self, c: dict) -> tuple[float, int]: ...
    def seed_set(self, c: dict, rotate: bool = False) -> tuple[int, list[int]]: ...
    def fresh_seeds(self, c: dict, k: int) -> list[int]: ...
    def reference_runs(self, c: dict) -> dict[int, dict]: ...
    def exclusive(self) -> ContextManager[None]: ...
    def budget(self, c: Optional[dict] = None) -> BudgetResult: ...
    def check_integrity(self, c: dict, when: str) -> None: ...
    def refuse_non_change(self, c: dict, bound: Optional[approvals.Approved] = None) -> str: ...
    def check_change(self, c: dict, change: Change, commit: Optional[str] = None) -> None: ...
    def editable_source(self) -> str: ...
    def committed_source(self, commit: str, verified: bool = False) -> str: ...
    def text_sha(self, text: str) -> str: ...


# -- recording a run's outcome --------------------------------------------------------------------------

def write_run(eng: LoopEngine, row_id: int, *, status: str, reason: Optional[str], is_baseline: bool,
              summary: Mapping[str, Any], extra_metrics: Mapping[str, Any], val_bpb: Optional[float],
              test_bpb: Optional[float], eval_seconds: Optional[float], total_seconds: float, log_tail: str,
              started_at: Optional[float] = None) -> None:
    """A finished run into its row. val_bpb/test_bpb are kept only for an ok run; a baseline run that is
    ok gets its 'baseline' verdict here (it is never scored)."""
    ok = status == "ok"
    mb = summary.get("peak_vram_mb") or summary.get("peak_memory_mb")
    fields: dict[str, Any] = dict(
        status=status, reason=reason or None, finished_at=time.time(),
        metrics_json=json.dumps({**{k: v for k, v in summary.items() if isinstance(v, (int, float))}, **extra_metrics}),
        val_bpb=val_bpb if ok else None, test_bpb=test_bpb if ok else None, eval_seconds=eval_seconds,
        training_seconds=summary.get("training_seconds"), total_seconds=total_seconds,
        memory_gb=None if mb is None else round(mb / 1024.0, 3),
        num_steps=None if summary.get("num_steps") is None else int(summary["num_steps"]),
        num_params_m=summary.get("num_params_M"), log_tail=log_tail[-4000:],
        verdict="baseline" if is_baseline and ok else None)
    if started_at is not None:
        fields["started_at"] = started_at
    eng.ledger.update_experiment(row_id, **fields)


def note_unsandboxed(eng: LoopEngine, c: dict, row_id: int) -> None:
    """Only with the human's --unsafe-no-sandbox: on the record, every time."""
    eng.ledger.add_event(c["id"], "unsafe_no_sandbox", {"experiment_id": row_id, "detail": (
        "train.py and the evaluator ran without an OS sandbox (--unsafe-no-sandbox); this result is not "
        "protected against forgery")})


def record_crash(eng: LoopEngine, c: dict, row: dict, description: Optional[str] = None) -> None:
    """A failed run (crash, timeout, rejected, lost for good): the crash event, and one crash_streak alert
    per streak, when it reaches the threshold, with the streak's real length."""
    sinks = sinks_for(eng.ws.cfg)
    eng.ledger.add_event(c["id"], "crash", {"experiment_id": row["id"], "status": row["status"],
                                            "reason": row["reason"],
                                            "description": description or row["description"]}, sinks)
    n = eng.ws.cfg.slack.crash_streak if eng.ws.cfg.slack else 3
    streak, first = 0, row["id"]
    for r in eng.ledger.recent_non_baseline(c["id"], limit=200):
        if r["status"] not in ("crash", "timeout", "rejected"):
            break
        streak, first = streak + 1, r["id"]
    if streak >= n and eng.ledger.kv_get(f"crash_streak_alerted:{c['id']}") != str(first):
        eng.ledger.kv_set(f"crash_streak_alerted:{c['id']}", str(first))   # the streak's first crash
        eng.ledger.add_event(c["id"], "crash_streak", {"count": streak, "threshold": n,
                                                       "last_reason": row["reason"]}, sinks)


# -- deciding a verdict ---------------------------------------------------------------------------------

def pairs(eng: LoopEngine, exp_id: int) -> list[PairInfo]:
    """The candidate's paired differences: each ok run of it (and of its pairs and confirms) against the
    ok run of the best it was paired with."""
    out = []
    for r in [eng.ledger.recorded_experiment(exp_id)] + eng.ledger.confirm_runs(exp_id):
        if r["status"] != "ok" or r["val_bpb"] is None or r["paired_with"] is None:
            continue
        ref = eng.ledger.experiment(r["paired_with"])
        if ref and ref["status"] == "ok" and ref["val_bpb"] is not None:
            out.append(PairInfo(seed=r["seed"], candidate=r["val_bpb"], reference=ref["val_bpb"],
                                d=round(r["val_bpb"] - ref["val_bpb"], 6), reference_run=ref["id"]))
    return out


def confirms(rows: list[dict]) -> int:
    """Confirm pairs a candidate has had (its confirm_runs): a lost run is not one (its re-queued run is);
    rows from before roles count when ok."""
    return sum((r["role"] == "confirm" and r["status"] != "lost") or (r["role"] is None and r["status"] == "ok")
               for r in rows)


@dataclasses.dataclass(frozen=True)
class Judgement:
    """A verdict and what it was computed from."""
    verdict: verdict.Verdict
    diffs: list[float]
    pairs: list[PairInfo]
    samples: list[float]        # the candidate's ok val_bpb values
    best_mean: float            # the best version's mean at decision time
    sigma: float                # SD of a paired difference (pooled)


def judge(eng: LoopEngine, c: dict, exp: dict) -> Judgement:
    """The verdict of candidate `exp` against the best now (the caller checked that all its runs are in and
    that there is a best)."""
    runs = eng.ledger.confirm_runs(exp["id"])
    samples = [r["val_bpb"] for r in [exp] + runs if r["status"] == "ok" and r["val_bpb"] is not None]
    best_mean, _ = eng.best(c)
    assert best_mean is not None
    ps = pairs(eng, exp["id"])
    sig, _ = eng.sigma_paired(c)
    noise = eng.ws.cfg.noise
    # an experiment recorded before paired verdicts has no pairs: compare with the best's mean
    diffs = [p.d for p in ps] or [s - best_mean for s in samples]
    v = verdict.decide(diffs, sig, noise, n_planned=noise.baseline_seeds, n_confirms=confirms(runs))
    return Judgement(v, diffs, ps, samples, best_mean, sig)


def keep(eng: LoopEngine, c: dict, exp: dict, j: Judgement, approved_by_person: Optional[approvals.Approved] = None,
         reset_tree: bool = True) -> Optional[tuple[verdict.Verdict, str]]:
    """A keep verdict. Under autonomy approve-keeps/-runs (and not a person's own re-measure) it is held for
    a person: (the pending_approval verdict, the agent's next step) come back and the best does not move.
    Otherwise the keep is recorded (the best moves to `exp`; the caller moves the branch) and None comes
    back. reset_tree=False: the working tree is the agent's (asynchronous path) and a held keep leaves it."""
    held = approvals.Approvals(eng).hold_keep(c, exp, j.verdict, j.samples, j.best_mean, j.sigma,
                                              approved_by_person, reset_tree=reset_tree)
    if held is not None:
        return held
    record_keep(eng, c, exp, j.verdict, j.samples, j.best_mean, j.sigma)
    return None


def record_keep(eng: LoopEngine, c: dict, exp: dict, v: verdict.Verdict, samples: list[float], previous: float,
                sig: float) -> None:
    """A keep: the best moves to the experiment (the branch is moved by the caller), the keep event."""
    eng.ledger.set_best(c["id"], exp["commit_sha"], exp["id"])
    base = eng.ledger.baseline_samples(c["id"])
    test = [r["test_bpb"] for r in [exp] + eng.ledger.confirm_runs(exp["id"]) if r["test_bpb"]]
    t = eng.ws.cfg.target
    metric = {} if t is None else {"metric": t.metric, "sign": t.sign()}   # a target's metric, and its direction
    eng.ledger.add_event(c["id"], "keep", {
        "experiment_id": exp["id"], "commit": exp["commit_sha"], "description": exp["description"],
        "val_bpb": statistics.fmean(samples), "previous_best": previous,
        "baseline": statistics.fmean(base) if base else None,
        "delta_vs_best": statistics.fmean(samples) - previous,
        "delta_vs_baseline": statistics.fmean(samples) - statistics.fmean(base) if base else None,
        "sigma": sig, "threshold": v.threshold, "tag": c["tag"], "paired_gain": v.gain,
        "plot_path": str(eng.ws.reports_dir / "progress.png"),
        "test_bpb": statistics.fmean(test) if test else None,
        "test_divergence": _test_divergence(eng, c, samples, test), **metric}, sinks_for(eng.ws.cfg))


def _test_divergence(eng: LoopEngine, c: dict, samples: list[float], test: list[float]) -> bool:
    """Flag a keep whose hidden-test gain is much smaller than its validation gain."""
    base_rows = eng.ledger.baseline_runs_with_test(c["id"])
    if not test or not base_rows:
        return False
    val_gain = statistics.fmean(r["val_bpb"] for r in base_rows) - statistics.fmean(samples)
    test_gain = statistics.fmean(r["test_bpb"] for r in base_rows) - statistics.fmean(test)
    return val_gain > 0 and test_gain < 0.5 * val_gain - 2 * eng.sigma(c)


def after_verdict(eng: LoopEngine, c: dict) -> None:
    """After any verdict: the plateau event every PLATEAU_EVERY experiments without a keep, and the
    budget-spent (campaign end) events the first time the budget is spent."""
    maybe_plateau(eng, c)
    record_if_budget_spent(eng, c)


def maybe_plateau(eng: LoopEngine, c: dict) -> None:
    since = eng.ledger.count_since_best(c["id"])
    if since and since % PLATEAU_EVERY == 0:
        eng.ledger.add_event(c["id"], "plateau", {"experiments_since_keep": since}, sinks_for(eng.ws.cfg))


def record_if_budget_spent(eng: LoopEngine, c: dict) -> None:
    """After a write (a run recorded, a verdict given): the first time the budget is spent, record the
    budget_spent event, once. Engine.budget() itself only reads."""
    b = eng.budget(c)
    if b.should_stop and not eng.ledger.kv_get(f"budget_spent_notified:{c['id']}"):
        eng.ledger.kv_set(f"budget_spent_notified:{c['id']}", "1")
        base = eng.ledger.baseline_samples(c["id"])
        end = {"reasons": b.reasons, "tag": c["tag"], "best": eng.best(c)[0],
               "baseline": statistics.fmean(base) if base else None, **eng.ledger.campaign_counts(c["id"])}
        eng.ledger.add_event(c["id"], "budget_spent", end, sinks_for(eng.ws.cfg))
        # the budget is what ends a campaign: announce its end (Jira closes the issue on it)
        eng.ledger.add_event(c["id"], "campaign_end", end, sinks_for(eng.ws.cfg))
