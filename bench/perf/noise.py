"""Noise of the bundled GPT benchmark: unpaired vs paired, and what it means per experiment.

    python bench/perf/noise.py                         # 4 seeds, WARMDOWN_FRAC 0.2 -> 0.4, ~10 min on 2 idle cores
    python bench/perf/noise.py --seeds 6 --variant LR=0.006 --budget 30 --clock steps
    python bench/perf/noise.py --tiny                  # a smoke run: one seed, 2 steps, tiny corpus (no figures)

It runs the baseline train.py and a small variant of it (one constant changed)
on the same seeds 1..N, interleaved (baseline s, variant s, baseline s+1, ...)
so that drifting machine load hits both arms alike, each through the frozen
evaluator (`python -I prepare.py evaluate`), with the budget clock that
prepare.py picks for this machine (auto: cpu without a GPU) unless --clock says
otherwise. It prints:

- sigma_unpaired: the SD of val_bpb across seeds, pooled over the two arms --
  what an unpaired comparison (candidate's seeds vs the baseline's) fights;
- sigma_paired: the SD of d_s = variant_s - baseline_s -- what a paired
  (same-seed) comparison fights; the seed's share of the noise cancels in d_s;
- the evaluator's own sampling error (val_se: per-window spread / sqrt(n));
- the MDE per experiment at n pairs, the rule of mcp_server/loop/verdict.py:

      MDE(n) = max(min_delta, k * sigma_d / sqrt(n)) + z_0.8 * sigma_d / sqrt(n)

  with k = 2 ([noise] k_sigma), z_0.8 = 0.8416 (80 % power): the true gain a
  paired test keeps 4 times out of 5 with n pairs. Its unpaired counterpart
  uses sigma_unpaired * sqrt(2) (both arms noisy, no cancellation).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "gpt"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny  # noqa: E402

from mcp_server.loop.workspace import EVALUATOR_PY  # noqa: E402  (prepare.py and its frozen siblings)


def file_tag(tag: str) -> str:
    """A name for the model archive: its stem becomes the archive's root folder, which the evaluator
    accepts only as a plain name (letters, digits, _ . -), so a tag like `LR=0.012` is spelt `LR_0.012`."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", tag)[:100]


def set_constant(src: str, name: str, value: str) -> str:
    out, n = re.subn(rf"^{name} = [^\s#]+", f"{name} = {value}", src, count=1, flags=re.M)
    if n != 1:
        raise SystemExit(f"train.py has no top-level constant {name}")
    return out


def summary(stdout: str) -> dict:
    out = {}
    for line in stdout.split("\n---\n")[-1].strip().splitlines():
        k, _, v = line.partition(":")
        out[k.strip()] = v.strip()
    return out


def evaluate(ws: Path, model: Path, env: dict, eval_tokens: int | None = None) -> dict:
    """The frozen evaluator on `model`; with eval_tokens, on that many tokens instead of the workspace's."""
    toml = ws / "loopwright.toml"
    saved = toml.read_text() if toml.is_file() else None
    if eval_tokens is not None:
        kept = [ln for ln in (saved or "[benchmark]\n").splitlines() if not ln.startswith("eval_tokens")]
        toml.write_text("\n".join(kept) + f"\neval_tokens = {eval_tokens}\n")   # [benchmark] is the only table
    try:
        ev = subprocess.run([sys.executable, "-I", str(ws / "prepare.py"), "evaluate", str(model)], cwd=ws,
                            capture_output=True, text=True, env=env)
    finally:
        if eval_tokens is not None:
            toml.write_text(saved) if saved is not None else toml.unlink()
    res = json.loads(ev.stdout.strip().splitlines()[-1])
    if not res.get("ok"):
        raise SystemExit(f"evaluation of {model.name} failed: {res}")
    return res


