"""Fixed cost per training run (issue 26 item 8): the evaluation and the harness as a share of a run's wall
time, with a one-shot evaluator process per model and with the evaluator server (loop/evalserver.py).
Run with

    python bench/perf/eval_cost.py                 # 6 runs per mode, interleaved: ~5 minutes on 2 cores
    python bench/perf/eval_cost.py --runs 2 --profile
    python bench/perf/eval_cost.py --tiny          # a smoke run: a 2-step model, one run per mode (no figures)

A workspace with `loopwright demo`'s settings (steps clock, 160 steps of the bundled train.py, 8,192 eval
tokens, the default corpus) trains the bundled train.py again and again as baseline runs through the
engine's per-run path (what run_experiment does for each run: sandboxed training, integrity check,
evaluation, ledger), alternating the one-shot evaluator (LOOPWRIGHT_EVAL_SERVER=0) and the server, each
pair on the same seed. Per run, from its ledger row: the run's wall time (started_at..finished_at),
train.py's sandbox (train_wall_s), the evaluation (eval_wall_s; eval_seconds is evaluate_exported itself,
inside the evaluator), the harness (harness_s: the rest). Fixed cost = (evaluation + harness) / run wall.
Medians with min-max per mode; the server's first run, which starts it, is shown apart.

--profile: evaluate_exported's phases, timed in this process (wrappers around what it calls, bench/gpt
unchanged) on a model the runs exported, after importing what the server imports (evalserver.PRELOAD):
a cold call (what a child forked by the server runs) and a warm one, and the modules the cold call still
imported.
"""
from __future__ import annotations

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
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # --profile: as the evaluator (spinning threads on a busy CPU)

MODES = ("one-shot", "server")


def spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):6.2f} ({min(xs):.2f}-{max(xs):.2f})"


def demo_workspace(root: Path, seed: int):
    from mcp_server.cli.demo import DEMO_TIME_BUDGET, demo_overrides
    from mcp_server.loop.config import DEFAULT_CORPUS
    from mcp_server.loop.setup import init_workspace

    return init_workspace(root, tag="evalcost", corpus=DEFAULT_CORPUS, time_budget=DEMO_TIME_BUDGET,
                          overrides=demo_overrides(4, 1, seed))


def tiny_workspace(root: Path):
    """--tiny: a 2-step tiny model on a tiny corpus (tests/conftest.py's helpers, bench/perf/tiny.py)."""
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tiny

    from conftest import hobbled_bench, make_workspace

    corpus = tiny.tiny_corpus(root.parent / "corpus")
    bench = hobbled_bench(root.parent / "bench", max_steps=2, tiny=True)
    return make_workspace(root, corpus, bench_dir=bench, benchmark=dict(tiny.BENCHMARK))


def run_pairs(root: Path, runs: int, first_seed: int) -> list[dict]:
    from mcp_server.loop import evalserver
    from mcp_server.loop.engine import Engine

    out = []
    eng = Engine.open_for_writing(root)
    try:
        c = eng.campaign
        for i in range(runs):
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):   # ABBA: drift of the machine cancels
                os.environ[evalserver.OFF_ENV] = "0" if mode == "one-shot" else "1"
                res = eng._execute(c, f"eval cost {mode} {i}", None, c["best_commit"], c["best_commit"], None,
                                   None, seed=first_seed + i, is_baseline=True)
                row = eng.ledger.experiment(res.experiment_id)
                m = json.loads(row["metrics_json"] or "{}")
                wall = row["finished_at"] - row["started_at"]
                r = {"mode": mode, "i": i, "status": row["status"], "val_bpb": row["val_bpb"], "wall": wall,
                     "train": m.get("train_wall_s"), "eval": m.get("eval_wall_s"), "harness": m.get("harness_s"),
                     "eval_seconds": row["eval_seconds"], "training_seconds": row["training_seconds"],
                     "load": os.getloadavg()[0]}
                r["fixed"] = (r["eval"] + r["harness"]) / wall
                out.append(r)
                print(json.dumps(r), flush=True)
    finally:
        eng.close()
        os.environ.pop(evalserver.OFF_ENV, None)
        evalserver.close_all()
    return out


