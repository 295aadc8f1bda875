"""fastsum's frozen evaluator: checks results.json against the hidden reference; the metric is the CPU
seconds the runner measured outside the sandbox (LOOPWRIGHT_RUN), never a number the run wrote."""

import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "hidden"))


def task_for(seed):
    """The same task harness.py derives (tests/test_solution.py keeps the two in step)."""
    return {"seed": seed, "limit": 200_000 + seed % 1000, "n": 20_000, "period": 3000,
            "offset": 1_000_000 + (seed * 7919) % 100_000}


def verdict():
    import reference

    run = json.loads(Path(os.environ["LOOPWRIGHT_RUN"]).read_text())
    if run.get("exit_code", 0) != 0:
        return {"ok": False, "reason": f"the run exited with code {run['exit_code']}"}
    path = Path(os.environ["LOOPWRIGHT_OUTPUT"], "results.json")
    if not path.is_file():
        return {"ok": False, "reason": "the run wrote no results.json"}
    if path.stat().st_size > 1_000_000:
        return {"ok": False, "reason": "results.json is over 1 MB"}
    try:
        results = json.loads(path.read_text())
        got = results["answer"]
    except (ValueError, KeyError, TypeError) as e:
        return {"ok": False, "reason": f"results.json is not {{'answer': {{...}}}}: {e}"}
    want = reference.answer(task_for(int(run["seed"])))
    if not isinstance(got, dict):
        return {"ok": False, "reason": "results.json's answer is not an object"}
    for key, value in want.items():
        if got.get(key) != value or isinstance(got.get(key), bool):
            return {"ok": False, "reason": f"wrong {key} for seed {run['seed']}: got {got.get(key)!r}, want {value}"}
    cpu = float(run["cpu_seconds"])
    if not math.isfinite(cpu) or cpu < 0:
        return {"ok": False, "reason": f"the runner measured no usable CPU time ({cpu!r})"}
    return {"ok": True, "metric": cpu, "wall_seconds": float(run.get("wall_seconds", 0.0))}


if __name__ == "__main__":
    print(json.dumps(verdict()))
