"""Paired screen: several one-constant changes of the bundled train.py against the same base, same seeds.

    python bench/perf/screen.py --seeds 3 --eval-tokens 8192 \\
        --variants EMBED_LR=0.03 LOGIT_SOFTCAP=30.0 LR=0.006
    python bench/perf/screen.py --base WARMUP_STEPS=3 --variants WARMUP_STEPS=10 ...   # another base
    python bench/perf/screen.py --tiny            # a smoke run: LR=0.012 on one seed, 2 steps (no figures)

How the baseline and the built-in agent's first moves are chosen (BENCHMARKS.md, "Paired screen"). For
each seed the base runs first, then every variant, each through the frozen evaluator, on prepare.py's
budget clock (auto: the CPU clock without a GPU) unless --clock says otherwise. It prints, per variant,
the paired differences d_s = variant_s - base_s (negative = better), their mean, their SD, and the
steps trained; then sigma_d pooled over all variants' deviations around their own means (what the
loop's verdict estimates, mcp_server/loop/verdict.py) and the MDE it implies at n pairs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny  # noqa: E402
from noise import BENCH, run, set_constant  # noqa: E402

from mcp_server.loop.workspace import EVALUATOR_PY  # noqa: E402  (prepare.py and its frozen siblings)


def apply(src: str, spec: str) -> str:
    """NAME=VALUE[+NAME=VALUE...] applied to the source."""
    for part in spec.split("+"):
        name, sep, value = part.partition("=")
        if not sep or not name:
            raise SystemExit(f"--variants/--base take NAME=VALUE[+NAME=VALUE], not {spec!r}")
        src = set_constant(src, name.strip(), value.strip())
    return src


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", help="NAME=VALUE[+NAME=VALUE] each (required unless --tiny)")
    p.add_argument("--base", default="", help="NAME=VALUE[+...] applied to the bundled train.py first")
    p.add_argument("--train", type=Path, default=None, help="screen around this train.py instead of the bundled one "
                   "(a candidate reference baseline)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--budget", type=float, default=30.0, help="[benchmark] time_budget (the demo's: 30)")
    p.add_argument("--clock", default=None)
    p.add_argument("--budget-tokens", type=int, default=None, help="[benchmark] budget_tokens (the steps clock's)")
    p.add_argument("--eval-tokens", type=int, default=8192, help="[benchmark] eval_tokens (the demo's: 8192)")
    p.add_argument("--also-eval", type=int, nargs="*", default=[], metavar="TOKENS",
                   help="score every model on these eval sizes too: d per size shows how much of sigma_d is "
                        "the evaluator's sampling error")
    p.add_argument("--out", type=Path, default=None, help="also write every run as JSON lines here")
    p.add_argument("--tiny", action="store_true", help="a smoke run: the base and one variant (LR=0.012 unless "
                   "--variants) on one seed, 2 training steps, a tiny corpus (seconds; the figures mean nothing)")
    args = p.parse_args(argv)
    if args.tiny:
        args.variants = args.variants or ["LR=0.012"]
        args.seeds, args.budget, args.eval_tokens = 1, tiny.BENCHMARK["time_budget"], tiny.BENCHMARK["eval_tokens"]
    if not args.variants:
        p.error("--variants is required: NAME=VALUE[+NAME=VALUE] each, e.g. --variants LR=0.012 EMBED_LR=0.03")

    tmp = Path(tempfile.mkdtemp(prefix="lw-screen-"))
    rows: list[dict] = []
    try:
        ws = tmp / "ws"
        ws.mkdir()
        for harness in EVALUATOR_PY:
            shutil.copyfile(BENCH / harness, ws / harness)
        base_src = (args.train or BENCH / "train.py").read_text()
        if args.tiny:
            base_src = tiny.tiny_train(base_src)
        if args.base:
            base_src = apply(base_src, args.base)
        (ws / "train.py").write_text(base_src)
        files = {"base": "train.py"}
        for i, v in enumerate(args.variants):
            (ws / f"v{i}.py").write_text(apply(base_src, v))
            files[v] = f"v{i}.py"
        toml = ["[benchmark]", f"time_budget = {args.budget}", f"eval_tokens = {args.eval_tokens}"]
        if args.clock:
            toml.append(f'clock = "{args.clock}"')
        if args.budget_tokens:
            toml.append(f"budget_tokens = {args.budget_tokens}")
        if args.tiny:
            toml.append(f'corpus = "{tiny.tiny_corpus(tmp / "corpus")}"')
        (ws / "loopwright.toml").write_text("\n".join(toml) + "\n")
        subprocess.run([sys.executable, "prepare.py", "prepare"], cwd=ws, check=True, capture_output=True)
        load0 = os.getloadavg()
        print(f"# {time.strftime('%Y-%m-%d %H:%M')} load {load0[0]:.2f}; base {args.base or 'bundled'}; "
              f"seeds {args.first_seed}..{args.first_seed + args.seeds - 1}", flush=True)
        t0 = time.monotonic()
        out = args.out.open("a") if args.out else None
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for tag, train in files.items():
                r = run(ws, train, seed, tag, tuple(args.also_eval))
                rows.append(r)
                print(json.dumps(r), flush=True)
                if out:
                    out.write(json.dumps(r) + "\n")
                    out.flush()
        elapsed = time.monotonic() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(rows, args.variants, elapsed, load0, os.getloadavg())
    for n in args.also_eval:
        print(f"\n## the same models scored on {n} eval tokens")
        report([{**r, "val_bpb": r[f"val_bpb_at_{n}"]} for r in rows], args.variants, elapsed, load0,
               os.getloadavg())
    return 0


def report(rows: list[dict], variants: list[str], elapsed: float, load0, load1) -> None:
    from mcp_server.loop.config import NoiseConfig
    from mcp_server.loop.verdict import mde

    base = {r["seed"]: r for r in rows if r["tag"] == "base"}
    print(f"\n{len(rows)} runs in {elapsed / 60:.1f} min, load {load0[0]:.2f} -> {load1[0]:.2f}; base val_bpb "
          f"{statistics.fmean(r['val_bpb'] for r in base.values()):.4f}, steps "
          f"{', '.join(str(r['steps']) for r in base.values())}")
    print("| change | d per seed | mean d | SD of d | steps (variant) |\n|---|---|---|---|---|")
    ss, df = 0.0, 0
    for v in variants:
        vr = [r for r in rows if r["tag"] == v and r["seed"] in base]
        d = [r["val_bpb"] - base[r["seed"]]["val_bpb"] for r in vr]
        m = statistics.fmean(d)
        sd = statistics.stdev(d) if len(d) > 1 else float("nan")
        ss += sum((x - m) ** 2 for x in d)
        df += len(d) - 1
        print(f"| `{v}` | {', '.join(f'{x:+.4f}' for x in d)} | {m:+.4f} | {sd:.4f} | "
              f"{', '.join(str(r['steps']) for r in vr)} |")
    if df:
        sd_d = math.sqrt(ss / df)
        noise = NoiseConfig()
        print(f"\nsigma_d pooled within changes: {sd_d:.4f} ({df} dof); MDE at n = 1/2/3 pairs: "
              + " / ".join(f"{mde(sd_d, noise, n):.4f}" for n in (1, 2, 3)))


if __name__ == "__main__":
    sys.exit(main())
