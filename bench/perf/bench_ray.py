"""The Ray executor (issue 12): scheduling overhead per experiment, Ray vs local, and throughput with 1,
2, 4 workers, through loopwright's real path (Engine.submit_experiment / Engine.wait, the executor from
the workspace's [executor] settings, the sandboxed runner and the frozen evaluator on the worker), on a
real Ray cluster this script starts on this machine (`ray start --head` + one worker node per slot, its
own ports and --temp-dir) and tears down. Also the ledger's write capacity (docs/CLUSTER.md).

    nice -n 19 python bench/perf/bench_ray.py                  # everything, ~15 minutes on 2 cores
    nice -n 19 python bench/perf/bench_ray.py --only ledger    # seconds
    nice -n 19 python bench/perf/bench_ray.py --sleep 10 --waves 2 --repeats 1 --pairs 2   # a quick look
    python bench/perf/bench_ray.py --tiny     # a smoke run: 20 ledger records, one local and one Ray block of 2

train.py is synthetic (bench/perf/synthetic.py): it sleeps --sleep seconds and writes a fixed exported
model, so the 2-core machine measures orchestration, not arithmetic; the evaluator still scores each
model for real (~3 s of CPU: torch's import and the export's load). One seed per candidate
(`baseline_seeds = 1`), no seed rotation: every candidate is one run, paired with the baseline's run.

Overhead: blocks of --pairs experiments, local (the LocalExecutor, parallel 1) and Ray (parallel 1),
alternating L R L R; per experiment, wall time from submit to verdict minus the run's own train and
evaluation wall time (what the executor and the engine add). Target: Ray adds <= 1 s. The first
experiment of every block also pays for the driver's start-up (ray.init, the data into the object store,
cold worker processes): it is reported apart, the medians are over the rest.
Scaling: for N in --workers, --waves x N candidates with N in flight; throughput = candidates / makespan
(first submit to last verdict, the driver's start-up included); ratio = throughput(N) / (N x throughput(1)). Target: >= 0.9. Worker
counts run in the order 1 2 4 4 2 1 ... (--repeats), so a drift in the machine's load hits all alike.

The machine is shared: the load average is recorded around every block, figures are medians.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench" / "perf"))
sys.path.insert(0, str(REPO))

import tiny  # noqa: E402
from raycluster import LocalRayCluster  # noqa: E402
from synthetic import set_variant, synthetic_bench  # noqa: E402

from conftest import make_small_corpus, make_workspace  # noqa: E402

VARIANTS = itertools.count(1)


def load() -> float:
    return round(os.getloadavg()[0], 2)


def config_set(ws_root: Path, key: str, value: str) -> None:
    """`loopwright config set KEY VALUE`, as a person would."""
    p = subprocess.run([sys.executable, "-m", "mcp_server.cli", "config", "-w", str(ws_root), "set", key, value],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"loopwright config set {key} {value} failed: {p.stderr.strip() or p.stdout.strip()}")


# -- the ledger's write capacity ------------------------------------------------------------------------

def ledger_capacity(tmp: Path, n: int = 400, repeats: int = 3) -> dict:
    """Run records per second on the real Ledger (WAL, local disk): insert, seed, result with a 4 KB log
    tail, verdict, an event -- the five commits the engine makes per run."""
    from mcp_server.ledger.store import Ledger

    led = Ledger(tmp / "ledger" / "state.db")
    cid = led.create_campaign("bench", "loopwright/bench", "0" * 40)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            eid = led.start_experiment(cid, "bench run", commit_sha="a" * 40, parent_commit="b" * 40,
                                       role="candidate", seed_set=0)
            led.update_experiment(eid, seed=1000 + eid)
            led.update_experiment(eid, status="ok", finished_at=time.time(), val_bpb=3.4, log_tail="x" * 4000,
                                  metrics_json=json.dumps({"train_wall_s": 1.0, "eval_wall_s": 1.0}))
            led.update_experiment(eid, verdict="discard", verdict_reason="bench")
            led.add_event(cid, "discard", {"experiment_id": eid})
        rates.append(n / (time.perf_counter() - t0))
    led.close()
    return {"run_records_per_s": round(statistics.median(rates)), "commits_per_s": round(5 * statistics.median(rates)),
            "runs_per_repeat": n, "repeats": repeats, "spread_run_records_per_s": [round(r) for r in rates]}


# -- driving the engine -------------------------------------------------------------------------------------

class Driver:
    """Candidates through the engine: edit train.py, submit, wait, score."""

    def __init__(self, ws_root: Path):
        from mcp_server.loop.engine import Engine

        self.root = ws_root
        self.eng = Engine(ws_root)
        self.submitted: dict[int, float] = {}
        self.records: list[dict] = []

    def close(self) -> None:
        from mcp_server.loop import asyncrun

        asyncrun.close_driver(self.eng)   # the next block may use another executor
        self.eng.close()

    def submit(self) -> int:
        variant = next(VARIANTS)   # every candidate a new train.py (an exact repeat is refused)
        set_variant(self.root / "train.py", variant)
        t0 = time.monotonic()
        eid = self.eng.submit_experiment(f"variant {variant}", "synthetic: no effect").experiment_id
        self.submitted[eid] = t0
        return eid

    def wait_one(self) -> list[dict]:
        """Block until at least one submitted experiment is decided; record its timing."""
        # wait(None) returns every decision not handed over yet (also one decided inside a submission)
        res = self.eng.wait(None, timeout=900)
        if res.timed_out:
            raise RuntimeError(f"nothing was decided in 900 s; in flight: {res.in_flight}")
        out = []
        for r in res.results:
            if r.state != "decided" or r.experiment_id not in self.submitted:
                continue
            t1 = time.monotonic()
            row = self.eng.ledger.experiment(r.current_id)
            m = json.loads(row["metrics_json"] or "{}")
            rec = {"id": r.experiment_id, "status": r.status, "verdict": r.verdict,
                   "wall_s": round(t1 - self.submitted.pop(r.experiment_id), 3),
                   "train_wall_s": m.get("train_wall_s"), "eval_wall_s": m.get("eval_wall_s"), "t_done": t1,
                   "worker": m.get("worker")}
            rec["overhead_s"] = (None if rec["train_wall_s"] is None else
                                 round(rec["wall_s"] - rec["train_wall_s"] - (rec["eval_wall_s"] or 0.0), 3))
            self.records.append(rec)
            out.append(rec)
        return out


def prepare_workspace(tmp: Path, sleep_s: float, small: bool = False):
    corpus = tiny.tiny_corpus(tmp / "corpus") if small else make_small_corpus(tmp / "corpus")
    return make_workspace(tmp / "ws", corpus, bench_dir=synthetic_bench(tmp / "bench", sleep_s),
                          benchmark={"eval_tokens": 1024, "time_budget": 30.0, "grace_seconds": 120.0},
                          noise={"baseline_seeds": 1, "rotate_every": 0},
                          budget={"max_experiments": 100_000, "max_hours": 1000.0})


def use_executor(ws_root: Path, kind: str, parallel: int, address: str | None = None) -> None:
    config_set(ws_root, "executor.kind", kind)
    config_set(ws_root, "executor.parallel", str(parallel))
    if address:
        config_set(ws_root, "executor.address", f'"{address}"')


def overhead_block(ws_root: Path, kind: str, n: int, address: str) -> dict:
    use_executor(ws_root, kind, 1, address if kind == "ray" else None)
    d = Driver(ws_root)
    l0 = load()
    try:
        for _ in range(n):
            d.submit()
            while d.submitted:
                d.wait_one()
    finally:
        d.close()
    return {"kind": kind, "load": [l0, load()], "records": d.records}


def scaling_block(ws_root: Path, workers: int, waves: int, address: str) -> dict:
    use_executor(ws_root, "ray", workers, address)
    d = Driver(ws_root)
    total = waves * workers
    l0 = load()
    t0 = time.monotonic()
    try:
        sent = 0
        while sent < total or d.submitted:
            while sent < total and len(d.submitted) < workers:
                d.submit()
                sent += 1
            d.wait_one()
    finally:
        d.close()
    makespan = max(r["t_done"] for r in d.records) - t0
    ok = sum(r["status"] == "ok" for r in d.records)
    return {"workers": workers, "candidates": total, "ok": ok, "makespan_s": round(makespan, 2),
            "per_hour": round(total / makespan * 3600, 1), "load": [l0, load()],
            "run_wall_median_s": round(statistics.median(r["wall_s"] for r in d.records), 2),
            "workers_seen": sorted({str(r["worker"]) for r in d.records}),
            "records": [{k: v for k, v in r.items() if k != "t_done"} for r in d.records]}


def median(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sleep", type=float, default=20.0, help="seconds each synthetic train.py sleeps (default 20)")
    ap.add_argument("--workers", default="1,2,4", help="worker counts for the scaling part (default 1,2,4)")
    ap.add_argument("--waves", type=int, default=3, help="candidates per worker in a scaling block (default 3)")
    ap.add_argument("--repeats", type=int, default=2, help="passes over the worker counts (default 2)")
    ap.add_argument("--pairs", type=int, default=5, help="experiments per overhead block, 2 blocks per executor; the "
                    "first of each block is the driver's start-up, reported apart (default 5)")
    ap.add_argument("--only", choices=["ledger", "overhead", "scaling"], action="append",
                    help="run only these parts (repeatable)")
    ap.add_argument("--json", default="bench_ray.json", help="where the figures go (default ./bench_ray.json)")
    ap.add_argument("--tiny", action="store_true", help="a smoke run: 20 ledger records, then one local and one Ray "
                    "block of 2 experiments sleeping 0.1 s on a one-worker cluster (the figures mean nothing)")
    args = ap.parse_args()
    if args.tiny:
        args.sleep, args.pairs, args.only = 0.1, 2, args.only or ["ledger", "overhead"]
    # SIGTERM (and SIGINT, ignored in a background job otherwise): unwind, so the Ray cluster is torn down
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(143))
    try:
        workers = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        ap.error(f"--workers {args.workers!r}: a comma-separated list of positive integers, e.g. 1,2,4")
    if not workers or min(workers) < 1 or args.waves < 1 or args.repeats < 1 or args.pairs < 2 or args.sleep <= 0:
        ap.error("--workers, --waves, --repeats must be positive, --pairs at least 2 and --sleep > 0")
    parts = set(args.only or ["ledger", "overhead", "scaling"])
    own_home = None if os.environ.get("LOOPWRIGHT_HOME") else tempfile.mkdtemp(prefix="lwbench-home-")
    if own_home:   # the workspace's state directory: a private one, removed at the end
        os.environ["LOOPWRIGHT_HOME"] = own_home
    try:
        return run(args, parts, workers)
    finally:
        if own_home:
            shutil.rmtree(own_home, ignore_errors=True)


def run(args, parts: set, workers: list[int]) -> int:
    out: dict = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv), "cpus": os.cpu_count(),
                 "sleep_s": args.sleep, "load_start": load(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    with tempfile.TemporaryDirectory(prefix="lwbench-") as d:
        tmp = Path(d)
        if "ledger" in parts:
            out["ledger"] = ledger_capacity(tmp, 20, 1) if args.tiny else ledger_capacity(tmp)
            print(f"ledger: {out['ledger']['run_records_per_s']} run records/s "
                  f"({out['ledger']['commits_per_s']} commits/s), spread {out['ledger']['spread_run_records_per_s']}")
        if parts & {"overhead", "scaling"}:
            ws = prepare_workspace(tmp, args.sleep, args.tiny)
            # the baseline (one run, local) before anything is timed
            use_executor(ws.root, "local", 1)
            from mcp_server.loop.engine import Engine
            with Engine(ws.root) as eng:
                eng.run_experiment("baseline")
            nodes = max(workers) if "scaling" in parts else 1
            env = {"PYTHONPATH": os.pathsep.join([str(REPO)] + ([os.environ["PYTHONPATH"]]
                                                               if os.environ.get("PYTHONPATH") else [])),
                   "LOOPWRIGHT_HOME": os.environ["LOOPWRIGHT_HOME"]}
            with LocalRayCluster(worker_nodes=nodes, cpus_per_node=1, env=env) as cluster:
                out["cluster"] = {"nodes": nodes + 1, "address": cluster.address, "start_s": round(cluster.start_seconds, 1)}
                print(f"ray cluster: head + {nodes} worker node(s) at {cluster.address}, up in "
                      f"{cluster.start_seconds:.1f} s")
                if "overhead" in parts:
                    kinds = ("local", "ray") if args.tiny else ("local", "ray", "local", "ray")
                    blocks = [overhead_block(ws.root, kind, args.pairs, cluster.address) for kind in kinds]
                    out["overhead"] = summarise_overhead(blocks)
                    print_overhead(out["overhead"])
                if "scaling" in parts:
                    order = []
                    for rep in range(args.repeats):
                        order += workers if rep % 2 == 0 else list(reversed(workers))
                    blocks = []
                    for n in order:
                        b = scaling_block(ws.root, n, args.waves, cluster.address)
                        print(f"  {n} worker(s): {b['candidates']} candidates in {b['makespan_s']:.0f} s = "
                              f"{b['per_hour']:.0f}/h (load {b['load'][0]} -> {b['load'][1]})")
                        blocks.append(b)
                    out["scaling"] = summarise_scaling(blocks, workers)
                    print_scaling(out["scaling"])
                import ray  # this process's connection goes before the cluster does
                if ray.is_initialized():
                    ray.shutdown()
    out["load_end"] = load()
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"load average {out['load_start']} -> {out['load_end']}; figures in {args.json}")
    return 0


def summarise_overhead(blocks: list[dict]) -> dict:
    # the first experiment of a block also pays for starting the driver (ray.init, the data into the object
    # store, a cold worker process): reported apart; the steady state is every later one
    by = {k: [r for b in blocks if b["kind"] == k for r in b["records"][1:]] for k in ("local", "ray")}
    first = {k: [b["records"][0] for b in blocks if b["kind"] == k and b["records"]] for k in ("local", "ray")}
    res: dict = {"blocks": [{"kind": b["kind"], "load": b["load"],
                             "records": [{k: v for k, v in r.items() if k != "t_done"} for r in b["records"]]}
                            for b in blocks]}
    for k, recs in by.items():
        if not recs:
            raise SystemExit("--pairs must be at least 2: the first experiment of a block is the driver's start-up")
        res[k] = {"n": len(recs), "overhead_median_s": median(r["overhead_s"] for r in recs),
                  "overhead_range_s": [min(r["overhead_s"] for r in recs), max(r["overhead_s"] for r in recs)],
                  "wall_median_s": median(r["wall_s"] for r in recs),
                  "eval_wall_median_s": median(r["eval_wall_s"] for r in recs),
                  "first_of_block_overhead_s": [r["overhead_s"] for r in first[k]]}
    res["extra_median_s"] = round(res["ray"]["overhead_median_s"] - res["local"]["overhead_median_s"], 3)
    res["extra_wall_median_s"] = round(res["ray"]["wall_median_s"] - res["local"]["wall_median_s"], 3)
    return res


def print_overhead(o: dict) -> None:
    print("\nper-experiment overhead (wall from submit to verdict, minus the run's train + eval wall)")
    print(f"{'executor':<10}{'n':>4}{'median s':>10}{'range s':>16}{'wall median s':>15}{'eval median s':>15}")
    for k in ("local", "ray"):
        r = o[k]
        print(f"{k:<10}{r['n']:>4}{r['overhead_median_s']:>10.3f}{str(r['overhead_range_s']):>16}"
              f"{r['wall_median_s']:>15.2f}{r['eval_wall_median_s']:>15.2f}")
    print(f"Ray adds {o['extra_median_s']:+.3f} s per experiment (median, steady state; end to end "
          f"{o['extra_wall_median_s']:+.3f} s); target <= 1 s. First experiment of each block (driver start-up): "
          f"local {o['local']['first_of_block_overhead_s']}, ray {o['ray']['first_of_block_overhead_s']} s")


def summarise_scaling(blocks: list[dict], workers: list[int]) -> dict:
    single = [b["per_hour"] for b in blocks if b["workers"] == 1]
    base = statistics.median(single) if single else None
    rows = []
    for n in workers:
        mine = [b for b in blocks if b["workers"] == n]
        per_hour = [b["per_hour"] for b in mine]
        rows.append({"workers": n, "per_hour_median": round(statistics.median(per_hour), 1),
                     "per_hour_all": per_hour,
                     "ratio": None if base is None else round(statistics.median(per_hour) / (n * base), 3),
                     "ratio_all": None if base is None else [round(p / (n * base), 3) for p in per_hour],
                     "makespan_s": [b["makespan_s"] for b in mine], "load": [b["load"] for b in mine],
                     "failed": sum(b["candidates"] - b["ok"] for b in mine),
                     # where the time of a run went: the evaluator (CPU: contended by N at once on this
                     # machine) and the rest (executor + engine: orchestration)
                     "eval_wall_median_s": median(r["eval_wall_s"] for b in mine for r in b["records"]),
                     "overhead_median_s": median(r["overhead_s"] for b in mine for r in b["records"])})
    return {"rows": rows, "blocks": blocks, "single_worker_per_hour": base}


def print_scaling(s: dict) -> None:
    print("\nthroughput (synthetic candidates per hour; ratio = per_hour / (N x single-worker), target >= 0.9)")
    print(f"{'workers':>8}{'per hour (median)':>20}{'ratio':>8}{'ratio per block':>24}{'failed':>8}"
          f"{'eval s':>8}{'orchestration s':>17}")
    for r in s["rows"]:
        print(f"{r['workers']:>8}{r['per_hour_median']:>20.1f}{(r['ratio'] or 0):>8.3f}{str(r['ratio_all']):>24}"
              f"{r['failed']:>8}{r['eval_wall_median_s']:>8.2f}{r['overhead_median_s']:>17.3f}")


if __name__ == "__main__":
    sys.exit(main())
