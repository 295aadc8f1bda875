"""Tabu list: no experiment twice, and a warning before one that is almost a repeat.

The engine already refuses an exact repeat of a tried train.py. This mechanism
also catches *near* repeats, which cost a full run and teach nothing:
- the same code with every constant within `rel_tol` of a tried version
  (e.g. LR 0.0041 after LR 0.004 was discarded), or
- a version that differs from a tried one only in comments or layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from mcp_server.mechanisms.base import Advice, History, Trial
from mcp_server.mechanisms.source import constant_values, relative_gap, skeleton


@dataclass(frozen=True)
class Match:
    kind: str                # "exact" | "near"
    trial: Trial
    detail: str


def _outcome(t: Trial) -> str:
    if t.failed:
        return t.status
    val = "" if t.val_bpb is None else f", val_bpb {t.val_bpb:.4f}"
    return f"{t.verdict or 'not scored'}{val}"


def near(source: str, other: str, rel_tol: float) -> Optional[tuple[float, str]]:
    """(largest relative gap, what differs) if `source` is within rel_tol of `other`, else None."""
    if not other or skeleton(other) != skeleton(source):
        return None
    mine, theirs = constant_values(source), constant_values(other)
    gaps = {k: relative_gap(mine.get(k), theirs.get(k)) for k in set(mine) | set(theirs)}
    worst = max(gaps.values(), default=0.0)
    if worst > rel_tol:
        return None
    diffs = [f"{k} {mine.get(k)} vs {theirs.get(k)} ({gaps[k]:.0%} apart)" for k in sorted(gaps) if gaps[k] > 0]
    return worst, "; ".join(diffs) if diffs else "differs only in comments or layout"


def closest_match(history: History, source: str, rel_tol: float = 0.1) -> Optional[Match]:
    """The tried version this source repeats (exactly or nearly), closest first; None if it is new."""
    for t in reversed(history.trials):
        if t.source == source:
            return Match("exact", t, "identical train.py")
    best: Optional[tuple[float, Trial, str]] = None
    for t in history.trials:
        hit = near(source, t.source, rel_tol)
        if hit and (best is None or hit[0] < best[0]):
            best = (hit[0], t, hit[1])
    return None if best is None else Match("near", best[1], best[2])


class Tabu:
    name = "tabu"

    def __init__(self, rel_tol: float = 0.1):
        self.rel_tol = rel_tol

    def advise(self, history: History, source: str) -> Advice:
        if history.best_source and source == history.best_source:
            return Advice(self.name, details={"status": "unchanged"},
                          warnings=("train.py is identical to the best version: edit it before run_experiment",))
        m = closest_match(history, source, self.rel_tol)
        if m is None:
            hit = near(source, history.best_source, self.rel_tol)
            if hit and source != history.best_source:
                return Advice(self.name, details={"status": "near_repeat", "of_experiment": None, "detail": hit[1]},
                              warnings=(f"near repeat of the best version: {hit[1]}. A change that small is "
                                        "unlikely to clear the noise threshold; take a bigger step.",))
            return Advice(self.name, details={"status": "new"})
        t = m.trial
        if m.kind == "exact":
            msg = (f"exact repeat of experiment #{t.id} ({t.description!r}: {_outcome(t)}); "
                   "run_experiment will refuse it. Change something else.")
        else:
            msg = (f"near repeat of experiment #{t.id} ({t.description!r}: {_outcome(t)}): {m.detail}. "
                   f"A change within {self.rel_tol:.0%} of a tried one rarely teaches anything; "
                   "take a bigger step or change another parameter.")
        return Advice(self.name, warnings=(msg,),
                      details={"status": f"{m.kind}_repeat", "of_experiment": t.id, "detail": m.detail})
