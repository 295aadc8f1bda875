"""Trials: an activated mechanism steers the next `window` candidate experiments; then its effect
is measured and it is kept or reverted automatically. Also the built-in outer loop (no LLM): a
UCB1 bandit that allocates trials among the installed mechanisms.

The measure is the campaign's own objective, gain per hour (improvement of the best val_bpb per
hour of experiments, confirm runs included), with keeps per experiment as the tie-break; the
reference is the campaign's record just before activation: the last REFERENCE_MIN..2*window
candidate experiments (a local reference: early experiments gain most, so the whole record
would penalise any late mechanism). Intervals are honest about small windows: a Newcombe (Wilson)
95 % interval for the difference in keep rates and a bootstrap 90 % interval for the difference
in gain per hour; a decision whose interval includes 0 says that the evidence is weak. The rule
itself is the point estimate (keep iff gain per hour is higher, or equal with more keeps), since
with windows of a few experiments an interval test would revert everything.
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Optional

from mcp_server.mechanisms import registry

REFERENCE_MIN = 6
BOOTSTRAP = 2000
OUTER_KEY = "outer_builtin"      # kv flag: the built-in outer loop runs on each suggest_next
OUTER_WINDOW_KEY = "outer_builtin_window"
OUTER_WINDOW = 4
UCB_C = 0.5


@dataclass(frozen=True)
class Obs:
    """One candidate experiment, as the trial measures it."""
    id: int
    kept: bool
    gain: float        # improvement of the best val_bpb it brought (0 unless kept)
    hours: float       # its own run plus its confirm runs
    failed: bool = False


@dataclass
class Decision:
    outcome: str                 # kept | reverted
    reason: str
    stats: dict = field(default_factory=dict)


def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def newcombe(k1: int, n1: int, k0: int, n0: int) -> tuple[float, float]:
    """95 % interval of p1 - p0 (Newcombe's hybrid score method, from Wilson intervals)."""
    p1, p0 = (k1 / n1 if n1 else 0.0), (k0 / n0 if n0 else 0.0)
    l1, u1 = _wilson(k1, n1)
    l0, u0 = _wilson(k0, n0)
    d = p1 - p0
    return d - math.sqrt((p1 - l1) ** 2 + (u0 - p0) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p0 - l0) ** 2)


def _rate(obs: list[Obs]) -> float:
    hours = sum(o.hours for o in obs)
    return sum(o.gain for o in obs) / hours if hours > 0 else 0.0


def bootstrap_diff(during: list[Obs], before: list[Obs], seed: int = 0) -> tuple[float, float]:
    """90 % percentile interval of gain/hour(during) - gain/hour(before), resampling experiments."""
    if not during or not before:
        return -math.inf, math.inf
    rng = random.Random(seed)
    diffs = sorted(_rate(rng.choices(during, k=len(during))) - _rate(rng.choices(before, k=len(before)))
                   for _ in range(BOOTSTRAP))
    return diffs[int(0.05 * BOOTSTRAP)], diffs[int(0.95 * BOOTSTRAP) - 1]


def evaluate(before: list[Obs], during: list[Obs]) -> Decision:
    """Kept or reverted, from the window's experiments and the record before activation."""
    n1, n0 = len(during), len(before)
    k1, k0 = sum(o.kept for o in during), sum(o.kept for o in before)
    g1, g0 = _rate(during), _rate(before)
    r1, r0 = (k1 / n1 if n1 else 0.0), (k0 / n0 if n0 else 0.0)
    lo, hi = newcombe(k1, n1, k0, n0)
    glo, ghi = bootstrap_diff(during, before)
    stats = {"experiments": n1, "kept": k1, "failed": sum(o.failed for o in during), "keep_rate": round(r1, 4),
             "gain_per_hour": g1, "reference_experiments": n0, "reference_kept": k0, "reference_keep_rate": round(r0, 4),
             "reference_gain_per_hour": g0, "keep_rate_diff_ci95": [round(lo, 4), round(hi, 4)],
             "gain_per_hour_diff_ci90": [glo, ghi]}
    helpful = g1 > g0 or (g1 == g0 and r1 > r0)
    weak = lo <= 0 <= hi and glo <= 0 <= ghi
    what = (f"gain/hour {g1:.4g} vs {g0:.4g} before; keeps {k1}/{n1} vs {k0}/{n0} "
            f"(difference {r1 - r0:+.2f}, 95% CI {lo:+.2f}..{hi:+.2f})")
    if helpful:
        return Decision("kept", f"helped: {what}" + ("; weak evidence (intervals include 0)" if weak else ""), stats)
    return Decision("reverted", f"did not help: {what}" + ("; weak evidence (intervals include 0)" if weak else ""),
                    stats)


