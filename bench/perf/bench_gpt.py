"""Performance of the bundled GPT benchmark (bench/gpt) on this machine:

    python bench/perf/bench_gpt.py                 # one 30 s run, ~1.5 minutes
    python bench/perf/bench_gpt.py --budget 60 --repeat 2
    python bench/perf/bench_gpt.py --corpus stdlib --eval-tokens 8192   # the demo's evaluation, the old corpus
    python bench/perf/bench_gpt.py --tiny          # a smoke run (2 steps, tiny corpus): seconds, no figures

In one run it prints:
- training throughput (tokens/s over the training loop) and MFU: the model's
  training FLOPs per token (train.flops_per_token) x tokens/s, against the fp32
  matmul peak measured on this machine just before and just after the run (the
  higher of the two, so contention lowers MFU rather than raising it);
  target >= 60 %;
- the steady-state step throughput (median of warm steps, from the progress
  lines), which excludes the warm-up steps;
- the frozen evaluation: wall time of `python -I prepare.py evaluate` and its
  own eval_seconds;
- total_seconds / TIME_BUDGET from train.py's summary (target <= 1.05).

Shared machines are noisy: the peak and the run are measured back to back and
the figures that matter are ratios from the same run; the load average is
printed so a noisy result can be recognised.
"""
import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as train.py and the evaluator do (before torch loads)

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "gpt"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny  # noqa: E402

from mcp_server.loop.workspace import EVALUATOR_PY  # noqa: E402  (prepare.py and its frozen siblings)

PROGRESS = re.compile(r"^step=(\d+) loss=\S+ elapsed=([0-9.]+) remaining=")


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def summary(stdout: str) -> dict:
    block = stdout.split("\n---\n")[-1]
    out = {}
    for line in block.strip().splitlines():
        k, _, v = line.partition(":")
        try:
            out[k.strip()] = float(v)
        except ValueError:
            out[k.strip()] = v.strip()
    return out


