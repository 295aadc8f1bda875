"""Adaptive pairs: a truncated sequential probability ratio test (SPRT) over paired differences.

`[noise] pairs = "adaptive"` replaces "run the whole seed set, then decide" with "after each pair, decide
if the evidence is already clear; else add a pair", up to `max_pairs`. Clear wins and losses stop after
one or two pairs; close calls get more.

The test, in units of the campaign's sigma_d (x_i = gain_i / sigma_d, gain = reference - candidate, so
positive is better; S_n = x_1 + ... + x_n):

* H0: no effect (mean 0); H1: a gain of theta = (k_sigma + 0.84) / sqrt(baseline_seeds), the minimum
  detectable effect of the fixed design with one seed set (so adaptive pairs aim at the same effect size).
* log-likelihood ratio after n pairs: L_n = theta * S_n - n * theta**2 / 2.
* alpha = 1 - Phi(k_sigma) (the fixed design's false-keep rate on one look; 2.3 % at k = 2), beta = 0.2.
  Keep when L_n >= log((1 - beta) / alpha) (and the mean gain is at least `min_delta`); discard when
  L_n <= log(beta / (1 - alpha)); never before `min_pairs` pairs.
* Truncation: at `max_pairs` pairs the test must decide: keep iff L_N >= log((1 - beta) / alpha) / 2
  (halfway to the keep boundary, which keeps the false-keep rate below 5 %).

Error rates. At a known sigma_d (exact, by `operating`) with the defaults (k_sigma 2, min_pairs 1,
max_pairs 6): a null change is kept 1.2 % of the time (0.9 % with baseline_seeds 2, as the demo), and the
MDE (`achieved_mde`: 1.46 sigma_d at baseline_seeds 3, 1.65 at 2; the fixed design's is 1.64 and 2.01)
82 % of the time. Simulated with sigma_d estimated the campaign's way (pooled over earlier comparisons
with the prior; mcp_server/loop/pairsim.py, checked in tests/loop/test_sequential.py): null kept <= 5 %
(about 1 %), one reported MDE kept >= 80 % (84-87 %). Expected pairs: about 2.1 for a null change, 3.4
at one MDE, 1.1 for a gain of 3 MDEs or a loss of one MDE (baseline_seeds 3); the fixed design spends
the whole seed set on each, plus confirms near the bar (BENCHMARKS.md "Adaptive pairs"). The rates are
per comparison: a campaign of many null changes keeps some, which replay (`loopwright replay`) checks.

With `spread_alpha` set (a low prior), a keep also needs the candidate's own pairs to clear a t test, at
ADAPTIVE_SPREAD_SHARE of spread_alpha after each pair from the second on; crossing the keep bound without it
means one more pair. The MDE is then found by simulation (`simulated_operating`): 1.87 sigma_d at
baseline_seeds 2. Null moves of any own SD are kept <= 5 % (3-4 % simulated at bench/gpt's prior,
tests/loop/test_noise_prior.py).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, Sequence

import numpy as np

from mcp_server.loop.config import NoiseConfig

BETA = 0.2          # 1 - power at the design effect
Z_POWER = 0.8416    # one-sided normal quantile for 80 % power
# achieved_mde is the gain kept with this probability when sigma_d is known: a margin over 80 % for sigma_d
# being an estimate (pooled with the prior), so that the MDE a campaign reports is kept >= 80 % of the time
MDE_POWER = 0.82
# The MDE is stated at 82 % power for a known sigma_d, so that with sigma_d estimated from the campaign's
# pairs (pairsim.py) an effect of one MDE is still kept at least 80 % of the time.
MDE_MARGIN = 0.02
Step = Literal["keep", "discard", "more"]


@dataclass(frozen=True)
class Design:
    """The boundaries on S_n (sum of standardized gains) for n = 1..max_pairs; index n-1."""
    theta: float
    upper: tuple[float, ...]   # keep when S_n >= upper[n-1]
    lower: tuple[float, ...]   # discard when S_n <= lower[n-1]
    min_pairs: int

    @property
    def max_pairs(self) -> int:
        return len(self.upper)


@lru_cache(maxsize=64)
def _design(k_sigma: float, seeds: int, min_pairs: int, max_pairs: int) -> Design:
    alpha = max(1e-9, 0.5 * math.erfc(k_sigma / math.sqrt(2.0)))
    theta = (k_sigma + Z_POWER) / math.sqrt(seeds)
    log_a, log_b = math.log((1 - BETA) / alpha), math.log(BETA / (1 - alpha))
    upper, lower = [], []
    for n in range(1, max_pairs + 1):
        # L_n = theta*S_n - n*theta^2/2  =>  S_n = (L + n*theta^2/2) / theta
        drift = n * theta / 2
        if n < min_pairs:
            upper.append(math.inf)
            lower.append(-math.inf)
        elif n < max_pairs:
            upper.append(log_a / theta + drift)
            lower.append(log_b / theta + drift)
        else:
            cut = log_a / 2 / theta + drift
            upper.append(cut)
            lower.append(cut)
    return Design(theta, tuple(upper), tuple(lower), min_pairs)


def design(noise: NoiseConfig) -> Design:
    return _design(float(noise.k_sigma), int(noise.baseline_seeds), int(noise.min_pairs), int(noise.max_pairs))


def step(diffs: Sequence[float], sigma_d: float, noise: NoiseConfig) -> tuple[Step, str]:
    """After len(diffs) pairs (d_i = candidate_i - reference_i): keep, discard, or one more pair."""
    if not diffs:
        raise ValueError("a sequential verdict needs at least one (candidate, reference) pair")
    d = design(noise)
    n = min(len(diffs), d.max_pairs)   # pairs beyond max_pairs (a config lowered mid-campaign): decide now
    gains = [-float(x) for x in diffs]
    s = sum(gains) / max(sigma_d, 1e-12)
    mean = statistics.fmean(gains)
    up, lo = d.upper[n - 1], d.lower[n - 1]
    tag = (f"{len(diffs)} pair(s), sigma_d {sigma_d:.5f}; sequential bounds on the mean gain: keep >= "
           f"{up * sigma_d / n:.5f}, discard <= {lo * sigma_d / n:.5f}")
    last = n >= d.max_pairs or len(diffs) >= d.max_pairs
    if s >= up and mean >= noise.min_delta:
        own = spread_bound(diffs, noise)
        if spread_ok(diffs, noise):
            return "keep", f"paired gain {mean:.5f} crossed the keep bound ({tag})"
        spread = (f"paired gain {mean:.5f} crossed the keep bound but not its own pairs' spread bound {own:.5f}"
                  if len(diffs) >= 2 else f"paired gain {mean:.5f} crossed the keep bound on one pair, which has no "
                  "spread of its own to test")
        if not last:
            return "more", f"{spread}: one more pair ({tag})"
        return "discard", f"{spread} after the maximum {d.max_pairs} pairs ({tag})"
    if s <= lo or last:
        why = (f"paired gain {mean:.5f} crossed the discard bound" if s <= lo and not last else
               f"paired gain {mean:.5f} is below the keep bound after the maximum {d.max_pairs} pairs")
        return "discard", f"{why} ({tag})"
    return "more", f"paired gain {mean:.5f} is between the bounds: too close to call ({tag})"


# -- the candidate's own spread (a keep, where spread_alpha is set) ---------------------------------------------

def t_sf(t: float, dof: int) -> float:
    """P(T > t) for Student's t with an integer number of degrees of freedom (closed form, A&S 26.7.3-4)."""
    if dof < 1:
        raise ValueError("Student's t needs at least one degree of freedom")
    theta = math.atan2(t, math.sqrt(dof))
    c, sn = math.cos(theta), math.sin(theta)
    if dof % 2:   # odd: A = (2/pi) (theta + sin cos (1 + 2/3 cos^2 + ...))
        term, total = c, 0.0 if dof == 1 else c
        for k in range(1, (dof - 1) // 2):
            term *= c * c * (2 * k) / (2 * k + 1)
            total += term
        a = 2 / math.pi * (theta + sn * total) if dof > 1 else 2 / math.pi * theta
    else:         # even: A = sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        term, total = 1.0, 1.0
        for k in range(1, dof // 2):
            term *= c * c * (2 * k - 1) / (2 * k)
            total += term
        a = sn * total
    return (1 - a) / 2   # A = P(|T| < t)


@lru_cache(maxsize=256)
def t_quantile(p: float, dof: int) -> float:
    """The t with P(T > t) = p (0 < p < 0.5), by bisection on t_sf."""
    lo, hi = 0.0, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_sf(mid, dof) > p:
            lo = mid
        else:
            hi = mid
    return hi


# The adaptive test looks at the candidate's own spread after every pair from the second on (up to max_pairs - 1
# looks, where fixed pairs look once per seed set and retest); each look at this share of spread_alpha keeps a
# null change of any own SD at <= 5 % overall (3.4-3.5 % simulated at spread_alpha 0.015; 4.7-4.9 % at the full
# level: BENCHMARKS.md "Adaptive pairs with the own-spread test").
ADAPTIVE_SPREAD_SHARE = 2 / 3


def spread_level(noise: NoiseConfig) -> float:
    """The one-sided level of the own-spread t test at each look (0 = off)."""
    alpha = float(noise.spread_alpha)
    return alpha * ADAPTIVE_SPREAD_SHARE if noise.pairs == "adaptive" else alpha


def spread_ok(diffs: Sequence[float], noise: NoiseConfig) -> bool:
    """Whether the candidate's own pairs allow a keep: always when the test is off; under adaptive pairs never on
    one pair (fixed pairs keep a one-seed set on the pooled sigma_d alone, as before the test existed)."""
    if spread_level(noise) <= 0:
        return True
    if len(diffs) < 2:
        return noise.pairs != "adaptive"
    return -statistics.fmean(float(x) for x in diffs) >= spread_bound(diffs, noise)


def spread_bound(diffs: Sequence[float], noise: NoiseConfig) -> float:
    """The mean gain a keep needs by the candidate's own pairs alone: a one-sided t test at `spread_alpha`
    on their own spread, t(1 - alpha, n-1) * s / sqrt(n); 0 when off or with one pair (no spread to test: a
    campaign of one-seed sets is judged on the pooled sigma_d alone, as before).

    The pooled sigma_d is right for changes as noisy as the campaign's others; a change that moves the whole
    trajectory (an LR or batch-sized move) can have a paired SD several times larger (BENCHMARKS.md "A noise
    prior per benchmark"), and judged by the pooled sigma_d alone such a null change was kept about 37 % of the
    time. This test holds its false-keep rate whatever that change's own SD is."""
    alpha = spread_level(noise)
    if alpha <= 0:
        return 0.0
    n = len(diffs)
    if n < 2:
        return 0.0
    return t_quantile(alpha, n - 1) * statistics.stdev(float(x) for x in diffs) / math.sqrt(n)


def keep_bound(sigma_d: float, noise: NoiseConfig, n_pairs: int) -> float:
    """The mean paired gain that keeps after n pairs (the bar, as `verdict.bar` is for fixed pairs)."""
    d = design(noise)
    n = max(1, min(n_pairs, d.max_pairs), d.min_pairs)   # before min_pairs: the bound it will first face
    up = d.upper[n - 1]
    return max(noise.min_delta, up * sigma_d / n)


# -- operating characteristics: exact for normal pairs at a known sigma_d ----------------------------

_H = 0.02   # grid step in sigma units


def operating(noise: NoiseConfig, effect: float) -> tuple[float, float]:
    """(probability of a keep, expected number of pairs) for a true mean gain of `effect` sigma_d.

    Numerical integration of the density of S_n over the continuation region, pair by pair (the
    recursion of Armitage, McPherson and Rowe); min_delta is left out (it binds only when sigma_d is
    tiny)."""
    d = design(noise)
    finite = [b for b in d.upper + d.lower if not math.isinf(b)]
    spread = d.min_pairs * abs(effect) + 6 * math.sqrt(d.min_pairs)   # S_n before the first bound applies
    grid = np.arange(min(finite + [-spread]) - 10.0, max(finite + [spread]) + 10.0 + _H, _H)
    dens = np.exp(-0.5 * (grid - effect) ** 2) / math.sqrt(2 * math.pi)   # density of S_1
    p_keep, e_n, alive = 0.0, 0.0, 1.0
    kern_x = np.arange(-8.0, 8.0 + _H, _H)
    kern = np.exp(-0.5 * (kern_x - effect) ** 2) / math.sqrt(2 * math.pi) * _H
    for n in range(1, d.max_pairs + 1):
        if n > 1:
            dens = np.convolve(dens, kern, mode="same")
        e_n += alive   # every comparison still open runs pair n
        up, lo = d.upper[n - 1], d.lower[n - 1]
        keep_mass = float(dens[grid >= up].sum() * _H) if not math.isinf(up) else 0.0
        stop_mass = float(dens[grid <= lo].sum() * _H) if not math.isinf(lo) else 0.0
        if n == d.max_pairs:
            keep_mass = float(dens[grid >= up].sum() * _H)
            stop_mass = max(0.0, alive - keep_mass)
        p_keep += keep_mass
        alive = max(0.0, alive - keep_mass - stop_mass)
        dens = np.where((grid < up) & (grid > lo), dens, 0.0)
    return p_keep, e_n


def simulated_operating(noise: NoiseConfig, effect: float, comparisons: int = 20000,
                        seed: int = 0) -> tuple[float, float]:
    """(probability of a keep, expected pairs) for a true mean gain of `effect` sigma_d, by simulation at a
    known sigma_d, with the own-spread test (which `operating`'s recursion on S_n alone cannot follow: it
    needs each comparison's own spread). Vectorised `step` (tests/loop/test_sequential.py checks the two
    agree); a fixed seed makes it deterministic, so the MDE search below is monotone in the effect."""
    d = design(noise)
    gains = effect + np.random.default_rng(seed).standard_normal((comparisons, d.max_pairs))
    open_ = np.ones(comparisons, dtype=bool)
    kept = np.zeros(comparisons, dtype=bool)
    pairs = np.zeros(comparisons)
    level = spread_level(noise)
    for n in range(1, d.max_pairs + 1):
        g = gains[:, :n]
        s, mean = g.sum(axis=1), g.mean(axis=1)
        if level <= 0:
            own_ok = np.ones(comparisons, dtype=bool)
        elif n < 2:
            own_ok = np.zeros(comparisons, dtype=bool)
        else:
            own_ok = mean >= t_quantile(level, n - 1) * g.std(axis=1, ddof=1) / math.sqrt(n)
        keep = open_ & (s >= d.upper[n - 1]) & own_ok
        stop = open_ & ~keep & ((s <= d.lower[n - 1]) | (n == d.max_pairs))
        kept |= keep
        pairs[keep | stop] = n
        open_ &= ~(keep | stop)
    return float(kept.mean()), float(pairs.mean())


def achieved_mde(sigma_d: float, noise: NoiseConfig) -> float:
    """The true gain kept with at least 80 % probability under adaptive pairs (bits/byte), at least min_delta:
    MDE_POWER at a known sigma_d, which leaves room for the estimate's own noise. With the own-spread test
    the search runs on `simulated_operating` (the test costs power: the MDE is 7-20 % larger)."""
    return max(noise.min_delta, _mde_sigmas(float(noise.k_sigma), int(noise.baseline_seeds),
                                            int(noise.min_pairs), int(noise.max_pairs),
                                            float(noise.spread_alpha)) * sigma_d)


@lru_cache(maxsize=64)
def _mde_sigmas(k_sigma: float, seeds: int, min_pairs: int, max_pairs: int, spread_alpha: float = 0.0) -> float:
    noise = NoiseConfig(k_sigma=k_sigma, baseline_seeds=seeds, min_pairs=min_pairs, max_pairs=max_pairs,
                        pairs="adaptive", spread_alpha=spread_alpha)
    keep_rate = ((lambda e: simulated_operating(noise, e)[0]) if spread_alpha > 0 else
                 (lambda e: operating(noise, e)[0]))
    lo, hi = 0.0, 10.0
    for _ in range(20 if spread_alpha > 0 else 30):   # P(keep) rises with the effect
        mid = (lo + hi) / 2
        if keep_rate(mid) >= MDE_POWER:
            hi = mid
        else:
            lo = mid
    return hi
