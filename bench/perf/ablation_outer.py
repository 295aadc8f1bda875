"""Ablation of the bilevel outer loop, in the form of Bilevel Autoresearch's table:

    no mechanisms            the built-in agent, plain hill climb (suggest_next not consulted)
    fixed built-in           + the built-in mechanisms (tabu, plateau, bandit), never changed
    built-in outer loop      + the built-in outer loop (`loopwright mechanisms auto on`): a UCB1 bandit
                               that puts the installed mechanisms (mechanisms/library/) on trial windows
                               of --window experiments, each kept or reverted by its measured effect

    python bench/perf/ablation_outer.py                        # 3 repeats x 3 arms x 12 experiments
    python bench/perf/ablation_outer.py --summarise a.json b.json   # arms run separately, paired by repeat
    python bench/perf/ablation_outer.py --tiny                 # a smoke run: one outer-arm campaign, 1 experiment

The built-in agent opens every campaign with the same fixed moves (EXPERT_FIRST, 5 of them), which
ignore suggest_next: with -n 5 or fewer the three arms make identical edits in every repeat.
--no-expert-first drops them, so that the mechanisms steer from the first experiment.
    python bench/perf/ablation_outer.py --repeats 1 -n 4 --steps 8 --out /tmp/outer.json   # a smoke run

Campaigns are paired: repeat r of every arm uses the same agent seed, a fresh workspace on the
same benchmark copy and budget, and arms are interleaved (none, builtin, outer, none, ...) so
that machine load hits all of them alike. Figure of merit, as in the paper: Δ = best − baseline
val_bpb at the end of each campaign (negative = better), mean ± SD over repeats; also the paired
difference against the fixed built-in arm (Δ(none) − Δ(fixed) is the mechanisms ablation, Δ(outer) −
Δ(fixed) the outer loop's) with a 95 % t-interval, the paired t and an exact sign-flip p-value; the
JSON (--out, rewritten after every campaign) holds every campaign, these comparisons and a
per-repeat table. The benchmark copy, MAX_STEPS pinning and thread count
are those of ablation_mechanisms.py (see its docstring).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ablation_mechanisms import (  # noqa: E402
    add_campaign_args,
    apply_tiny,
    bench_copy,
    fmt_paired,
    paired_diffs,
    paired_stats,
    planner,
    run_arms,
)

from mcp_server.agents.builtin import run_builtin  # noqa: E402
from mcp_server.loop.setup import init_workspace  # noqa: E402
from mcp_server.loop.workspace import Workspace  # noqa: E402

ARMS = (("none", "Built-in agent, no mechanisms"),
        ("builtin", "Built-in agent + fixed built-in mechanisms (tabu, plateau, bandit)"),
        ("outer", "Built-in agent + built-in mechanisms + built-in outer loop (bandit over mechanisms)"))


def campaign(tmp: Path, args, arm: str, repeat: int) -> dict:
    from mcp_server.mechanisms import trial

    tag = f"{arm}{repeat}"
    root = tmp / tag
    overrides = {"benchmark": {"eval_tokens": args.eval_tokens, "grace_seconds": 45.0},
                 "noise": {"baseline_seeds": args.baseline_seeds},
                 # runs, as in ablation_mechanisms.py: baseline seeds, each candidate on the seed set, confirm
                 # pairs, seed-set re-measures (a budget stop would end one arm's campaign early)
                 "budget": {"max_experiments": 3 * args.baseline_seeds + (args.baseline_seeds + 2) * args.n,
                            "max_hours": 10.0}}
    if args.tiny:   # the baseline run and one candidate run, as in ablation_mechanisms.py
        overrides["budget"]["max_experiments"] = 2
    t0 = time.monotonic()
    ws = init_workspace(root, tag=tag, corpus=args.corpus, time_budget=args.time_budget, overrides=overrides,
                        bench_dir=bench_copy(tmp / f"bench-{tag}", args.steps, args.batch, args.threads))
    if arm == "outer":
        with ws.ledger() as led:
            trial.set_outer(led, True, args.window)

    def log(kind, d):
        if kind == "experiment_end":
            a = d["attempt"]
            print(f"    [{tag}] {a.description:32s} {a.status:8s} {a.verdict or '':8s} "
                  f"{a.val_bpb if a.val_bpb is not None else float('nan'):.4f}  {a.seconds:.0f}s", flush=True)
        elif kind == "suggestion" and d["suggestion"].get("mechanisms"):
            m = d["suggestion"]["mechanisms"][0]
            print(f"    [{tag}] mechanism {m['name']} ({m['status']}): {m.get('note') or m.get('category')}", flush=True)

    res = run_builtin(root, n=args.n, mechanisms=arm != "none", seed=repeat, observer=log,
                      planner=planner(args, repeat))
    with Workspace.open(root).ledger() as led:
        trials = led.trials()
    base, best = res.baseline, res.best
    out = {"arm": arm, "repeat": repeat, "baseline": base, "best": best,
           "delta": None if base is None or best is None else best - base, "kept": res.kept,
           "crashed": sum(a.status != "ok" for a in res.attempts), "experiments": len(res.attempts),
           "trials": [{"name": t["name"], "outcome": t["outcome"], "reason": t["reason"]} for t in trials],
           "attempts": [{"description": a.description, "status": a.status, "verdict": a.verdict,
                         "val_bpb": a.val_bpb} for a in res.attempts],
           "stopped": res.stopped_because, "seconds": round(time.monotonic() - t0, 1)}
    print(f"  {tag}: Δ {out['delta'] if out['delta'] is not None else float('nan'):+.4f}, kept {out['kept']}, "
          f"crashed {out['crashed']}, trials {[(t['name'], t['outcome']) for t in out['trials']]}, "
          f"{out['seconds']:.0f} s", flush=True)
    return out


def _ms(xs: list[float]) -> str:
    if not xs:
        return "—"
    return f"{statistics.fmean(xs):+.4f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.4f}"


def comparisons(runs: list[dict]) -> dict:
    """The paired comparisons against the fixed built-in arm, and the per-repeat table (for the JSON).

    none_vs_builtin: d_r = Δ(none) − Δ(builtin), the mechanisms ablation (positive = the mechanisms
    found more); outer_vs_builtin: d_r = Δ(outer) − Δ(builtin) (negative = the outer loop found more)."""
    out: dict = {}
    for arm in ("none", "outer"):
        pairs = paired_diffs(runs, arm, "builtin")
        st = paired_stats([d for _, d in pairs])
        out[f"{arm}_vs_builtin"] = {**st, "diffs": dict(pairs)}
    table = []
    for k in sorted({r["repeat"] for r in runs}):
        row: dict = {"repeat": k}
        for r in (r for r in runs if r["repeat"] == k):
            row[r["arm"]] = {"delta": r["delta"], "baseline": r["baseline"], "best": r["best"], "kept": r["kept"],
                             "experiments": r["experiments"], "seconds": r["seconds"],
                             "trials": [(t["name"], t["outcome"]) for t in r["trials"]]}
        for arm in ("none", "outer"):
            d = out[f"{arm}_vs_builtin"]["diffs"].get(k)
            row[f"d_{arm}_vs_builtin"] = d
        table.append(row)
    return {"paired": out, "per_repeat": table}


def summarise(runs: list[dict]) -> str:
    cmp = comparisons(runs)["paired"]
    lines = ["| Method | Δ val_bpb (best − baseline), mean ± SD | paired Δ − Δ(fixed): mean [95 % CI], t, sign-flip p, MDE | "
             "kept / campaign | mechanism trials (kept / reverted) | campaigns |", "|---|---|---|---|---|---|"]
    for arm, label in ARMS:
        rs = [r for r in runs if r["arm"] == arm and r["delta"] is not None]
        if not rs:
            continue
        kept_t = sum(t["outcome"] == "kept" for r in rs for t in r["trials"])
        rev_t = sum(t["outcome"] in ("reverted", "failed") for r in rs for t in r["trials"])
        paired = "—" if arm == "builtin" else fmt_paired(cmp[f"{arm}_vs_builtin"])
        lines.append(f"| {label} | {_ms([r['delta'] for r in rs])} | {paired} | "
                     f"{statistics.fmean(r['kept'] for r in rs):.1f} | "
                     f"{f'{kept_t} / {rev_t}' if arm == 'outer' else '—'} | {len(rs)} |")
    lines += ["", "Paired over repeats (same agent seed); sign: none − fixed > 0 = the fixed mechanisms found more, "
              "outer − fixed < 0 = the outer loop found more. MDE: the smallest true difference these pairs "
              "detect with 80 % power (two-sided 5 %), (t_0.975 + 0.84) · SD / √pairs.",
              "", "| repeat | Δ none | Δ fixed | Δ outer | none − fixed | outer − fixed | outer trials |",
              "|---|---|---|---|---|---|---|"]

    def f(x):
        return "—" if x is None else f"{x:+.4f}"
    for row in comparisons(runs)["per_repeat"]:
        trials = ", ".join(f"{n} {o}" for n, o in (row.get("outer") or {}).get("trials", [])) or "—"
        lines.append(f"| {row['repeat']} | {f((row.get('none') or {}).get('delta'))} | "
                     f"{f((row.get('builtin') or {}).get('delta'))} | {f((row.get('outer') or {}).get('delta'))} | "
                     f"{f(row['d_none_vs_builtin'])} | {f(row['d_outer_vs_builtin'])} | {trials} |")
    return "\n".join(lines)


def summarise_files(paths: list[Path], out: Path | None) -> int:
    docs = [json.loads(f.read_text()) for f in paths]
    scale = ("n", "steps", "window", "batch", "threads", "eval_tokens", "baseline_seeds", "time_budget", "corpus",
             "no_expert_first")
    scales = {tuple(d["args"].get(k) for k in scale) for d in docs}
    if len(scales) > 1:
        raise SystemExit(f"the files were run at different scales ({sorted(scales)}): their campaigns do not pair")
    runs = [r for d in docs for r in d["runs"]]
    if len({(r["arm"], r["repeat"]) for r in runs}) < len(runs):
        raise SystemExit("the files hold the same arm and repeat twice: pass each campaign once")
    print(summarise(runs))
    if out:
        out.write_text(json.dumps({"args": docs[0]["args"], "from": [str(f) for f in paths],
                                   "commits": sorted({d.get("commit", "unknown") for d in docs}), "runs": runs,
                                   **comparisons(runs)}, indent=2))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("-n", type=int, default=12, help="experiments per campaign (after the baseline)")
    p.add_argument("--window", type=int, default=4, help="trial window of the outer loop, in experiments")
    p.add_argument("--arms", default="none,builtin,outer", help="comma-separated subset of none,builtin,outer")
    p.add_argument("--summarise", type=Path, nargs="+", metavar="JSON",
                   help="run nothing: the summary of the campaigns in these --out files together (arms run in "
                        "separate invocations pair by repeat; all must share the scale), written to --out if given")
    add_campaign_args(p)
    args = p.parse_args()
    if args.summarise:
        return summarise_files(args.summarise, args.out)
    if args.tiny:   # one campaign of the arm this script adds; the others are ablation_mechanisms.py's
        args.arms, args.window = "outer", 2
    arms = [a for a in args.arms.split(",") if a]
    if (args.repeats < 1 or args.n < 1 or args.first_repeat < 0 or args.window < 2
            or not set(arms) <= {a for a, _ in ARMS}):
        p.error("--repeats and -n must be >= 1, --first-repeat >= 0, --window >= 2, --arms from none,builtin,outer")

    tmp = Path(tempfile.mkdtemp(prefix="loopwright-ablation-outer-"))
    # state directories under the run's own folder (removed with it), unless the caller chose a home
    os.environ.setdefault("LOOPWRIGHT_HOME", str(tmp / "home"))
    apply_tiny(args, tmp)
    runs: list[dict] = []
    t0 = time.monotonic()
    print(f"outer-loop ablation: {args.repeats} repeats x {len(arms)} arms, {args.n} experiments each, window "
          f"{args.window}, MAX_STEPS {args.steps}, workspaces under {tmp}", flush=True)
    run_arms(tmp, args, arms, campaign, runs, extra=comparisons)
    print(f"\n{summarise(runs)}\n\ntotal {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
