"""The one interface every search mechanism implements, and the history it reads.

A mechanism is a pure function of the campaign's history (ledger rows plus the
train.py source of each experiment) and the train.py about to be run:

    advise(history, source) -> Advice

so it can be tested on synthetic ledgers and replayed on real ones. Mechanisms
never touch the ledger, git or the file system; `history_from_rows` builds the
history from plain rows and a source lookup.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Protocol

from mcp_server.mechanisms.source import CATEGORIES, category_of, changed_constants, skeleton

FAILED = ("crash", "timeout", "rejected")


@dataclass(frozen=True)
class Trial:
    """One candidate experiment (baselines and confirm runs are folded in, not listed)."""
    id: int
    description: str
    status: str                    # ok | crash | timeout | rejected
    verdict: Optional[str]         # keep | discard | retest | None (not scored yet)
    val_bpb: Optional[float]       # mean over the run and its confirm runs
    gain: Optional[float]          # best-so-far before it minus val_bpb (positive = better)
    source: str                    # train.py at its commit
    changed: tuple[str, ...]       # tunable constants that differ from its parent
    code_changed: bool             # anything else changed (beyond constants, comments, layout)
    category: str

    @property
    def failed(self) -> bool:
        return self.status in FAILED


@dataclass(frozen=True)
class History:
    trials: tuple[Trial, ...]
    baseline_mean: Optional[float] = None
    sigma: float = 0.0
    best_source: str = ""

    @property
    def experiments_since_keep(self) -> int:
        n = 0
        for t in reversed(self.trials):
            if t.verdict == "keep":
                break
            n += 1
        return n


def trial_category(changed: Iterable[str], code_changed: bool) -> str:
    """The category of a change: the most common category of its constants; 'code' for code edits."""
    cats = [category_of(n) for n in changed]
    if not cats:
        return "code" if code_changed else "none"
    return max(sorted(set(cats), key=CATEGORIES.index), key=cats.count)


def history_from_rows(rows: list[dict], source_at: Callable[[str], str], sigma_floor: float = 0.0,
                      best_commit: Optional[str] = None) -> History:
    """Build the history from ledger experiment rows (dicts as `Ledger.experiments` returns them).

    `source_at(commit)` returns the editable file at a commit. Rows still running or interrupted
    are left out: they say nothing about the change.
    """
    rows = sorted(rows, key=lambda r: r["id"])
    base = [r["val_bpb"] for r in rows if r["is_baseline"] and r["status"] == "ok" and r["val_bpb"] is not None]
    confirms: dict[int, list[float]] = {}
    for r in rows:
        if r["confirm_of"] is not None and r["status"] == "ok" and r["val_bpb"] is not None:
            confirms.setdefault(r["confirm_of"], []).append(r["val_bpb"])
    best = statistics.fmean(base) if base else None
    sigma = max(sigma_floor, statistics.stdev(base)) if len(base) > 1 else sigma_floor
    trials = []
    for r in rows:
        if r["is_baseline"] or r["confirm_of"] is not None or r["status"] in ("running", "interrupted"):
            continue
        src = source_at(r["commit_sha"]) if r["commit_sha"] else ""
        parent = source_at(r["parent_commit"]) if r["parent_commit"] else ""
        changed = tuple(changed_constants(parent, src))
        code_changed = skeleton(parent) != skeleton(src)
        samples = ([r["val_bpb"]] if r["val_bpb"] is not None else []) + confirms.get(r["id"], [])
        val = statistics.fmean(samples) if samples and r["status"] == "ok" else None
        gain = None if val is None or best is None else best - val
        trials.append(Trial(r["id"], r["description"], r["status"], r["verdict"], val, gain, src, changed,
                            code_changed, trial_category(changed, code_changed)))
        if r["verdict"] == "keep" and val is not None:
            best = val
    best_src = source_at(best_commit) if best_commit else ""
    return History(tuple(trials), statistics.fmean(base) if base else None, sigma, best_src)


@dataclass(frozen=True)
class Advice:
    mechanism: str
    category: Optional[str] = None       # a category of change to explore next (None: no opinion)
    parameters: tuple[str, ...] = ()     # constants of that category, most promising first
    priority: int = 0                    # when mechanisms disagree, the higher priority decides
    warnings: tuple[str, ...] = ()
    reason: str = ""
    details: dict = field(default_factory=dict)


class Mechanism(Protocol):
    name: str

    def advise(self, history: History, source: str) -> Advice: ...


def combine(advices: list[Advice]) -> Advice:
    """One piece of advice: the category of the highest-priority opinion, every warning."""
    opinions = [a for a in advices if a.category is not None]
    lead = max(opinions, key=lambda a: a.priority) if opinions else Advice("none")
    warnings = tuple(w for a in advices for w in a.warnings)
    return Advice(lead.mechanism, lead.category, lead.parameters, lead.priority, warnings, lead.reason,
                  {a.mechanism: a.details for a in advices})
