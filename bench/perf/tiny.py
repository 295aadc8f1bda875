"""Shared pieces of every bench/perf script's --tiny mode: a smoke run that proves the script still
works end to end (seconds, not minutes). Its figures measure nothing; never quote them.

tests/bench/test_bench_smoke.py runs each script with --tiny and fails when a script lacks the flag.
"""
from __future__ import annotations

import re
import sysconfig
from pathlib import Path

# train.py constants for a smoke run: two optimiser steps and a token-sized quick eval.
TRAIN_CONSTANTS = {"MAX_STEPS": "2", "QUICK_EVAL_TOKENS": "1024"}
# [benchmark] values for a smoke run: the smallest evaluation the config accepts, a short budget.
BENCHMARK = {"time_budget": 10.0, "eval_tokens": 1024, "grace_seconds": 30.0}


def tiny_train(src: str) -> str:
    """train.py's source, made to stop after TRAIN_CONSTANTS["MAX_STEPS"] steps."""
    for name, value in TRAIN_CONSTANTS.items():
        src, n = re.subn(rf"^{name} = [^\s#]+", f"{name} = {value}", src, count=1, flags=re.M)
        if n != 1:
            raise SystemExit(f"train.py has no top-level constant {name}: the --tiny mode needs it")
    return src


def cut_documents(files: list[Path], dest: Path, max_bytes: int) -> Path:
    """A folder of ~3 KB documents cut from `files` in order, until max_bytes (offline, deterministic)."""
    dest.mkdir(parents=True, exist_ok=True)
    total = 0
    for f in files:
        data = f.read_bytes()
        for i in range(0, len(data), 3000):
            (dest / f"{f.parent.name}_{f.name}_{i}.txt").write_bytes(data[i:i + 3000])
        total += len(data)
        if total >= max_bytes:
            break
    return dest


def tiny_corpus(dest: Path, max_bytes: int = 120_000) -> Path:
    """Documents cut from a few standard-library modules: enough for every split."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return cut_documents(sorted((stdlib / "json").glob("*.py")) + sorted((stdlib / "email").glob("*.py")),
                         dest, max_bytes)


def toml_lines(corpus: Path | None = None) -> list[str]:
    """The [benchmark] lines of a smoke run's loopwright.toml (a tiny corpus when one is given)."""
    lines = [f"{k} = {v}" for k, v in BENCHMARK.items()]
    if corpus is not None:
        lines.append(f'corpus = "{corpus}"')
    return lines
