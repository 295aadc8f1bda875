"""Ablation: the built-in agent with and without the search mechanisms (tabu, plateau, bandit).

    python bench/perf/ablation_mechanisms.py                      # 8 repeats x 2 arms x 10 experiments
    python bench/perf/ablation_mechanisms.py --repeats 3 -n 4 --out results.json   # a smaller scale
    python bench/perf/ablation_mechanisms.py --tiny    # a smoke run: 1 repeat, 1 experiment, 2 steps, 1 seed

Verdicts are the loop's paired ones (mcp_server/loop/verdict.py): every candidate runs on the
reference's seed set and is kept on the paired differences, so an experiment costs
--baseline-seeds runs (fewer after an early stop). Statistics over campaign pairs: each repeat r
runs both arms with the same agent seed, so d_r = Δ(mechanisms) − Δ(plain) is a paired
difference; the summary gives mean ± SD of each arm, the mean paired difference with a 95 %
t-interval, the paired t statistic, and an exact sign-flip (permutation) p-value, which needs no
normality assumption. At least 8 pairs are needed before the p-value can go below 0.01.

Each campaign is a fresh workspace on the bundled benchmark (stdlib corpus), the
same budget for both arms, and the same agent seed for the two arms of a repeat
(so the arms differ only in whether suggest_next is consulted). Arms are
interleaved (off, on, off, on, ...) so that changes in machine load hit both.

The figure of merit is the Bilevel Autoresearch one: Δ = best − baseline val_bpb
at the end of the campaign (negative = improvement; 0 when nothing was kept),
reported as mean ± SD over repeats.

By default training is bounded by a step count (MAX_STEPS 80 at the bundled
batch of 12, written into the benchmark copy and not tunable by the agent: past
v2's 20-step warm-up, with its decay to the end) as well as by the time budget, so
that an outcome does not depend on how busy this shared machine is (the time
budget, 60 s, is then only a cap), and the copy trains on one torch thread
(two threads thrash when other jobs share the 2 cores). Pass --steps 0
--threads 0 for the benchmark as written: time-bounded, as in autoresearch.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from mcp_server.agents.builtin import Planner, run_builtin, set_constant  # noqa: E402
from mcp_server.loop.sequential import t_quantile  # noqa: E402
from mcp_server.loop.setup import init_workspace  # noqa: E402
from mcp_server.loop.workspace import bench_source_dir  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny  # noqa: E402

from mcp_server.loop.workspace import EVALUATOR_PY  # noqa: E402  (prepare.py and its frozen siblings)


def bench_copy(dest: Path, steps: int, batch: int | None, threads: int) -> Path:
    src = bench_source_dir()
    dest.mkdir(parents=True, exist_ok=True)
    for name in (*EVALUATOR_PY, "program.md", "train.py"):
        shutil.copyfile(src / name, dest / name)
    text = set_constant((dest / "train.py").read_text(), "MAX_STEPS", steps)
    if batch:
        text = set_constant(text, "BATCH_SIZE", batch)
    if threads:
        # One thread: on a busy 2-core machine two threads thrash (measured 2-7 s per step vs 0.85 s)
        text, n = re.subn(r"torch\.set_num_threads\([^\n]*\)\n", f"torch.set_num_threads({threads})\n", text, count=1)
        if n != 1:
            raise SystemExit("bundled train.py has no torch.set_num_threads(...) line to pin")
    (dest / "train.py").write_text(text)
    return dest


def campaign(tmp: Path, args, mechanisms: bool, repeat: int) -> dict:
    tag = f"{'mech' if mechanisms else 'plain'}{repeat}"
    root = tmp / tag
    overrides = {"benchmark": {"eval_tokens": args.eval_tokens, "grace_seconds": 45.0},
                 "noise": {"baseline_seeds": args.baseline_seeds},
                 # runs: baseline seeds, each candidate on the seed set, confirm pairs, seed-set re-measures
                 "budget": {"max_experiments": 3 * args.baseline_seeds + (args.baseline_seeds + 2) * args.n,
                            "max_hours": 10.0}}
    if args.tiny:   # the baseline run and one candidate run, no confirm pair: a smoke run stays two runs long
        overrides["budget"]["max_experiments"] = 2
    t0 = time.monotonic()
    init_workspace(root, tag=tag, corpus=args.corpus, time_budget=args.time_budget, overrides=overrides,
                   bench_dir=bench_copy(tmp / f"bench-{tag}", args.steps, args.batch, args.threads))

    skipped = [0]

    def log(kind, d):
        if kind == "skip":
            skipped[0] += 1
        elif kind == "experiment_end":
            a = d["attempt"]
            print(f"    [{tag}] {a.description:32s} {a.status:8s} {a.verdict or '':8s} "
                  f"{a.val_bpb if a.val_bpb is not None else float('nan'):.4f}  {a.seconds:.0f}s", flush=True)
        elif kind == "baseline":
            b = d["result"].get("baseline") or {}
            print(f"    [{tag}] baseline {b.get('mean', float('nan')):.4f} ± {b.get('sigma', 0):.4f}", flush=True)

    res = run_builtin(root, n=args.n, mechanisms=mechanisms, seed=repeat, observer=log, planner=planner(args, repeat))
    base, best = res.baseline, res.best
    out = {"arm": "mechanisms" if mechanisms else "plain", "repeat": repeat, "baseline": base, "best": best,
           "delta": None if base is None or best is None else best - base, "kept": res.kept,
           "crashed": sum(a.status != "ok" for a in res.attempts), "experiments": len(res.attempts),
           "skipped": skipped[0], "stopped": res.stopped_because, "seconds": round(time.monotonic() - t0, 1),
           "workspace": str(root)}
    print(f"  {tag}: Δ {out['delta'] if out['delta'] is not None else float('nan'):+.4f}, kept {out['kept']}, "
          f"crashed {out['crashed']}, skipped {out['skipped']}, {out['seconds']:.0f} s", flush=True)
    return out


Z80 = 0.8416   # the standard normal's 80th percentile: 80 % power


def paired_stats(diffs: list[float]) -> dict:
    """Mean, SD, 95 % t-interval, t statistic, exact two-sided sign-flip p-value of paired differences, and the
    minimum detectable difference (mde: 80 % power, two-sided 5 %) at their SD and number."""
    import itertools
    import math

    n = len(diffs)
    out = {"n": n, "mean": statistics.fmean(diffs) if diffs else None}
    if n < 2:
        return out
    sd = statistics.stdev(diffs)
    t975 = t_quantile(0.025, n - 1)
    half = t975 * sd / math.sqrt(n)
    out.update(sd=sd, ci=(out["mean"] - half, out["mean"] + half),
               # the power: the smallest true mean difference this many pairs of this spread detect 80 % of
               # the time in a two-sided 5 % test, (t_0.975 + z_0.8) * sd / sqrt(n)
               mde=(t975 + Z80) * sd / math.sqrt(n),
               # no spread: t is 0 for identical pairs, ±inf for a constant nonzero difference
               t=out["mean"] / (sd / math.sqrt(n)) if sd > 0 else 0.0 if out["mean"] == 0 else
               math.copysign(math.inf, out["mean"]))
    if n <= 16:   # exact: every assignment of signs to |d_r| under the null of no difference
        obs = abs(sum(diffs))
        hits = sum(abs(sum(s * abs(d) for s, d in zip(signs, diffs))) >= obs - 1e-12
                   for signs in itertools.product((1, -1), repeat=n))
        out["p_signflip"] = hits / 2 ** n
    return out


def paired_diffs(runs: list[dict], arm: str, ref: str) -> list[tuple[int, float]]:
    """(repeat, Δ(arm) − Δ(ref)) for every repeat in which both campaigns have a Δ, by repeat."""
    by = {(r["arm"], r["repeat"]): r["delta"] for r in runs if r["delta"] is not None}
    return [(k, by[(arm, k)] - by[(ref, k)]) for k in sorted({k for _, k in by})
            if (arm, k) in by and (ref, k) in by]


def fmt_paired(st: dict) -> str:
    """'mean [CI], t = .., sign-flip p = ..' of paired_stats(), as far as the number of pairs allows."""
    if not st["n"]:
        return "—"
    if st["n"] < 2:
        return f"{st['mean']:+.4f} (1 pair, no test)"
    p = f", p = {st['p_signflip']:.3f}" if "p_signflip" in st else ""
    same = " (every pair identical)" if st["sd"] == 0 and st["mean"] == 0 else ""
    return (f"{st['mean']:+.4f} [{st['ci'][0]:+.4f}, {st['ci'][1]:+.4f}], t = {st['t']:.2f}{p}{same}, "
            f"MDE {st['mde']:.4f}")


def summarise(runs: list[dict]) -> str:
    lines = ["| Method | Δ val_bpb (best − baseline) | kept / campaign | crashed / campaign | runs |",
             "|---|---|---|---|---|"]
    for arm, label in (("plain", "Built-in agent, hill climb only"),
                       ("mechanisms", "Built-in agent + mechanisms (tabu, plateau, bandit)")):
        rs = [r for r in runs if r["arm"] == arm and r["delta"] is not None]
        if not rs:
            continue
        d = [r["delta"] for r in rs]
        sd = statistics.stdev(d) if len(d) > 1 else 0.0
        lines.append(f"| {label} | {statistics.fmean(d):+.4f} ± {sd:.4f} | "
                     f"{statistics.fmean(r['kept'] for r in rs):.1f} | {statistics.fmean(r['crashed'] for r in rs):.1f} "
                     f"| {len(rs)} |")
    st = paired_stats([d for _, d in paired_diffs(runs, "mechanisms", "plain")])
    if st["n"] >= 2:
        lines += ["", f"Paired over {st['n']} campaign pairs (same agent seed): Δ(mechanisms) − Δ(plain) = "
                      f"{st['mean']:+.4f} ± {st['sd']:.4f} (SD), 95 % CI [{st['ci'][0]:+.4f}, {st['ci'][1]:+.4f}], "
                      f"t = {st['t']:.2f}" + (f", sign-flip p = {st['p_signflip']:.3f}" if "p_signflip" in st else "")
                      + f" (negative = the mechanisms found more); minimum detectable difference {st['mde']:.4f} "
                      "(80 % power, two-sided 5 %)."]
    elif st["n"] == 1:
        lines += ["", f"One campaign pair only: Δ(mechanisms) − Δ(plain) = {st['mean']:+.4f} (no test possible)."]
    return "\n".join(lines)


def planner(args, seed: int) -> Planner:
    """The built-in agent's planner; --no-expert-first drops its fixed opening moves."""
    return Planner(seed, expert=()) if args.no_expert_first else Planner(seed)


