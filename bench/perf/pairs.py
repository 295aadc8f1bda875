"""Fixed vs adaptive pairs at the demo's sigma_d: error rates, expected pairs and runs, and the MDE each
reports (mcp_server/loop/pairsim.py: sigma_d pooled with the prior from earlier comparisons, as a
campaign does). No training: the pairs are drawn from a normal model of SD --sigma-d.

    python bench/perf/pairs.py                       # demo's sigma_d 0.043, seed sets of 2 and 3, ~10 s
    python bench/perf/pairs.py --sigma-d 0.02 --comparisons 5000
    python bench/perf/pairs.py --tiny                # a smoke run (tests/bench/test_bench_smoke.py)
    python bench/perf/pairs.py --low-prior           # bench/gpt's noise.toml prior: noisy null moves, own-spread test
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcp_server.loop import pairsim, sequential  # noqa: E402
from mcp_server.loop.config import NoiseConfig  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sigma-d", type=float, default=0.043, help="true SD of a paired difference (bits/byte)")
    ap.add_argument("--comparisons", type=int, default=4000)
    ap.add_argument("--history", type=int, default=6, help="earlier comparisons sigma_d is pooled from")
    ap.add_argument("--max-pairs", type=int, default=6)
    ap.add_argument("--tiny", action="store_true", help="smoke run: 50 comparisons per row (not a measurement)")
    ap.add_argument("--low-prior", action="store_true", help="the low-prior table: bench/gpt's steps-clock prior "
                    "(0.0042 worth 8 pairs), gentle moves of SD 0.004, null moves of SD 0.05-0.12, with and without "
                    "the own-spread test (spread_alpha 0.015)")
    args = ap.parse_args()
    if args.tiny:
        args.comparisons = 50
    if args.low_prior:
        return low_prior(args)
    print(f"sigma_d {args.sigma_d}, {args.comparisons} comparisons per row, sigma_d pooled from {args.history} "
          "earlier null comparisons with the default prior (0.06, 3 pairs)")
    print(f"{'rule':<16}{'MDE':>8}  {'effect':>10}  {'kept':>6}  {'pairs':>6}  {'runs':>6}")
    for seeds in (2, 3):
        for rule in ("fixed", "adaptive"):
            noise = NoiseConfig(pairs=rule, baseline_seeds=seeds, max_pairs=args.max_pairs)
            for effect in (0.0, 0.5, 1.0, 3.0, -1.0):
                r = pairsim.simulate(noise, args.sigma_d, effect, args.comparisons, seed=int(effect * 10) + seeds,
                                     history=args.history)
                label = "null" if effect == 0 else f"{effect:+g} MDE"
                print(f"{rule + '-' + str(seeds):<16}{r.mean_mde:>8.4f}  {label:>10}  {r.keep_rate:>6.3f}  "
                      f"{r.mean_pairs:>6.2f}  {r.mean_runs:>6.2f}")
        exact = NoiseConfig(pairs="adaptive", baseline_seeds=seeds, max_pairs=args.max_pairs)
        m = sequential.achieved_mde(1.0, exact)
        p0, n0 = sequential.operating(exact, 0.0)
        p1, n1 = sequential.operating(exact, m)
        print(f"  exact, known sigma_d (adaptive-{seeds}): MDE {m:.3f} sigma_d; null kept {p0:.4f} in {n0:.2f} pairs, "
              f"one MDE kept {p1:.3f} in {n1:.2f} pairs")
    return 0


def low_prior(args: argparse.Namespace) -> int:
    """Null moves noisier than the campaign's others, judged on a low pooled sigma_d: how often each rule keeps
    them, and what it costs a real gain of one reported MDE (pairsim.simulate_noisy_null, pairsim.simulate)."""
    gentle, moves = 0.004, (0.05, 0.08, 0.12)
    print(f"prior 0.0042 worth 8 pairs, seed sets of 2, gentle null moves SD {gentle}, {args.comparisons} "
          f"comparisons per cell, sigma_d pooled from {args.history} gentle comparisons")
    print(f"{'rule':<26}{'MDE':>8}  " + "  ".join(f"{'null SD ' + str(m):>13}" for m in moves)
          + f"  {'gentle null':>11}  {'1 MDE kept':>10}  {'pairs':>6}")
    for rule in ("fixed", "adaptive"):
        for alpha in (0.0, 0.015):
            noise = NoiseConfig(pairs=rule, baseline_seeds=2, sigma_prior=0.0042, prior_pairs=8, spread_alpha=alpha,
                                max_pairs=args.max_pairs)
            nulls = [pairsim.simulate_noisy_null(noise, gentle, m, args.comparisons, seed=int(m * 1000),
                                                 history=args.history) for m in moves]
            g = pairsim.simulate(noise, gentle, 0.0, args.comparisons, seed=11, history=args.history)
            one = pairsim.simulate(noise, gentle, 1.0, args.comparisons, seed=12, history=args.history)
            label = f"{rule}-2" + (f" + spread {alpha:g}" if alpha else "")
            print(f"{label:<26}{one.mean_mde:>8.4f}  " + "  ".join(f"{r.keep_rate:>13.3f}" for r in nulls)
                  + f"  {g.keep_rate:>11.3f}  {one.keep_rate:>10.3f}  {one.mean_pairs:>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
