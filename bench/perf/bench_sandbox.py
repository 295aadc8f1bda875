"""What the OS sandbox costs an honest train.py: tokens/s with and without bubblewrap.

    python bench/perf/bench_sandbox.py                 # 6 pairs, 150 steps each
    python bench/perf/bench_sandbox.py --pairs 3 --steps 60 --out sandbox.json
    python bench/perf/bench_sandbox.py --tiny          # a smoke run: one pair of 2-step runs, one probe round

Both arms go through the loop's own runner (mcp_server.loop.runner.run_training) on one fresh
workspace of the bundled benchmark: the sandboxed arm exactly as the loop runs it, the other with
the sandbox switched off as --unsafe-no-sandbox would. Training is bounded by a step count
(MAX_STEPS, same work in both arms; the time budget is only a cap). Arms are interleaved (off, on,
off, on, ...) and the order within a pair alternates, so drifts in machine load hit both.

Figure of merit: tokens/s of training = total_tokens / training_seconds, as train.py reports them
(the training loop only, so the sandbox's start-up is measured separately: the runner's wall time
minus train.py's own total_seconds, per run). The summary gives the median and the spread (min..max)
per arm, the median of the paired ratios on/off, and the load average before and after.

On a machine shared with other jobs the wall-clock figures move by tens of percent from run to
run, whatever the arm. So a second, load-robust measurement follows (skip with --no-probe): a
compute probe (1-thread 256x256 fp32 matmuls for 3 s, the kind of work train.py does) started bare
and in the same sandbox, interleaved, reporting matmuls per CPU-second of the probe process (what
the sandbox could slow down: the work per unit of CPU it gets) and per wall second.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny  # noqa: E402

from mcp_server.loop import runner, sandbox  # noqa: E402
from mcp_server.loop.setup import init_workspace  # noqa: E402


def small_corpus(dest: Path, max_bytes: int = 2_000_000) -> Path:
    """Standard-library sources cut into ~3 KB documents."""
    import sysconfig
    return tiny.cut_documents(sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")), dest, max_bytes)


def one_run(ws, run_dir: Path, sandboxed: bool, seed: int) -> dict:
    saved = dict(sandbox._CACHE)
    if not sandboxed:   # what --unsafe-no-sandbox does where no sandbox can be made
        sandbox._CACHE["info"] = sandbox.SandboxInfo("none", None, "switched off for the benchmark")
        os.environ[sandbox.UNSAFE_ENV] = "1"
    try:
        tr = runner.run_training(ws, run_dir, seed)
    finally:
        sandbox._CACHE.clear()
        sandbox._CACHE.update(saved)
        os.environ.pop(sandbox.UNSAFE_ENV, None)
    if tr.status != "ok":
        raise SystemExit(f"run failed ({tr.status}: {tr.reason}):\n{tr.log_tail}")
    s = tr.summary
    return {"sandbox": tr.sandbox, "tokens_per_s": s["total_tokens_M"] * 1e6 / s["training_seconds"],
            "training_seconds": s["training_seconds"], "steps": s["num_steps"],
            "startup_overhead_s": tr.wall_seconds - s.get("total_seconds", tr.wall_seconds),
            "wall_s": tr.wall_seconds}


PROBE = """
import time, torch
torch.set_num_threads(1)
a, b = torch.randn(256, 256), torch.randn(256, 256)
t0, c0, n = time.perf_counter(), time.process_time(), 0
while time.perf_counter() - t0 < SECONDS:
    a @ b
    n += 1