def add_campaign_args(p: argparse.ArgumentParser) -> None:
    """The benchmark-copy and campaign options both ablations take."""
    p.add_argument("--time-budget", type=float, default=60.0, help="training seconds per experiment (a cap)")
    # 80 steps of v2's batch 12: past its 20-step warm-up with 60 steps of decay (the demo runs 160); at v1's 20
    # steps v2 would never leave its warm-up
    p.add_argument("--steps", type=int, default=80, help="MAX_STEPS of the benchmark copy (0 = time-bounded)")
    p.add_argument("--batch", type=int, default=0, help="starting BATCH_SIZE of the benchmark copy (0 = as written)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the benchmark copy (0 = as written)")
    p.add_argument("--eval-tokens", type=int, default=8192)
    p.add_argument("--baseline-seeds", type=int, default=2)
    p.add_argument("--corpus", default="stdlib")
    p.add_argument("--out", type=Path, default=None, help="write every campaign's figures as JSON here")
    p.add_argument("--first-repeat", type=int, default=0,
                   help="number of the first repeat (its agent seed): two invocations with --first-repeat 0 and 4 "
                        "run repeats 0-3 and 4-7 side by side, one core each, and --summarise pairs them")
    p.add_argument("--keep-workspaces", action="store_true")
    p.add_argument("--tiny", action="store_true",
                   help="a smoke run: one repeat of one experiment per arm, 2 training steps, one seed, a tiny corpus "
                        "and a 1,024-token evaluation (seconds per run; the figures mean nothing)")
    p.add_argument("--no-expert-first", action="store_true",
                   help="the built-in agent without its fixed opening moves (EXPERT_FIRST: the same edits in the "
                        "same order in every arm and repeat, whatever the mechanisms say); with them the arms "
                        "cannot differ before experiment len(EXPERT_FIRST) + 1")