def report(rows: list[dict]) -> None:
    first_served = next((r for r in rows if r["mode"] == "server"), None)
    print("\nper run, median (min-max) in seconds:")
    print(f"{'mode':10} {'n':>2} {'run wall':>20} {'train.py':>20} {'evaluation':>20} {'eval_seconds':>20} "
          f"{'harness':>20} {'fixed share':>20}")
    for mode in MODES:
        rs = [r for r in rows if r["mode"] == mode and r["status"] == "ok" and r is not first_served]
        print(f"{mode:10} {len(rs):>2} {spread([r['wall'] for r in rs]):>20} {spread([r['train'] for r in rs]):>20} "
              f"{spread([r['eval'] for r in rs]):>20} {spread([r['eval_seconds'] for r in rs]):>20} "
              f"{spread([r['harness'] for r in rs]):>20} "
              f"{spread([100 * r['fixed'] for r in rs]).replace(' (', ' % ('):>20}")
    if first_served:
        print(f"the server's first run (starts it): wall {first_served['wall']:.2f} s, evaluation "
              f"{first_served['eval']:.2f} s, fixed share {100 * first_served['fixed']:.1f} %")
    pairs = {}
    for r in rows:
        pairs.setdefault(r["i"], {})[r["mode"]] = r["val_bpb"]
    same = all(p.get("one-shot") == p.get("server") for p in pairs.values())
    print(f"val_bpb of each seed identical in both modes: {same}")
    print(f"load average during the runs: {min(r['load'] for r in rows):.2f}-{max(r['load'] for r in rows):.2f}")


def profile(ws) -> None:
    """evaluate_exported piece by piece (wrappers around what it calls; the frozen files unchanged)."""
    import importlib.util

    models = sorted(Path(ws.runs_dir).glob("*/scratch/*.pt2"))
    if not models:
        print("no exported model to profile")
        return
    from mcp_server.loop.evalserver import PRELOAD

    t0 = time.perf_counter()
    spec = importlib.util.spec_from_file_location("prepare", ws.root / "prepare.py")
    assert spec and spec.loader
    prepare = importlib.util.module_from_spec(spec)
    sys.modules["prepare"] = prepare
    spec.loader.exec_module(prepare)   # imports numpy and torch
    imported = time.perf_counter() - t0
    t0 = time.perf_counter()
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    preloaded = time.perf_counter() - t0
    ev = prepare.sibling("evaluate")
    import torch

    acc: dict[str, float] = {}

    def timed(owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[label] = acc.get(label, 0.0) + time.perf_counter() - t
        setattr(owner, name, wrapper)

    timed(ev, "verify_data", "verify the data (sha256)")
    timed(ev.pt2audit, "checked_archive", "audit + rebuild the archive")
    timed(torch.export, "load", "torch.export.load")
    timed(ev.pt2audit, "_audit_graph", "audit the graph")
    timed(torch.export.ExportedProgram, "module", "ep.module()")
    timed(ev, "causality_probe", "causality probe")
    timed(ev, "bpb_sums", "score val + test")
    print(f"\nprepare.py imported (numpy, torch) in {imported:.2f} s, the rest of the server's preload in "
          f"{preloaded:.2f} s; model {models[-1]}, {models[-1].stat().st_size / 1e6:.1f} MB")
    for call in ("cold", "warm"):
        acc.clear()
        before = set(sys.modules)
        t = time.perf_counter()
        res = ev.evaluate_exported(str(models[-1]), str(ws.data_dir))
        total = time.perf_counter() - t
        new = sorted(m for m in set(sys.modules) - before if "." not in m or m.count(".") < 2)
        parts = ", ".join(f"{k} {v:.3f}" for k, v in acc.items())
        print(f"{call}: {total:.3f} s (eval_seconds {res['eval_seconds']}): {parts}; rest "
              f"{total - sum(acc.values()):.3f}")
        if new:
            print(f"  modules first imported by this call: {len(set(sys.modules) - before)}, e.g. {', '.join(new[:25])}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=6, help="runs per mode (default 6)")
    p.add_argument("--seed", type=int, default=9)
    p.add_argument("--dir", type=Path, default=None, help="the workspace (default: a new temp dir)")
    p.add_argument("--profile", action="store_true", help="also time evaluate_exported's phases")
    p.add_argument("--tiny", action="store_true", help="a smoke run: a 2-step model on a tiny corpus, one run per "
                   "mode, and the profile (no figures)")
    args = p.parse_args(argv)
    root = (args.dir or Path(tempfile.mkdtemp(prefix="loopwright-evalcost-")) / "ws").resolve()
    if args.tiny:
        args.runs, args.profile = 1, True
    if not (root / "loopwright.toml").is_file():
        print(f"creating a {'tiny' if args.tiny else 'demo'} workspace in {root}", flush=True)
        tiny_workspace(root) if args.tiny else demo_workspace(root, args.seed)
    from mcp_server.loop.workspace import Workspace

    t0 = time.monotonic()
    rows = run_pairs(root, args.runs, 1001 + 1000 * args.seed)
    print(f"{len(rows)} runs in {time.monotonic() - t0:.0f} s")
    report(rows)
    if args.profile:
        profile(Workspace.find(root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