def run(ws: Path, train: str, seed: int, tag: str, also_eval: tuple[int, ...] = ()) -> dict:
    """Train `train` on `seed` and score it; `also_eval`: score the same model on these eval sizes too
    (val_bpb_at_N), which separates the evaluator's sampling noise from the training's."""
    model = ws / f"{file_tag(tag)}-{seed}.pt2"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env.update(LOOPWRIGHT_SEED=str(seed), LOOPWRIGHT_EXPORT_PATH=str(model))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, train], cwd=ws, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{train} seed {seed} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    s = summary(proc.stdout)
    res = evaluate(ws, model, env)
    extra = {f"val_bpb_at_{n}": evaluate(ws, model, env, n)["val_bpb"] for n in also_eval}
    model.unlink()
    return {"tag": tag, "seed": seed, "val_bpb": res["val_bpb"], "val_se": res["val_se"],
            "steps": int(s["num_steps"]), "clock": s.get("clock"), "cpu_seconds": float(s.get("cpu_seconds", "nan")),
            "train_wall": round(wall, 1), "eval_seconds": res["eval_seconds"], **extra}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=4, help="seeds 1..N for each arm (default 4)")
    p.add_argument("--first-seed", type=int, default=1, help="start at this seed (more pairs in a second run)")
    p.add_argument("--variant", default="WARMDOWN_FRAC=0.4", help="NAME=VALUE: the small change (default %(default)s)")
    p.add_argument("--budget", type=float, default=30.0, help="[benchmark] time_budget (the demo's: 30)")
    p.add_argument("--clock", default=None, help="[benchmark] clock (default: prepare.py's, auto)")
    p.add_argument("--eval-tokens", type=int, default=None, help="[benchmark] eval_tokens (default: prepare.py's)")
    p.add_argument("--k", type=float, default=2.0, help="k_sigma of the verdict (default 2)")
    p.add_argument("--keep", action="store_true", help="keep the temporary workspace")
    p.add_argument("--from-log", type=Path, nargs="+", help="recompute the figures from the JSON lines of an earlier "
                   "(possibly interrupted) run's output instead of running anything")
    p.add_argument("--tiny", action="store_true", help="a smoke run: one seed, 2 training steps, a tiny corpus and "
                   "a 1,024-token evaluation (seconds; the figures mean nothing)")
    args = p.parse_args(argv)
    if args.tiny:
        args.seeds, args.budget, args.eval_tokens = 1, tiny.BENCHMARK["time_budget"], tiny.BENCHMARK["eval_tokens"]
    name, _, value = args.variant.partition("=")
    if args.from_log:
        rows = [json.loads(line) for log in args.from_log for line in log.read_text().splitlines()
                if line.startswith("{")]
        seeds = {r["seed"] for r in rows if r["tag"] == "baseline"} & {r["seed"] for r in rows if r["tag"] == "variant"}
        rows = [r for r in rows if r["seed"] in seeds]
        return report(rows, args, None, None, None)

    tmp = Path(tempfile.mkdtemp(prefix="lw-noise-"))
    try:
        ws = tmp / "ws"
        ws.mkdir()
        for harness in EVALUATOR_PY:
            shutil.copyfile(BENCH / harness, ws / harness)
        src = (BENCH / "train.py").read_text()
        if args.tiny:
            src = tiny.tiny_train(src)
        (ws / "train.py").write_text(src)
        (ws / "variant.py").write_text(set_constant(src, name, value))
        toml = ["[benchmark]", f"time_budget = {args.budget}"]
        if args.clock:
            toml.append(f'clock = "{args.clock}"')
        if args.eval_tokens:
            toml.append(f"eval_tokens = {args.eval_tokens}")
        if args.tiny:
            toml.append(f'corpus = "{tiny.tiny_corpus(tmp / "corpus")}"')
        (ws / "loopwright.toml").write_text("\n".join(toml) + "\n")
        subprocess.run([sys.executable, "prepare.py", "prepare"], cwd=ws, check=True, capture_output=True)
        load0 = os.getloadavg()
        print(f"# {time.strftime('%Y-%m-%d %H:%M')} load {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
              f"budget {args.budget}, variant {args.variant}, seeds {args.first_seed}.."
              f"{args.first_seed + args.seeds - 1}", flush=True)
        rows = []
        t_start = time.monotonic()
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for tag, train in (("baseline", "train.py"), ("variant", "variant.py")):
                r = run(ws, train, seed, tag)
                rows.append(r)
                print(json.dumps(r), flush=True)
        elapsed = time.monotonic() - t_start
        load1 = os.getloadavg()
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return report(rows, args, elapsed, load0, load1)


def report(rows: list, args, elapsed, load0, load1) -> int:
    from mcp_server.loop.config import NoiseConfig
    from mcp_server.loop.verdict import mde

    base = [r["val_bpb"] for r in rows if r["tag"] == "baseline"]
    var = [r["val_bpb"] for r in rows if r["tag"] == "variant"]
    d = [v - b for b, v in zip(base, var)]
    if len(d) < 2:   # one seed (--tiny): the runs and d, no spread to estimate
        print(f"\n{len(rows)} runs; baseline {base}, variant {var}, paired d {d} (one seed: no sigma)")
        return 0
    sd_u = math.sqrt((statistics.variance(base) + statistics.variance(var)) / 2)
    sd_d = statistics.stdev(d)
    noise = NoiseConfig(k_sigma=args.k)
    se = statistics.fmean(r["val_se"] for r in rows)
    steps = [r["steps"] for r in rows if r["tag"] == "baseline"]
    if elapsed is None:   # from a log: the runs' own wall times
        elapsed = sum(r["train_wall"] + r["eval_seconds"] for r in rows)
    loads = f", load {load0[0]:.2f} -> {load1[0]:.2f}" if load0 else ""
    print(f"\nclock {rows[0]['clock']}, {len(rows)} runs in {elapsed / 60:.1f} min "
          f"({elapsed / len(rows):.0f} s per run incl. evaluation){loads}")
    print(f"baseline val_bpb  {statistics.fmean(base):.4f} (seeds: {', '.join(f'{x:.4f}' for x in base)}), "
          f"steps {min(steps)}-{max(steps)}")
    print(f"variant  val_bpb  {statistics.fmean(var):.4f} (seeds: {', '.join(f'{x:.4f}' for x in var)})")
    print(f"paired d          {statistics.fmean(d):+.4f} (per seed: {', '.join(f'{x:+.4f}' for x in d)})")
    print(f"sigma_unpaired    {sd_u:.4f}")
    print(f"sigma_paired      {sd_d:.4f}   ({sd_u / max(sd_d, 1e-12):.1f}x smaller)")
    print(f"evaluator SE      {se:.4f}   (val_se, mean over runs)")
    print(f"MDE (k={args.k:g}, 80 % power; candidate runs per experiment = n):")
    for n in (1, 2, 3, 4):
        print(f"  n={n}: paired {mde(sd_d, noise, n):.4f}   unpaired {mde(sd_u * math.sqrt(2), noise, n):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
