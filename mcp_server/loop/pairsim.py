"""Simulated comparisons under the campaign's own sigma model: how often the verdict rule keeps a change
of a given true effect, and how many pairs it spends (tests/loop/test_sequential.py, bench/perf/pairs.py).

A simulated comparison follows the sync engine's order (Engine._run_seed_set, then score and confirms):
the seed set's pairs one at a time while `verdict.enough_pairs` says the call is open, then
`verdict.decide`; each retest adds one more pair until it keeps or discards. The sigma_d it is judged
with is what the campaign would have pooled (`verdict.pooled_sigma`, with the prior) from `history`
earlier null comparisons of one seed set each, so the error rates include that estimate's own noise.
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from mcp_server.loop import verdict
from mcp_server.loop.config import NoiseConfig


@dataclass(frozen=True)
class SimResult:
    keep_rate: float
    mean_pairs: float
    mean_runs: float    # training runs of the candidate and the extra references (a confirm pair costs two)
    mean_mde: float     # the MDE the campaigns reported (verdict.achieved_mde at their sigma_d)


def one(noise: NoiseConfig, sigma_d: float, effect: float, rng: random.Random) -> tuple[str, int]:
    """(verdict, pairs) of one comparison at a known sigma_d; effect is the true mean gain (bits/byte)."""
    return _compare(noise, sigma_d, sigma_d, effect, rng)


def _compare(noise: NoiseConfig, sigma_true: float, sigma_hat: float, effect: float,
             rng: random.Random) -> tuple[str, int]:
    def pair() -> float:   # d = candidate - reference: a gain is a negative d
        return -effect + rng.gauss(0.0, sigma_true)

    seeds = noise.baseline_seeds
    diffs = [pair()]
    while len(diffs) < seeds and not verdict.enough_pairs(diffs, sigma_hat, noise, seeds):
        diffs.append(pair())
    confirms = 0
    while True:
        v = verdict.decide(diffs, sigma_hat, noise, n_planned=seeds, n_confirms=confirms)
        if v.kind != "retest":
            return v.kind, len(diffs)
        diffs.append(pair())
        confirms += 1


def simulate(noise: NoiseConfig, sigma_true: float, effect_mdes: float, comparisons: int, seed: int = 0,
             history: int = 6) -> SimResult:
    """Keep rate and cost for a true gain of `effect_mdes` times the MDE each campaign reports.

    Each comparison draws its campaign's sigma_d from `history` null comparisons (one seed set each,
    normal pairs of SD sigma_true) pooled with the prior, then a comparison whose true gain is
    effect_mdes * achieved_mde(that sigma_d)."""
    rng = random.Random(seed)
    keeps, pairs, runs, mdes = 0, 0, 0, []
    for _ in range(comparisons):
        groups = [[rng.gauss(0.0, sigma_true) for _ in range(noise.baseline_seeds)] for _ in range(history)]
        sig, _ = verdict.pooled_sigma(groups, noise)
        m = verdict.achieved_mde(sig, noise)
        kind, n = _compare(noise, sigma_true, sig, effect_mdes * m, rng)
        keeps += kind == "keep"
        pairs += n
        runs += min(n, noise.baseline_seeds) + 2 * max(0, n - noise.baseline_seeds)
        mdes.append(m)
    return SimResult(keeps / comparisons, pairs / comparisons, runs / comparisons, statistics.fmean(mdes))


def simulate_noisy_null(noise: NoiseConfig, sigma_gentle: float, sigma_move: float, comparisons: int,
                        seed: int = 0, history: int = 6) -> SimResult:
    """Keep rate of null changes noisier than the campaign's others (heteroscedastic pairs): the campaign's
    sigma_d is pooled with the prior from `history` gentle null comparisons of SD sigma_gentle (as the
    screens' gentle moves), and each candidate is a null change whose own paired SD is sigma_move (an
    LR- or batch-sized move: 0.05-0.12 on bench/gpt v2, BENCHMARKS.md "A noise prior per benchmark")."""
    rng = random.Random(seed)
    keeps, pairs, mdes = 0, 0, []
    for _ in range(comparisons):
        groups = [[rng.gauss(0.0, sigma_gentle) for _ in range(noise.baseline_seeds)] for _ in range(history)]
        sig, _ = verdict.pooled_sigma(groups, noise)
        kind, n = _compare(noise, sigma_move, sig, 0.0, rng)
        keeps += kind == "keep"
        pairs += n
        mdes.append(verdict.achieved_mde(sig, noise))
    return SimResult(keeps / comparisons, pairs / comparisons, pairs / comparisons, statistics.fmean(mdes))
