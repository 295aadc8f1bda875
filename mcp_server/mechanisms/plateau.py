"""Plateau detection: after K experiments without a keep, go somewhere else.

A loop stuck on one knob keeps polishing it long after it stopped paying. Once
the last `k` experiments produced no keep, this mechanism names a category of
change that none of them touched (the orthogonal direction) and, inside it, the
constants touched least recently. Its opinion outranks the bandit's.
"""
from __future__ import annotations

from typing import Any

from mcp_server.mechanisms.base import Advice, History
from mcp_server.mechanisms.source import CATEGORIES, tunable_constants


class Plateau:
    name = "plateau"
    priority = 2

    def __init__(self, k: int = 4):
        if k < 1:
            raise ValueError("plateau k must be >= 1")
        self.k = k

    def advise(self, history: History, source: str) -> Advice:
        since = history.experiments_since_keep
        details: dict[str, Any] = {"experiments_since_keep": since, "k": self.k, "plateau": since >= self.k}
        if since < self.k:
            return Advice(self.name, details=details)
        consts = tunable_constants(source)
        available = [c for c in CATEGORIES if any(k.category == c for k in consts)]
        if not available:
            return Advice(self.name, details=details, reason="plateau, but train.py has no tunable constants")
        # when each category was last touched (index into the trials; -1 = never)
        last_cat = {c: -1 for c in available}
        last_param = {k.name: -1 for k in consts}
        for i, t in enumerate(history.trials):
            for name in t.changed:
                if name in last_param:
                    last_param[name] = i
            if t.category in last_cat:
                last_cat[t.category] = i
        recent = {t.category for t in history.trials[-self.k:]}
        fresh = [c for c in available if c not in recent]
        pool = fresh or available
        # the least recently touched category; ties go to the one with more untouched constants
        cat = min(pool, key=lambda c: (last_cat[c], -sum(1 for k in consts if k.category == c
                                                           and last_param[k.name] < 0), available.index(c)))
        params = tuple(sorted((k.name for k in consts if k.category == cat), key=lambda n: (last_param[n],)))
        why = (f"{since} experiments without a keep (plateau after {self.k}); recent ones touched "
               f"{', '.join(sorted(recent)) or 'nothing'}: try {cat} instead")
        details.update(recent_categories=sorted(recent))
        return Advice(self.name, cat, params, self.priority, reason=why, details=details)
