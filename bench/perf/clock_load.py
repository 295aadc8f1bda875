"""Training steps under a competing busy loop: the wall clock vs the cpu clock.

    python bench/perf/clock_load.py                 # 3 runs per clock, 30 s budget, ~6 min on 2 cores
    python bench/perf/clock_load.py --runs 5 --busy 2
    python bench/perf/clock_load.py --tiny          # a smoke run: one 2-step run per clock, no busy loop

Starts `--busy` processes running `while True: pass` (each takes one core), then
runs the baseline train.py (training only, no evaluation) --runs times on each
clock, alternating wall/cpu, and prints the training steps per run and their
spread. Under the wall clock the other processes take training steps away; under
the cpu clock the run waits for the CPU without being charged, so it trains the
same amount (it takes longer instead). Run it once with --busy 0 for reference.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpt"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny  # noqa: E402

from mcp_server.loop.workspace import EVALUATOR_PY  # noqa: E402  (prepare.py and its frozen siblings)


def steps_of(ws: Path, clock: str, budget: float, seed: int, extra: tuple[str, ...] = ()) -> tuple[int, float, float]:
    lines = ["[benchmark]", f"time_budget = {budget}", f'clock = "{clock}"', *extra]
    (ws / "loopwright.toml").write_text("\n".join(lines) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env.update(LOOPWRIGHT_SEED=str(seed), LOOPWRIGHT_EXPORT_PATH=str(ws / "model.pt2"))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "train.py"], cwd=ws, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stdout[-2000:] + proc.stderr[-2000:])
    block = dict(line.split(":", 1) for line in proc.stdout.split("\n---\n")[-1].strip().splitlines())
    return int(block["num_steps"]), float(block["cpu_seconds"]), time.monotonic() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--busy", type=int, default=1, help="busy-loop processes competing for the CPU (default 1)")
    p.add_argument("--budget", type=float, default=30.0)
    p.add_argument("--tiny", action="store_true", help="a smoke run: one 2-step run per clock on a tiny corpus, "
                   "no busy loop (seconds; the figures mean nothing)")
    args = p.parse_args()
    if args.tiny:
        args.runs, args.busy, args.budget = 1, 0, tiny.BENCHMARK["time_budget"]
    tmp = Path(tempfile.mkdtemp(prefix="lw-clock-"))
    busy = []
    try:
        ws = tmp / "ws"
        ws.mkdir()
        for name in (*EVALUATOR_PY, "train.py"):
            shutil.copyfile(BENCH / name, ws / name)
        extra: tuple[str, ...] = ()
        if args.tiny:
            (ws / "train.py").write_text(tiny.tiny_train((ws / "train.py").read_text()))
            extra = (f'corpus = "{tiny.tiny_corpus(tmp / "corpus")}"',)
            (ws / "loopwright.toml").write_text("\n".join(["[benchmark]", *extra]) + "\n")
        subprocess.run([sys.executable, "prepare.py", "prepare"], cwd=ws, check=True, capture_output=True)
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        print(f"# {time.strftime('%Y-%m-%d %H:%M')} {args.busy} busy loop(s); load {os.getloadavg()[0]:.2f}",
              flush=True)
        steps: dict[str, list[int]] = {"wall": [], "cpu": []}
        for i in range(args.runs):
            for clock in ("wall", "cpu"):
                n, cpu, wall = steps_of(ws, clock, args.budget, seed=0, extra=extra)
                steps[clock].append(n)
                print(f"{clock:4s} run {i + 1}: {n} steps, {cpu:.1f} CPU s, {wall:.1f} s wall, "
                      f"load {os.getloadavg()[0]:.2f}", flush=True)
        for clock, xs in steps.items():
            mean = statistics.fmean(xs)
            print(f"{clock}: steps {xs}, mean {mean:.1f}, range {min(xs)}-{max(xs)} "
                  f"({(max(xs) - min(xs)) / mean * 100:.0f} % of the mean)")
    finally:
        for b in busy:
            b.kill()
            b.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
