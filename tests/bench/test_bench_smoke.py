"""Every bench/perf script still runs: each one with --tiny (a smoke run at the smallest size that goes
through all of its code, not a measurement) in a temp dir. A new script without --tiny fails here.

The scripts run three at a time (each is mostly waiting on child processes: train.py, the evaluator, a
Ray cluster), started once for the module; each test waits for its own script and checks its output."""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PERF = REPO / "bench" / "perf"
AT_ONCE = 3
TIMEOUT_S = 900   # per script; a loaded 2-core machine makes a two-campaign ablation take minutes


def _is_script(path: Path) -> bool:
    """A file run as a program (it has an `if __name__ == "__main__":` block); the rest are helpers."""
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)


def _adds_tiny(tree: ast.AST) -> bool:
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
               and any(isinstance(a, ast.Constant) and a.value == "--tiny" for a in node.args)
               for node in ast.walk(tree))


def _has_tiny(path: Path) -> bool:
    """The script's argument parser takes --tiny (added by the script or by a sibling module it imports,
    as ablation_outer.py takes ablation_mechanisms.py's campaign options)."""
    tree = ast.parse(path.read_text())
    siblings = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    siblings |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return _adds_tiny(tree) or any(_adds_tiny(ast.parse((path.parent / f"{m}.py").read_text()))
                                   for m in siblings if (path.parent / f"{m}.py").is_file())


SCRIPTS = sorted(p.name for p in PERF.glob("*.py") if _is_script(p))

# What a finished smoke run of each script prints: the part of its report that only the last step writes.
EXPECT = {
    "ablation_mechanisms.py": "| Built-in agent, hill climb only |",
    "ablation_outer.py": "Built-in agent + built-in mechanisms + built-in outer loop",
    "bench_gpt.py": "run 1: tokens/s",
    "bench_loop.py": "harness overhead per run: median",
    "bench_ray.py": "Ray adds",
    "bench_sandbox.py": '"compute_probe"',
    "clock_load.py": "cpu: steps [",
    "dashboard.py": "stalled SSE clients",
    "eval_cost.py": "val_bpb of each seed identical in both modes: True",
    "noise.py": "paired d",
    "pairs.py": "exact, known sigma_d (adaptive-3)",
    "screen.py": "| `LR=0.012` |",
    "seed_decomposition.py": '{"init": 2, "data": 1, "val_bpb"',
    "server_start.py": "tools/list after",
}


@pytest.mark.unit
def test_every_script_has_a_tiny_mode_and_an_expected_line():
    assert len(SCRIPTS) >= 12, SCRIPTS
    lacking = [s for s in SCRIPTS if not _has_tiny(PERF / s)]
    assert not lacking, f"bench/perf scripts without --tiny (add a smoke mode of a few seconds): {lacking}"
    assert set(EXPECT) == set(SCRIPTS), "name the line each script's smoke run must print in EXPECT"


@pytest.mark.unit
def test_the_checks_see_a_script_without_tiny(tmp_path):
    bare = tmp_path / "new_bench.py"
    bare.write_text('import argparse\nap = argparse.ArgumentParser()\nap.add_argument("--runs")\n'
                    'if __name__ == "__main__":\n    ap.parse_args()\n')
    helper = tmp_path / "helper.py"
    helper.write_text("def f():\n    return 1\n")
    assert _is_script(bare) and not _has_tiny(bare)
    assert not _is_script(helper)


@pytest.mark.unit
def test_bench_loop_spreads_a_calls_overhead_over_every_run_it_recorded():
    spec = importlib.util.spec_from_file_location("bench_loop_under_test", PERF / "bench_loop.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    runs = [{"metrics_json": json.dumps({"train_wall_s": 10.0, "eval_wall_s": 3.0})} for _ in range(3)]
    # a 40 s call that ran three 13 s runs: 1 s of the loop's own, a third of a second per run (the old
    # figure took one run's 13 s off the call and called the other two runs' 26 s overhead)
    assert mod.per_run_overhead(40.0, runs) == pytest.approx(1 / 3)
    assert mod.per_run_overhead(13.5, runs[:1]) == pytest.approx(0.5)


@pytest.mark.unit
def test_noise_names_archives_so_the_evaluator_accepts_them():
    sys.path.insert(0, str(PERF))
    try:
        import noise
    finally:
        sys.path.remove(str(PERF))
    import re

    for tag in ("LR=0.012", "EMBED_LR=0.03+LR=0.006", "base", "a b/c"):
        name = noise.file_tag(tag)
        # the evaluator's rule for an archive's root folder (prepare.py): a plain name
        assert re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", name), (tag, name)
    assert noise.file_tag("LR=0.012") != noise.file_tag("LR=0.006")


def _run(script: str, root: Path) -> subprocess.CompletedProcess:
    cwd = root / script.removesuffix(".py")
    (cwd / "tmp").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env.update(TMPDIR=str(cwd / "tmp"), LOOPWRIGHT_HOME=str(cwd / "home"),
               PYTHONPATH=os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])))
    return subprocess.run([sys.executable, str(PERF / script), "--tiny"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def smoke_runs(request, tmp_path_factory):
    """The --tiny run of every script whose test was selected, AT_ONCE at a time, started when the first
    test asks."""
    root = tmp_path_factory.mktemp("bench-smoke")
    selected = [item.callspec.params["script"] for item in request.session.items
                if getattr(item, "callspec", None) and "script" in item.callspec.params]
    pool = ThreadPoolExecutor(AT_ONCE)
    futures: dict[str, Future] = {s: pool.submit(_run, s, root) for s in SCRIPTS if s in selected}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_script_runs_tiny(smoke_runs, script):
    proc = smoke_runs[script].result()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{script} --tiny exited {proc.returncode}:\n{out[-4000:]}"
    assert EXPECT[script] in proc.stdout, f"{script} --tiny did not print {EXPECT[script]!r}:\n{out[-4000:]}"
