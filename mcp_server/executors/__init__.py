"""Executors: where one run (train.py on one seed, then the frozen evaluator) happens.

`base.py` is the interface (RunSpec in, RunOutcome out, the Executor protocol); `local.py` runs on
this machine, `ray.py` on a Ray cluster; `workcopy.py` is what both run: an isolated working copy
built from a RunSpec, with the sandboxed runner inside it. Only the engine (the driver) writes the
ledger and git; executors return outcomes.
"""
