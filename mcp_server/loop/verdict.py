"""Noise-aware keep / discard / retest.

A single lucky seed is not an improvement. The baseline is measured on several
seeds to estimate sigma; a candidate is kept only when its mean gain over the
best clears max(min_delta, k * sigma * sqrt(1/n_candidate + 1/n_best)) -- the
standard error of a difference of two means. Gains just under the bar get a
`retest`: a confirm run on a fresh seed, after which the bar tightens with n.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Literal, Sequence

from mcp_server.loop.config import NoiseConfig

VerdictKind = Literal["keep", "discard", "retest"]


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    gain: float          # best_mean - candidate_mean (positive = better, metric is lower-is-better)
    threshold: float     # gain needed for a keep with these sample counts
    reason: str


def estimate_sigma(samples: Sequence[float], floor: float) -> float:
    """Run-to-run SD of the metric; never below `floor` (two equal samples do not mean zero noise)."""
    if len(samples) < 2:
        return floor
    return max(floor, statistics.stdev(samples))


def threshold(sigma: float, noise: NoiseConfig, n_candidate: int, n_best: int) -> float:
    se = sigma * math.sqrt(1.0 / max(1, n_candidate) + 1.0 / max(1, n_best))
    return max(noise.min_delta, noise.k_sigma * se)


def decide(samples: Sequence[float], best_mean: float, n_best: int, sigma: float,
           noise: NoiseConfig) -> Verdict:
    """Verdict for a candidate measured `len(samples)` times (first run + confirm runs)."""
    if not samples:
        raise ValueError("a verdict needs at least one measurement")
    mean = statistics.fmean(samples)
    gain = best_mean - mean
    bar = threshold(sigma, noise, len(samples), n_best)
    n_confirms = len(samples) - 1
    if gain >= bar:
        return Verdict("keep", gain, bar, f"gain {gain:.5f} >= threshold {bar:.5f} (sigma {sigma:.5f}, "
                                          f"{len(samples)} run(s))")
    if gain >= (1.0 - noise.retest_band) * bar and n_confirms < noise.max_confirms:
        return Verdict("retest", gain, bar, f"gain {gain:.5f} is near the threshold {bar:.5f}; "
                                            f"confirm on a fresh seed with run_experiment(confirm_of=ID)")
    if gain > 0:
        why = f"gain {gain:.5f} is below the noise threshold {bar:.5f} (sigma {sigma:.5f})"
    else:
        why = f"no gain: {mean:.5f} vs best {best_mean:.5f}"
    return Verdict("discard", gain, bar, why)


# Lines that only choose a random seed; a change confined to them can never be kept.
_SEED_LINE = re.compile(r"(seed|SEED|manual_seed|random\.seed|np\.random\.seed|default_rng|Generator\(\))")


def _strip(src: str) -> list[str]:
    out = []
    for line in src.splitlines():
        code = line.split("#", 1)[0].rstrip()
        if code.strip() and not _SEED_LINE.search(code):
            out.append(code)
    return out


def seed_only_change(old_src: str, new_src: str) -> bool:
    """True when two train.py versions differ only in seed-related lines (or comments/blank lines)."""
    return old_src != new_src and _strip(old_src) == _strip(new_src)
