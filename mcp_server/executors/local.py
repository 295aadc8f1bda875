"""The local executor: runs on this machine, `parallel` at a time (threads driving sandboxed processes).

Each run gets its own working copy (executors/workcopy.py) under the state directory's `work/`, so the
data files are hard links, not copies; its outcome is also written to the run's directory in the state
directory (runs/<id>/outcome.json) the moment it is known, so a driver that restarts records it.
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

from mcp_server.executors import workcopy
from mcp_server.executors.base import ExecutorError, RunOutcome, RunSpec


class LocalExecutor:
    kind = "local"

    def __init__(self, data_dir: Path, work_dir: Path, run_dir: Callable[[int], Path], parallel: int = 1):
        if parallel < 1:
            raise ExecutorError(f"executor.parallel = {parallel}: it must be at least 1")
        self.capacity = parallel
        self._source = workcopy.dir_source(data_dir)
        self._work = work_dir
        self._run_dir = run_dir
        self._pool = cf.ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="loopwright-run")
        self._runs: dict[int, tuple[cf.Future, threading.Event]] = {}   # run id -> (its future, its cancel)

    def submit(self, spec: RunSpec) -> int:
        if spec.run_id in self._runs:
            raise ExecutorError(f"run {spec.run_id} is already in flight")
        cancel = threading.Event()
        future = self._pool.submit(workcopy.run, spec, self._source, self._work,
                                   outcome_dir=self._run_dir(spec.run_id), cancel=cancel)
        self._runs[spec.run_id] = (future, cancel)
        return spec.run_id

    def wait(self, handles: Optional[Iterable[int]] = None, timeout: Optional[float] = None) -> list[RunOutcome]:
        wanted = list(self._runs) if handles is None else [h for h in handles if h in self._runs]
        if not wanted:
            return []
        deadline = None if timeout is None else time.monotonic() + timeout
        done, _ = cf.wait([self._runs[h][0] for h in wanted], return_when=cf.FIRST_COMPLETED,
                          timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        out = []
        for h in wanted:
            f = self._runs[h][0]
            if f in done:
                del self._runs[h]
                try:
                    out.append(f.result())
                except Exception as e:  # noqa: BLE001 - workcopy.run returns failures; this is a bug guard
                    out.append(RunOutcome(h, "lost", f"the local worker failed: {type(e).__name__}: {e}",
                                          worker="local"))
        return out

    def cancel(self, handle: int) -> None:
        run = self._runs.pop(handle, None)
        if run is not None:
            run[0].cancel()   # a queued run never starts
            run[1].set()      # a running one: its sandbox is killed within a fraction of a second; outcome dropped

    def in_flight(self) -> list[int]:
        return list(self._runs)

    def close(self) -> None:
        for h in list(self._runs):
            self.cancel(h)
        self._pool.shutdown(wait=False, cancel_futures=True)
