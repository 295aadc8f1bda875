"""The bundled targets (bench/targets/fastsum, squeeze) keep the target contract when run by hand:
gate, run with LOOPWRIGHT_SEED/LOOPWRIGHT_OUTPUT, evaluate with LOOPWRIGHT_RUN -> one JSON verdict line."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from mcp_server.loop.workspace import bundled_targets

TARGETS = Path(__file__).resolve().parents[2] / "bench" / "targets"


def _words(cmd):
    words = shlex.split(cmd)
    return [sys.executable, *words[1:]] if words[0] == "python" else words


def _target(tmp_path, name, **constants):
    root = tmp_path / name
    shutil.copytree(TARGETS / name, root)
    cfg = tomllib.loads((root / "loopwright.toml").read_text())
    if constants:
        (editable,) = cfg["paths"]["editable"]
        f = root / editable
        text = f.read_text()
        for k, v in constants.items():
            text, n = re.subn(rf"^{k} = \S+", f"{k} = {v}", text, flags=re.M)
            assert n == 1, k
        f.write_text(text)
    return root, cfg["target"]


def _run(root, target, seed=1001):
    out = root.parent / f"out-{root.name}-{seed}"
    out.mkdir()
    env = {**os.environ, "LOOPWRIGHT_SEED": str(seed), "LOOPWRIGHT_OUTPUT": str(out)}
    proc = subprocess.run(_words(target["run"]), cwd=root, env=env, capture_output=True, text=True, timeout=30)
    return proc, out


def _evaluate(root, target, out, seed=1001, exit_code=0):
    run_file = out.with_suffix(".run.json")
    run_file.write_text(json.dumps({"seed": seed, "exit_code": exit_code, "cpu_seconds": 0.75, "wall_seconds": 0.8}))
    env = {**os.environ, "LOOPWRIGHT_OUTPUT": str(out), "LOOPWRIGHT_RUN": str(run_file)}
    proc = subprocess.run(_words(target["evaluate"]), cwd=root, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


def _gate(root, target):
    return subprocess.run(_words(target["gate"]), cwd=root, capture_output=True, text=True, timeout=30)


def test_bundled_targets_lists_both_with_the_contracts_sections():
    found = bundled_targets()
    assert {"fastsum", "squeeze"} <= set(found)
    for name in ("fastsum", "squeeze"):
        cfg = tomllib.loads((found[name] / "loopwright.toml").read_text())
        assert cfg["target"]["name"] == name and cfg["target"]["direction"] == "minimize"
        for glob in cfg["paths"]["editable"]:
            assert (found[name] / glob).is_file()


def test_fastsum_scores_the_runners_cpu_seconds_and_refuses_a_wrong_answer(tmp_path):
    root, target = _target(tmp_path, "fastsum", SEGMENT=4096, CACHE=4096)   # fast constants keep the test quick
    assert target["noise"] == "repeat"
    assert _gate(root, target).returncode == 0
    proc, out = _run(root, target)
    assert proc.returncode == 0, proc.stderr
    assert _evaluate(root, target, out) == {"ok": True, "metric": 0.75, "wall_seconds": 0.8}
    # the seed decides the task: results written for another seed are wrong
    assert _evaluate(root, target, out, seed=1002)["ok"] is False
    results = json.loads((out / "results.json").read_text())
    results["answer"]["prime_sum"] += 2
    (out / "results.json").write_text(json.dumps(results))
    verdict = _evaluate(root, target, out)
    assert verdict["ok"] is False and "prime_sum" in verdict["reason"]
    (out / "results.json").unlink()
    assert _evaluate(root, target, out) == {"ok": False, "reason": "the run wrote no results.json"}


def test_fastsums_gate_fails_a_solution_with_wrong_answers(tmp_path):
    root, target = _target(tmp_path, "fastsum")
    sol = root / "solution.py"
    sol.write_text(sol.read_text().replace("count += seg.count(1)", "count += seg.count(1) + (lo > 50)"))
    gate = _gate(root, target)
    assert gate.returncode != 0 and "prime_stats" in gate.stderr


def test_fastsums_answers_do_not_depend_on_its_constants(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("fastsum_solution", TARGETS / "fastsum" / "solution.py")
    sol = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sol)
    answers = set()
    for segment, cache in ((1, 1), (7, 3), (16, 2048), (4096, 4096), (10**6, 10**6)):
        sol.SEGMENT, sol.CACHE = segment, cache
        answers.add(tuple(sol.solve({"limit": 5000, "n": 3000, "period": 300, "offset": 10**6}).values()))
    assert len(answers) == 1
    sol.SEGMENT = 0
    with pytest.raises(ValueError, match="SEGMENT must be a positive integer"):
        sol.prime_stats(100)


def test_squeeze_is_deterministic_improves_with_a_better_constant_and_catches_a_bad_stream(tmp_path):
    root, target = _target(tmp_path, "squeeze")
    assert target["noise"] == "deterministic"
    assert _gate(root, target).returncode == 0
    metrics = []
    for seed in (1, 2):
        proc, out = _run(root, target, seed)
        assert proc.returncode == 0, proc.stderr
        verdict = _evaluate(root, target, out, seed)
        assert verdict["ok"] is True
        metrics.append(verdict["metric"])
    assert metrics[0] == metrics[1] == (out / "stream.zz").stat().st_size

    better, btarget = _target(tmp_path / "better", "squeeze", WBITS=10)
    proc, bout = _run(better, btarget)
    assert proc.returncode == 0, proc.stderr
    assert _evaluate(better, btarget, bout)["metric"] < metrics[0] * 0.95

    import zlib

    stream = out / "stream.zz"
    stream.write_bytes(zlib.compress(b"not the corpus"))
    assert "not the corpus" in _evaluate(root, target, out)["reason"]
    stream.write_bytes(zlib.compress(b"\0" * 10_000_000, 9))   # a bomb: inflates far past the corpus
    assert "more than the corpus" in _evaluate(root, target, out)["reason"]
    stream.write_bytes(b"garbage")
    assert "not a zlib stream" in _evaluate(root, target, out)["reason"]


def test_squeeze_refuses_an_out_of_range_constant_clearly(tmp_path):
    root, target = _target(tmp_path, "squeeze", MEM_LEVEL=20)
    assert _gate(root, target).returncode != 0
    proc, out = _run(root, target)
    assert proc.returncode != 0 and "valid: LEVEL" in proc.stderr
    assert _evaluate(root, target, out) == {"ok": False, "reason": "the run wrote no stream.zz"}
