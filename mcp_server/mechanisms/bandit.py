"""A UCB1 bandit over categories of change (optimizer, architecture, batch, ...).

Each experiment pulled one arm: the category of what it changed. Its reward,
read from the ledger, is 1 for a keep and, short of a keep, a share of 0.5 that
grows with the measured gain in units of the noise (a near miss still says the
direction is alive); crashes and losses earn 0. UCB1 then prefers the category
with the best mean reward plus an exploration bonus, trying every arm once
first (with half the textbook exploration bonus: campaigns are short).
Deterministic: ties go to the fixed category order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mcp_server.mechanisms.base import Advice, History, Trial
from mcp_server.mechanisms.source import CATEGORIES, tunable_constants


def reward(t: Trial, sigma: float) -> float:
    if t.verdict == "keep":
        return 1.0
    if t.failed or t.gain is None or t.gain <= 0:
        return 0.0
    if t.verdict == "retest":
        return 0.5
    return 0.5 * min(1.0, t.gain / max(2 * sigma, 1e-12))


@dataclass(frozen=True)
class ArmStat:
    category: str
    pulls: int
    kept: int
    mean_reward: float
    ucb: float


class Bandit:
    name = "bandit"
    priority = 1

    def __init__(self, c: float = 0.5):
        # Half of UCB1's textbook exploration: a campaign is tens of experiments, not thousands, and
        # with c = 1 the bonus of a once-tried arm outweighs a category that keeps paying for ~20 pulls.
        self.c = c

    def stats(self, history: History, source: str) -> list[ArmStat]:
        consts = tunable_constants(source)
        arms = [c for c in CATEGORIES if any(k.category == c for k in consts)]
        if any(t.category == "code" for t in history.trials):
            arms.append("code")
        pulls = {a: 0 for a in arms}
        total = {a: 0.0 for a in arms}
        kept = {a: 0 for a in arms}
        for t in history.trials:
            if t.category in pulls:
                pulls[t.category] += 1
                total[t.category] += reward(t, history.sigma)
                kept[t.category] += t.verdict == "keep"
        n = sum(pulls.values())
        out = []
        for a in arms:
            mean = total[a] / pulls[a] if pulls[a] else 0.0
            ucb = math.inf if not pulls[a] else mean + self.c * math.sqrt(2 * math.log(max(n, 1)) / pulls[a])
            out.append(ArmStat(a, pulls[a], kept[a], round(mean, 4), ucb))
        return out

    def advise(self, history: History, source: str) -> Advice:
        stats = self.stats(history, source)
        details = {"arms": [s.__dict__ for s in stats]}
        if not stats:
            return Advice(self.name, details=details, reason="no tunable constants in train.py")
        best = max(stats, key=lambda s: s.ucb)   # max keeps the first of equals: category order
        consts = tunable_constants(source)
        tries = {k.name: 0 for k in consts}
        for t in history.trials:
            for name in t.changed:
                if name in tries:
                    tries[name] += 1
        params = tuple(sorted((k.name for k in consts if k.category == best.category), key=lambda n: tries[n]))
        if best.pulls == 0:
            why = f"{best.category} has not been tried yet"
        else:
            why = (f"{best.category}: mean reward {best.mean_reward:.2f} over {best.pulls} experiments "
                   f"({best.kept} kept), the highest upper confidence bound")
        return Advice(self.name, best.category, params, self.priority, reason=why, details=details)
