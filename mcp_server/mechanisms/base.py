"""The one interface every search mechanism implements, and the history it reads.

A mechanism is a pure function of the campaign's history (ledger rows plus the
train.py source of each experiment) and the train.py about to be run:

    advise(history, source) -> Advice

so it can be tested on synthetic ledgers and replayed on real ones. Mechanisms
never touch the ledger, git or the file system; `history_from_rows` builds the
history from plain rows and a source lookup.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Protocol

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


# --------------------------------------------------------------------------- the runtime interface
# A mechanism written at run time (by an outer session, or shipped in mechanisms/library/) is a
# Python module with one function, run in a sandbox process that has nothing but plain data:
#
#     def advise(history: dict, source: str) -> dict
#
# history: the campaign as `history_to_dict` writes it (trials oldest first, each with the
#   tunable constants of its train.py in "values"; the baseline, the noise sigma, the categories,
#   the current train.py's constants); source: the train.py about to be edited or run.
# returns (every key optional; {} = no opinion):
#   {"category": one of CATEGORIES or "code"   -- where to look next,
#    "parameters": [constant names, best first],
#    "avoid": [constant names to leave alone],
#    "force": bool      -- the category outranks plateau and bandit (forced exploration),
#    "note": str        -- why, shown to the inner agent}
# The built-in mechanisms answer the same question over the typed History; `advice_from_dict`
# turns a runtime answer into the same Advice they return, so `combine` treats all alike.

# What a mechanism may return, bounded (its answer reaches the inner agent's prompt: it is no channel
# for bulk data)
MAX_NAMES, MAX_NAME_CHARS, MAX_NOTE_CHARS, MAX_ADVICE_BYTES = 64, 64, 500, 4096
ADVICE_KEYS: dict[str, Any] = {"category": (str, type(None)), "parameters": list, "avoid": list, "force": bool, "note": str}
# bandit = 1, plateau = 2: a runtime opinion beats the bandit, loses a tie with plateau (listed first);
# a forced one beats both
RUNTIME_PRIORITY, RUNTIME_FORCED_PRIORITY = 2, 3


def history_to_dict(history: History, source: str) -> dict:
    """The history as plain JSON data for a runtime mechanism (train.py sources left out: each
    trial carries its constants; the current source is passed separately)."""
    from mcp_server.mechanisms.source import constant_values, tunable_constants

    try:
        consts = [{"name": k.name, "value": k.value, "category": k.category} for k in tunable_constants(source)]
    except SyntaxError:
        consts = []
    return {
        "trials": [{"id": t.id, "description": t.description, "status": t.status, "verdict": t.verdict,
                    "val_bpb": t.val_bpb, "gain": t.gain, "changed": list(t.changed), "code_changed": t.code_changed,
                    "category": t.category, "values": constant_values(t.source)} for t in history.trials],
        "baseline": history.baseline_mean, "sigma": history.sigma,
        "experiments_since_keep": history.experiments_since_keep,
        "categories": list(CATEGORIES) + ["code"], "constants": consts,
        "best_values": constant_values(history.best_source),
    }


def check_advice(out: object, known_constants: Optional[Iterable[str]] = None) -> dict:
    """A runtime mechanism's answer, checked; raises ValueError saying what is wrong."""
    if out is None:
        return {}
    if not isinstance(out, dict):
        raise ValueError(f"advise() must return a dict, not {type(out).__name__}")
    unknown = set(out) - set(ADVICE_KEYS)
    if unknown:
        raise ValueError(f"advise() returned unknown keys {sorted(unknown)}; allowed: {sorted(ADVICE_KEYS)}")
    for key, typ in ADVICE_KEYS.items():
        if key in out and not isinstance(out[key], typ):
            raise ValueError(f"advise()[{key!r}] must be {getattr(typ, '__name__', typ)}, "
                             f"not {type(out[key]).__name__}")
    cat = out.get("category")
    if cat is not None and cat not in CATEGORIES + ("code",):
        raise ValueError(f"advise()['category'] = {cat!r} is not a category; use one of "
                         f"{', '.join(CATEGORIES + ('code',))} or None")
    for key in ("parameters", "avoid"):
        vals = out.get(key, [])
        if (not all(isinstance(v, str) and v.isidentifier() and len(v) <= MAX_NAME_CHARS for v in vals)
                or len(vals) > MAX_NAMES):
            raise ValueError(f"advise()[{key!r}] must be a list of at most {MAX_NAMES} constant names "
                             f"(identifiers of at most {MAX_NAME_CHARS} characters)")
    if len(out.get("note", "")) > MAX_NOTE_CHARS:
        raise ValueError(f"advise()['note'] is longer than {MAX_NOTE_CHARS} characters")
    if len(json.dumps(out)) > MAX_ADVICE_BYTES:
        raise ValueError(f"advise() returned more than {MAX_ADVICE_BYTES} bytes of JSON; an answer is a "
                         "category, a few constant names and a short note")
    return out


def advice_from_dict(name: str, out: dict) -> Advice:
    """A checked runtime answer as the Advice the built-in mechanisms return."""
    avoid = tuple(out.get("avoid", ()))
    params = tuple(p for p in out.get("parameters", ()) if p not in avoid)
    prio = RUNTIME_FORCED_PRIORITY if out.get("force") else RUNTIME_PRIORITY
    warnings = (f"{name}: leave {', '.join(avoid)} alone",) if avoid else ()
    details = {"category": out.get("category"), "parameters": list(params), "avoid": list(avoid),
               "force": bool(out.get("force")), "note": out.get("note", "")}
    return Advice(name, out.get("category"), params, prio, warnings, out.get("note", ""), details)