def observations(history, rows: list[dict]) -> list[Obs]:
    """Obs for every finished candidate of the history, timed from the ledger rows."""
    hours: dict[int, float] = {}
    for r in rows:
        if r.get("finished_at") is None:
            continue
        key = r["confirm_of"] if r["confirm_of"] is not None else r["id"]
        hours[key] = hours.get(key, 0.0) + max(0.0, r["finished_at"] - r["started_at"]) / 3600.0
    out = []
    for t in history.trials:
        if t.verdict is None and not t.failed:
            continue   # not scored yet (or awaiting a confirm run): not decided
        kept = t.verdict == "keep"
        out.append(Obs(t.id, kept, max(0.0, t.gain or 0.0) if kept else 0.0, hours.get(t.id, 0.0), t.failed))
    return out


def tick(engine, history=None) -> Optional[Decision]:
    """Decide the running trial if its window is full. Safe to call often (cheap when nothing is due)."""
    c = engine.campaign
    running = engine.ledger.trials(c["id"], running=True)
    if not running:
        return None
    t = running[0]
    from mcp_server.mechanisms.history import history_from_engine
    history = history or history_from_engine(engine)
    obs = observations(history, engine.ledger.experiments(c["id"]))
    during = [o for o in obs if o.id > t["start_experiment_id"]][: t["window"]]
    if len(during) < t["window"]:
        return None
    before = [o for o in obs if o.id <= t["start_experiment_id"]][-max(REFERENCE_MIN, 2 * t["window"]):]
    d = evaluate(before, during)
    d.stats["trial_id"] = t["id"]
    if engine.ledger.end_trial(t["id"], d.outcome, d.reason, d.stats, during[-1].id):
        kind = "mechanism_kept" if d.outcome == "kept" else "mechanism_reverted"
        engine.ledger.add_event(c["id"], kind, {"name": t["name"], "version": t["version"], "reason": d.reason,
                                                "outcome": d.outcome, "kept": d.stats["kept"],
                                                "experiments": d.stats["experiments"]}, _sinks(engine))
    return d


def _sinks(engine) -> list[str]:
    from mcp_server.loop.workspace import sinks_for
    return sinks_for(engine.ws.cfg)


# --------------------------------------------------------------------------- the built-in outer loop

def outer_enabled(ledger) -> bool:
    return ledger.kv_get(OUTER_KEY) == "on"


def set_outer(ledger, on: bool, window: Optional[int] = None) -> None:
    ledger.kv_set(OUTER_KEY, "on" if on else "off")
    if window is not None:
        ledger.kv_set(OUTER_WINDOW_KEY, str(int(window)))


def install_library(engine, history=None) -> list[str]:
    """Propose each shipped mechanism once (validated in the sandbox like any other)."""
    done = []
    for name, code in registry.library_code().items():
        row = engine.ledger.mechanism(name=name)
        if row is None or row["code_sha256"] != registry.code_sha(code):
            registry.propose(engine, name, code, "shipped with loopwright", "builtin-outer", kind="library",
                             history=history)
            done.append(name)
    return done


def choose(ledger, window: int) -> Optional[str]:
    """UCB1 over mechanisms not in use: reward = keeps per experiment in its past trials; untried first."""
    trials = ledger.trials()
    cands = [r for r in ledger.mechanisms(("validated", "reverted"))
             if not any(t["mechanism_id"] == r["id"] and t["outcome"] == "failed" for t in trials)]
    latest: dict[str, dict] = {}
    for r in cands:
        if r["name"] not in latest or r["version"] > latest[r["name"]]["version"]:
            latest[r["name"]] = r
    if not latest:
        return None
    pulls = {n: [t for t in trials if t["name"] == n and t["outcome"] != "running"] for n in latest}
    total = sum(len(v) for v in pulls.values())

    def ucb(name: str) -> float:
        ts = pulls[name]
        if not ts:
            return math.inf
        mean = statistics.fmean((t["stats"] or {}).get("keep_rate", 0.0) for t in ts)
        return mean + UCB_C * math.sqrt(2 * math.log(max(total, 1)) / len(ts))

    return max(sorted(latest), key=ucb)


def outer_step(engine, window: Optional[int] = None, history=None) -> Optional[str]:
    """One step of the built-in outer loop: decide a full trial, then start the next one."""
    if window is None:
        saved = engine.ledger.kv_get(OUTER_WINDOW_KEY)
        window = int(saved) if saved and saved.isdigit() else OUTER_WINDOW
    tick(engine, history)
    c = engine.campaign
    if engine.ledger.trials(c["id"], running=True):
        return None
    install_library(engine, history)
    name = choose(engine.ledger, window)
    if name is None:
        return None
    registry.activate(engine, name, window=window, author="builtin-outer")
    return name