def apply_tiny(args, tmp: Path) -> None:
    """--tiny: the smallest campaign that still runs every step of the script (smoke, not a measurement)."""
    if args.tiny:
        args.repeats, args.n, args.steps, args.baseline_seeds = 1, 1, 2, 1
        args.eval_tokens, args.time_budget = tiny.BENCHMARK["eval_tokens"], tiny.BENCHMARK["time_budget"]
        args.corpus = str(tiny.tiny_corpus(tmp / "corpus"))


def source_commit() -> str:
    """The commit this script runs from ("+dirty" with uncommitted changes; "unknown" outside git)."""
    import subprocess

    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def run_arms(tmp: Path, args, arms, campaign, runs: list, extra=None) -> None:
    """args.repeats rounds of one campaign per arm, interleaved, numbered from args.first_repeat; figures
    saved after each (--out), with the commit, and extra(runs) (a dict: summaries so far) merged into the JSON."""
    commit = source_commit()
    try:
        for r in range(args.first_repeat, args.first_repeat + args.repeats):
            for arm in arms:
                runs.append(campaign(tmp, args, arm, r))
                if args.out:
                    doc = {"args": {k: str(v) for k, v in vars(args).items()}, "commit": commit, "runs": runs}
                    doc.update(extra(runs) if extra else {})
                    tmp_out = args.out.with_name(args.out.name + ".tmp")
                    tmp_out.write_text(json.dumps(doc, indent=2))
                    tmp_out.replace(args.out)      # a reader never sees half a file
    finally:
        if not args.keep_workspaces:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=8, help="campaign pairs (>= 8 for a meaningful paired test)")
    p.add_argument("-n", type=int, default=10, help="experiments per campaign (after the baseline)")
    add_campaign_args(p)
    args = p.parse_args()
    if args.repeats < 1 or args.n < 1 or args.first_repeat < 0:
        p.error("--repeats and -n must be >= 1, --first-repeat >= 0")

    tmp = Path(tempfile.mkdtemp(prefix="loopwright-ablation-"))
    # state directories under the run's own folder (removed with it), unless the caller chose a home
    os.environ.setdefault("LOOPWRIGHT_HOME", str(tmp / "home"))
    apply_tiny(args, tmp)
    runs: list[dict] = []
    t0 = time.monotonic()
    print(f"ablation: {args.repeats} repeats x 2 arms, {args.n} experiments each, time budget {args.time_budget} s, "
          f"MAX_STEPS {args.steps}, workspaces under {tmp}", flush=True)
    run_arms(tmp, args, (False, True), campaign, runs)
    print(f"\n{summarise(runs)}\n\ntotal {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
