"""make_executor: the executor the settings ask for (`[executor] kind`), for one workspace."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from mcp_server.executors.base import Executor
from mcp_server.executors.local import LocalExecutor
from mcp_server.loop.config import ExecutorConfig


def make_executor(cfg: ExecutorConfig, data_dir: Path, work_dir: Path, run_dir: Callable[[int], Path],
                  manifest: dict[str, str]) -> Executor:
    """`local`: this machine, `cfg.parallel` at a time, working copies under `work_dir`. `ray`: the cluster
    at `cfg.address` (ray is imported only now; ExecutorError when it is missing or unreachable)."""
    if cfg.kind == "ray":
        from mcp_server.executors.ray import RayExecutor
        return RayExecutor(cfg, data_dir, manifest)
    return LocalExecutor(data_dir, work_dir, run_dir, cfg.parallel)
