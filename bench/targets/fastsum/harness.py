"""fastsum's frozen harness: derives the task from LOOPWRIGHT_SEED, calls solution.solve, writes results.json."""

import json
import os
import sys
from pathlib import Path


def task_for(seed):
    """The task for a seed (evaluate.py derives the same one; the work, and so the time, barely varies)."""
    return {"seed": seed, "limit": 200_000 + seed % 1000, "n": 20_000, "period": 3000,
            "offset": 1_000_000 + (seed * 7919) % 100_000}


def main():
    out = os.environ.get("LOOPWRIGHT_OUTPUT")
    if not out:
        sys.exit("harness.py: LOOPWRIGHT_OUTPUT is not set (loopwright sets it to the run's output directory)")
    try:
        seed = int(os.environ.get("LOOPWRIGHT_SEED", "0"))
    except ValueError:
        sys.exit(f"harness.py: LOOPWRIGHT_SEED must be an integer, not {os.environ['LOOPWRIGHT_SEED']!r}")
    import solution

    task = task_for(seed)
    answer = solution.solve(dict(task))
    Path(out, "results.json").write_text(json.dumps({"task": task, "answer": answer}))


if __name__ == "__main__":
    main()