print(n / (time.perf_counter() - t0), n / (time.process_time() - c0))
"""


def compute_probe(rounds: int, seconds: float = 3.0) -> dict:
    """Matmuls per wall second and per CPU second, bare and sandboxed, interleaved."""
    import subprocess
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(f"SECONDS = {seconds}\n" + PROBE)
    bare = [sys.executable, f.name]
    boxed = sandbox.build_command(bare, ro_binds=[f.name], env={"HOME": os.path.expanduser("~")})
    out: dict = {"bare": [], "sandboxed": []}
    try:
        for i in range(rounds):
            arms = (("bare", bare), ("sandboxed", boxed))
            for name, cmd in arms if i % 2 == 0 else arms[::-1]:
                wall, cpu = map(float, subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split())
                out[name].append({"per_wall_s": wall, "per_cpu_s": cpu})
    finally:
        os.unlink(f.name)
    med = {arm: {k: statistics.median(r[k] for r in rows) for k in ("per_wall_s", "per_cpu_s")}
           for arm, rows in out.items()}
    return {"rounds": rounds, "median": med,
            "ratio_per_cpu_s": med["sandboxed"]["per_cpu_s"] / med["bare"]["per_cpu_s"],
            "ratio_per_wall_s": med["sandboxed"]["per_wall_s"] / med["bare"]["per_wall_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of train.py (0 = its default)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-probe", action="store_true", help="skip the compute probe")
    ap.add_argument("--probe-rounds", type=int, default=8)
    ap.add_argument("--tiny", action="store_true", help="a smoke run: one pair of 2-step runs on a tiny corpus and one "
                    "0.3 s probe round (seconds; the figures mean nothing)")
    args = ap.parse_args()
    if args.tiny:
        args.pairs, args.steps, args.probe_rounds = 1, 2, 1
    info = sandbox.detect()
    if info.kind != "bwrap":
        raise SystemExit(f"needs bubblewrap: {info.detail}")

    tmp = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
    os.environ.setdefault("LOOPWRIGHT_HOME", str(tmp / "home"))
    try:
        corpus = tiny.tiny_corpus(tmp / "corpus") if args.tiny else small_corpus(tmp / "corpus")
        ws = init_workspace(tmp / "ws", tag="bench", corpus=str(corpus),
                            overrides={"benchmark": {"time_budget": 600.0, "grace_seconds": 120.0}})
        src = (ws.root / "train.py").read_text()
        src, n = re.subn(r"^MAX_STEPS = [^\s#]+", f"MAX_STEPS = {args.steps}", src, count=1, flags=re.M)
        assert n == 1
        if args.tiny:
            src = tiny.tiny_train(src)
        if args.threads:
            src = src.replace("import torch\n", f"import torch\ntorch.set_num_threads({args.threads})\n", 1)
        (ws.root / "train.py").write_text(src)
        load_before = os.getloadavg()
        runs = []
        k = 0
        for p in range(args.pairs):
            order = (False, True) if p % 2 == 0 else (True, False)
            pair = {}
            for sandboxed in order:
                k += 1
                r = one_run(ws, ws.run_dir(k), sandboxed, seed=p)
                pair[sandboxed] = r
                print(f"pair {p} {'sandbox' if sandboxed else 'bare   '}: {r['tokens_per_s']:8.0f} tok/s, "
                      f"{r['steps']:.0f} steps in {r['training_seconds']:.1f} s, start-up overhead "
                      f"{r['startup_overhead_s']:.2f} s, load {os.getloadavg()[0]:.1f}", flush=True)
            runs.append(pair)
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def stats(xs):
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs),
                "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0}

    on = [p[True]["tokens_per_s"] for p in runs]
    off = [p[False]["tokens_per_s"] for p in runs]
    ratios = [p[True]["tokens_per_s"] / p[False]["tokens_per_s"] for p in runs]
    overhead = [p[True]["startup_overhead_s"] - p[False]["startup_overhead_s"] for p in runs]
    result = {"pairs": args.pairs, "steps": args.steps, "threads": args.threads, "sandbox": info.detail,
              "tokens_per_s_sandboxed": stats(on), "tokens_per_s_bare": stats(off),
              "ratio_sandboxed_over_bare": stats(ratios), "slowdown_percent_median": (1 - statistics.median(ratios)) * 100,
              "extra_startup_s": stats(overhead), "loadavg_before": load_before, "loadavg_after": load_after,
              "cpus": os.cpu_count()}
    if not args.no_probe:
        result["compute_probe"] = compute_probe(args.probe_rounds, 0.3 if args.tiny else 3.0)
        result["loadavg_after_probe"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