def one_run(ws: Path, prepare, train, budget: float, peak_seconds: float = 0.5) -> dict:
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    load0 = os.getloadavg()[0]
    peak_before = prepare.measure_matmul_flops(seconds=peak_seconds)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env.update(LOOPWRIGHT_SEED="0", LOOPWRIGHT_EXPORT_PATH=str(ws / "model.pt2"))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "train.py"], cwd=ws, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"train.py failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    peak_after = prepare.measure_matmul_flops(seconds=peak_seconds)
    load1 = os.getloadavg()[0]
    s = summary(proc.stdout)
    peak = max(peak_before, peak_after)

    model = train.GPT(prepare.VOCAB_SIZE, train.D_MODEL, train.DEPTH, train.N_HEAD, train.MLP_RATIO, prepare.SEQ_LEN)
    fpt = train.flops_per_token(model, prepare.SEQ_LEN)
    tokens = s["total_tokens_M"] * 1e6
    tps = tokens / s["training_seconds"]
    # steady state: median seconds per step between consecutive progress lines after the first 3
    pts = [(int(m.group(1)), float(m.group(2))) for m in map(PROGRESS.match, proc.stdout.splitlines()) if m]
    rates = sorted((b[0] - a[0]) / (b[1] - a[1]) for a, b in zip(pts, pts[1:]) if a[0] >= 3 and b[1] > a[1])
    steady_tps = rates[len(rates) // 2] * train.BATCH_SIZE * prepare.SEQ_LEN if rates else float("nan")

    t1 = time.monotonic()
    ev = subprocess.run([sys.executable, "-I", str(ws / "prepare.py"), "evaluate", str(ws / "model.pt2")],
                        cwd=ws, capture_output=True, text=True)
    eval_wall = time.monotonic() - t1
    res = json.loads(ev.stdout.strip().splitlines()[-1])
    if not res.get("ok"):
        raise SystemExit(f"evaluation failed: {res}")
    return {
        "tokens_per_s": tps,
        "steady_tokens_per_s": steady_tps,
        "flops_per_token": fpt,
        "achieved_gflops": fpt * tps / 1e9,
        "peak_gflops_before": peak_before / 1e9,
        "peak_gflops_after": peak_after / 1e9,
        "mfu_percent": 100 * fpt * tps / peak,
        "steady_mfu_percent": 100 * fpt * steady_tps / peak,
        "mfu_percent_train_py": s["mfu_percent"],
        "num_steps": int(s["num_steps"]),
        "training_seconds": s["training_seconds"],
        "total_seconds": s["total_seconds"],
        "total_over_budget": s["total_seconds"] / budget,
        "process_wall_seconds": wall,
        "train_eval_bpb": s.get("train_eval_bpb"),   # train.py's own quick estimate on held-out train tokens
        "val_bpb": res["val_bpb"],
        "test_bpb": res["test_bpb"],
        "eval_wall_seconds": eval_wall,
        "eval_seconds": res["eval_seconds"],
        "eval_tokens": res["val_tokens"] + res["test_tokens"],
        "loadavg_before_after": (load0, load1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=30.0, help="TIME_BUDGET in seconds (default 30)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--corpus", default="stdlib-hidden", help="[benchmark] corpus (default: prepare.py's)")
    ap.add_argument("--eval-tokens", type=int, default=None,
                    help="[benchmark] eval_tokens (default: prepare.py's 131,072; the demo's is 8,192)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--tiny", action="store_true", help="a smoke run: 2 training steps on a tiny corpus, a "
                    "1,024-token evaluation (seconds; the figures mean nothing)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_gpt_") as tmp:
        ws = Path(tmp)
        for name in (*EVALUATOR_PY, "train.py"):
            shutil.copyfile(BENCH / name, ws / name)
        if args.tiny:
            (ws / "train.py").write_text(tiny.tiny_train((ws / "train.py").read_text()))
            args.budget = tiny.BENCHMARK["time_budget"]
            toml = tiny.toml_lines(tiny.tiny_corpus(ws / "corpus"))
        else:
            toml = [f"time_budget = {args.budget}", f'corpus = "{args.corpus}"']
            toml += [f"eval_tokens = {args.eval_tokens}"] if args.eval_tokens else []
        (ws / "loopwright.toml").write_text("\n".join(["[benchmark]", *toml]) + "\n")
        t0 = time.monotonic()
        subprocess.run([sys.executable, str(ws / "prepare.py"), "prepare"], cwd=ws, check=True,
                       capture_output=True, text=True)
        prep_wall = time.monotonic() - t0
        sys.path.insert(0, str(ws))  # train.py imports prepare
        prepare = load(ws / "prepare.py", "prepare")
        sys.modules["prepare"] = prepare
        train = load(ws / "train.py", "train_bench")
        print(f"machine: {os.cpu_count()} CPUs, torch {__import__('torch').__version__}, "
              f"budget {args.budget:.0f} s, SEQ_LEN {prepare.SEQ_LEN}, EVAL_TOKENS {prepare.EVAL_TOKENS}; "
              f"prepare ({'tiny' if args.tiny else args.corpus} corpus, incl. interpreter start) {prep_wall:.1f} s")
        results = []
        for i in range(args.repeat):
            r = one_run(ws, prepare, train, args.budget, 0.05 if args.tiny else 0.5)
            results.append(r)
            print(f"run {i + 1}: "
                  f"tokens/s {r['tokens_per_s']:,.0f} (steady {r['steady_tokens_per_s']:,.0f}) | "
                  f"{r['achieved_gflops']:.1f} GFLOP/s vs fp32 matmul peak {r['peak_gflops_before']:.1f} / "
                  f"{r['peak_gflops_after']:.1f} (before / after) -> MFU {r['mfu_percent']:.1f} % "
                  f"(steady {r['steady_mfu_percent']:.1f} %) | "
                  f"total/budget {r['total_over_budget']:.3f} (total {r['total_seconds']:.1f} s, training "
                  f"{r['training_seconds']:.1f} s, {r['num_steps']} steps) | "
                  f"eval {r['eval_wall_seconds']:.1f} s wall ({r['eval_seconds']:.1f} s inside, "
                  f"{r['eval_tokens']:,} tokens) | val_bpb {r['val_bpb']:.4f} test_bpb {r['test_bpb']:.4f} | "
                  f"load {r['loadavg_before_after'][0]:.1f} -> {r['loadavg_before_after'][1]:.1f}", flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
