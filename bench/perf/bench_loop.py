"""Performance of the loop itself (not of the model): run with

    python bench/perf/bench_loop.py            # all three parts, ~3 minutes on 2 cores
    python bench/perf/bench_loop.py --skip-harness

1. harness overhead per experiment: wall time of run_experiment + score minus the
   wall time of the two child processes (train.py, the evaluator). Target <= 2 s.
2. state_read / budget_check latency with 10,000 experiments in the ledger, as the
   MCP tool handlers run them (engine open + query). Targets p95 <= 50 ms / 20 ms.
3. MCP round trip over a real stdio subprocess (budget_check), p50 / p95.

Machines here are noisy: every figure is a median (or p95) from one run.
"""
import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from conftest import hobbled_bench, make_small_corpus, make_workspace, set_constant  # noqa: E402

N_LEDGER = 10_000
N_CALLS = 200
N_CANDIDATES = 4


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def harness_overhead(tmp: Path) -> dict:
    from mcp_server.loop.engine import Engine

    ws = make_workspace(tmp / "ws", make_small_corpus(tmp / "corpus"), bench_dir=hobbled_bench(tmp / "bench"))
    eng = Engine(ws.root)
    eng.run_experiment("baseline")
    overheads = []
    for i in range(N_CANDIDATES):
        set_constant(ws.root / "train.py", "LR", f"0.00{i + 2}")
        t0 = time.monotonic()
        res = eng.run_experiment(f"lr 0.00{i + 2}")
        if res.status == "ok":
            eng.score(res.experiment_id)
        wall = time.monotonic() - t0
        m = json.loads(eng.ledger.experiment(res.experiment_id)["metrics_json"])
        overheads.append(wall - m["train_wall_s"] - m["eval_wall_s"])
    return {"harness_overhead_median_s": round(statistics.median(overheads), 3),
            "harness_overhead_max_s": round(max(overheads), 3), "runs": len(overheads)}


def fill_ledger(eng, n: int) -> None:
    c = eng.campaign
    now = time.time()
    rows = []
    for i in range(n):
        rows.append((c["id"], f"experiment {i}: tweak {i % 37}", "ok",
                     "keep" if i % 50 == 0 else "discard", 2.0 - i * 1e-6, 1000 + i, "abcdef", now - 30, now,
                     int(i < 3)))
    with eng.ledger.tx() as cx:
        cx.executemany("INSERT INTO experiments(campaign_id, description, status, verdict, val_bpb, seed, "
                       "commit_sha, started_at, finished_at, is_baseline) VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
        for i in range(200):
            cx.execute("INSERT INTO notes(campaign_id, kind, text, created_at) VALUES (?,?,?,?)",
                       (c["id"], "lesson", f"note {i}", now))


def ledger_latency(tmp: Path) -> dict:
    from mcp_server.loop.engine import Engine

    ws = make_workspace(tmp / "ws", make_small_corpus(tmp / "corpus"))
    eng = Engine(ws.root)
    fill_ledger(eng, N_LEDGER)
    eng.close()
    out = {}
    for name, fn in {
        "state_read_summary": lambda e: e.state("summary"),
        "state_read_history": lambda e: e.state("history", 20),
        "state_read_tried": lambda e: e.state("tried", 100),
        "state_read_noise": lambda e: e.state("noise"),
        "budget_check": lambda e: e.budget(),
    }.items():
        times = []
        for _ in range(N_CALLS):
            t0 = time.perf_counter()
            e = Engine(ws.root)   # exactly what a reading tool call does
            fn(e)
            e.close()
            times.append((time.perf_counter() - t0) * 1000)
        out[name] = {"p50_ms": round(pct(times, 50), 2), "p95_ms": round(pct(times, 95), 2)}
    return out


async def stdio_round_trip(tmp: Path) -> dict:
    from mcp import Client, StdioServerParameters

    ws = make_workspace(tmp / "ws2", make_small_corpus(tmp / "corpus2"))
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "mcp_server.cli", "serve", "--workspace", str(ws.root)])
    t0 = time.perf_counter()
    async with Client(params) as client:
        startup = time.perf_counter() - t0
        times = []
        for _ in range(N_CALLS):
            t1 = time.perf_counter()
            res = await client.call_tool("budget_check", {})
            assert not res.is_error
            times.append((time.perf_counter() - t1) * 1000)
    return {"server_startup_s": round(startup, 2), "budget_check_p50_ms": round(pct(times, 50), 2),
            "budget_check_p95_ms": round(pct(times, 95), 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-harness", action="store_true")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if not args.skip_harness:
            results["harness"] = harness_overhead(tmp / "h")
        results["ledger_10k"] = ledger_latency(tmp / "l")
        results["stdio"] = asyncio.run(stdio_round_trip(tmp / "s"))
    print(json.dumps(results, indent=2))
    lat = results["ledger_10k"]
    worst_state = max(v["p95_ms"] for k, v in lat.items() if k.startswith("state_read"))
    print(f"state_read p95 {worst_state:.1f} ms (target <= 50), budget_check p95 "
          f"{lat['budget_check']['p95_ms']:.1f} ms (target <= 20)")
    if "harness" in results:
        print(f"harness overhead median {results['harness']['harness_overhead_median_s']:.2f} s (target <= 2)")


if __name__ == "__main__":
    main()
