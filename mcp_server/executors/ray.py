"""The Ray executor: each run is one Ray task on a cluster node, in an isolated working copy there.

`ray` is imported only here, only when `[executor] kind = "ray"`: a missing package is a clear error
(`pip install 'loopwright[ray]'`), and so is an unreachable cluster (naming the address; a TCP probe
first, so a dead head fails in seconds rather than Ray's minutes of retries).

What travels: the RunSpec (sources and the pinned evaluator by content, the data manifest) and, once
per driver, each data file put into the object store. A worker keeps data in a content-addressed cache
(<state home>/workspaces/.worker/data/<sha256>, 0700; never the temp dir, which on a cluster is often a node-local
scratch outside the sandbox's default masks), fetched from the object store only when a run needs it
(val/test only for its evaluation) and verified by sha256 before use (workcopy.stage_data checks it
again). The cache and the runs' working copies (.worker/work/) are hidden from train.py
(sandbox.hidden_paths). Resources per run come from the settings
(num_cpus, num_gpus, memory): `num_gpus = 1` is one GPU per experiment, and Ray sets
CUDA_VISIBLE_DEVICES, which the runner's scrubbed environment passes on (nothing else of the worker's
environment reaches train.py).

Faults: tasks run with `max_retries=0`; a worker or node that dies gives the outcome `lost`, and the
engine (not Ray) re-queues it once, so the ledger records what happened. The driver's log stream is off
(`log_to_driver=False`), but Ray still prints some messages ("(raylet) ... marked dead") to the driver's
stdout; the stdio MCP server keeps fd 1 off the protocol channel (mcp/server.py serve()).
"""
from __future__ import annotations

import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional

from mcp_server.executors import workcopy
from mcp_server.executors.base import ExecutorError, RunOutcome, RunSpec
from mcp_server.loop import sandbox
from mcp_server.loop.config import ExecutorConfig

INSTALL_HINT = "pip install 'loopwright[ray]'"
PROBE_TIMEOUT_S = 5.0
CLIENT_CONNECT_ATTEMPTS = 2
_connected_to: Optional[str] = None       # the address this process's ray.init used (None: not ours)


def _import_ray() -> Any:
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")    # read by Ray at import (see below)
    try:
        import ray
    except ImportError:
        raise ExecutorError(f'executor.kind = "ray" needs the ray package, which is not installed: {INSTALL_HINT} '
                            '(or go back to this machine: `loopwright config set executor.kind local`)') from None
    # Ray starts a private local cluster on the first API call of a process that is not connected (e.g. after
    # the connection was shut down): the driver must fail its runs as lost instead, not run them elsewhere
    # (measured: a ray:// driver's pump did so, and Ray wrote ~/.ray/auth_token, which then broke `ray start`).
    # Ray reads RAY_ENABLE_AUTO_CONNECT once, at import; when ray was imported before, its module switch
    # (private, Ray 2.x) is set directly.
    auto_init = sys.modules.get("ray._private.auto_init_hook")
    if auto_init is not None and hasattr(auto_init, "enable_auto_connect"):
        auto_init.enable_auto_connect = False  # type: ignore[attr-defined]
    return ray


def _host_port(address: str) -> Optional[tuple[str, int]]:
    if address in ("auto", "local"):
        return None
    hp = address.split("://", 1)[-1]
    host, _, port = hp.rpartition(":")
    return host, int(port)


def probe(address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise ExecutorError, naming the address, when nothing accepts connections there."""
    hp = _host_port(address)
    if hp is None:
        return
    try:
        with socket.create_connection(hp, timeout=timeout):
            pass
    except OSError as e:
        raise ExecutorError(f"the Ray cluster at {address} is unreachable ({e}). Start it (`ray start --head` on "
                            "the head node), fix the address (`loopwright config set executor.address "
                            "HOST:PORT`), or run locally (`loopwright config set executor.kind local`). "
                            "Nothing was run or recorded.") from None


def connect(address: str) -> Any:
    """The ray module, connected to the cluster at `address` (reconnected if this process was attached to
    another one)."""
    ray = _import_ray()
    probe(address)
    hp = _host_port(address)
    global _connected_to
    if ray.is_initialized():
        # by the address we connected with, not the GCS's: a ray:// connection reports the same GCS as a direct
        # one, and a driver asked for one must not silently go on through the other
        if _connected_to == address:
            return ray
        ray.shutdown()
        _connected_to = None
    kwargs: dict[str, Any] = {"address": address, "log_to_driver": False, "namespace": "loopwright",
                              "configure_logging": False}
    if hp is not None and hp[0] in ("127.0.0.1", "localhost"):
        kwargs["_node_ip_address"] = "127.0.0.1"   # a loopback cluster: never the host's public address
    # Ray Client's head spawns a server process per client; that spawn can fail once under load (measured: in
    # the full test suite its process was gone before the proxy checked it): a second try, then the error
    attempts = CLIENT_CONNECT_ATTEMPTS if address.startswith("ray://") else 1
    for attempt in range(1, attempts + 1):
        try:
            ray.init(**kwargs)
            _connected_to = address
            return ray
        except ConnectionAbortedError as e:     # Ray Client: "Initialization failure from server"
            if attempt < attempts:
                time.sleep(1.0)
                continue
            err: Exception = e
        except Exception as e:  # noqa: BLE001 - ConnectionError, RuntimeError, ...: all mean the same to the user
            err = e
        raise ExecutorError(f"cannot connect to the Ray cluster at {address}: {type(err).__name__}: {err}. Check "
                            "that the cluster is up (`ray status --address ...`) and that this machine runs the "
                            "same Ray and Python versions. Nothing was run or recorded.") from None
    raise AssertionError("unreachable")


def _cache_root() -> Path:
    """The worker's private dir (loop/sandbox.py worker_root: under the state home, hidden from every
    sandbox), 0700 from the state home down."""
    root = sandbox.worker_root()
    for d in (root.parent.parent, root.parent, root):
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(d, 0o700)
    return root


def _run_remote(spec: RunSpec, refs: dict[str, Any]) -> RunOutcome:
    """The Ray task (runs on a worker): fetch missing data into the node's cache, verify, run."""
    import ray

    cache = _cache_root() / "data"
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)

    def source(name: str, sha: str) -> Path:
        path = cache / sha
        if path.is_file() and workcopy.sha256_of(path) == sha:
            return path
        data = ray.get(refs[name])
        tmp = cache / f".{sha}.{os.getpid()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return path      # workcopy.stage_data verifies it before use

    node = ray.get_runtime_context().get_node_id() or "?"
    return workcopy.run(spec, source, _cache_root() / "work", worker=f"ray:{node[:12]}:{socket.gethostname()}")


class RayExecutor:
    kind = "ray"

    def __init__(self, cfg: ExecutorConfig, data_dir: Path, manifest: dict[str, str]):
        self.capacity = cfg.parallel
        self.address = cfg.address
        self._ray = connect(cfg.address)
        self._data_dir = Path(data_dir)
        self._manifest = dict(manifest)
        self._refs: Optional[dict[str, Any]] = None
        opts: dict[str, Any] = {"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus, "max_retries": 0}
        if cfg.memory:
            opts["memory"] = cfg.memory
        self._task = self._ray.remote(_run_remote).options(**opts)
        self._pending: dict[int, Any] = {}   # run id -> ObjectRef

    def _data_refs(self) -> dict[str, Any]:
        """Each data file into the object store, once per driver, verified against the manifest first."""
        if self._refs is None:
            refs = {}
            for name, sha in sorted(self._manifest.items()):
                path = self._data_dir / name
                if not path.is_file() or workcopy.sha256_of(path) != sha:
                    raise ExecutorError(f"the driver's data file {path} does not match the pinned manifest "
                                        f"(sha256 {sha[:12]}); run `loopwright doctor`")
                refs[name] = self._ray.put(path.read_bytes())
            self._refs = refs
        return self._refs

    def submit(self, spec: RunSpec) -> int:
        if spec.run_id in self._pending:
            raise ExecutorError(f"run {spec.run_id} is already in flight")
        if dict(spec.data) != self._manifest:
            raise ExecutorError(f"run {spec.run_id}: its data manifest is not this executor's (the pinned data "
                                "changed?); restart the driver")
        self._pending[spec.run_id] = self._task.remote(spec, self._data_refs())
        return spec.run_id

    def wait(self, handles: Optional[Iterable[int]] = None, timeout: Optional[float] = None) -> list[RunOutcome]:
        wanted = list(self._pending) if handles is None else [h for h in handles if h in self._pending]
        if not wanted:
            return []
        refs = [self._pending[h] for h in wanted]
        ready, _ = self._ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:   # and whatever else is done by now
            ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)
        # by the object's id, not the Python object: through Ray Client (ray://) wait() returns new ref objects
        done = {r.hex() for r in ready}
        out = []
        for h in wanted:
            ref = self._pending[h]
            if ref.hex() not in done:
                continue
            del self._pending[h]
            out.append(self._outcome(h, ref))
        return out

    def _outcome(self, handle: int, ref: Any) -> RunOutcome:
        try:
            res = self._ray.get(ref)
        except self._ray.exceptions.RayError as e:
            # WorkerCrashedError, NodeDiedError, ObjectLostError, TaskCancelledError...: nothing is known
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            named = re.search(r"Node ID: ([0-9a-f]{12})", str(e))      # some of Ray's errors say where
            return RunOutcome(handle, "lost", f"the Ray worker running it was lost ({type(e).__name__}: {first[:300]})",
                              worker=f"ray:{named.group(1)}" if named else self._node_of(ref))

        if not isinstance(res, RunOutcome):
            return RunOutcome(handle, "lost", f"the Ray task returned {type(res).__name__}, not an outcome")
        return res

    def _node_of(self, ref: Any) -> str:
        """Where a lost task ran, named as a finished run names its worker ("ray:<node id>:<host>"): the task's
        node from Ray's state API, its host from the node table; the cluster's address when Ray cannot say."""
        try:
            from ray.util.state import get_task

            task = get_task(ref.task_id().hex(), timeout=5)
            if isinstance(task, list):          # one entry per attempt
                task = task[-1] if task else None
            node = getattr(task, "node_id", None) or ""
            if node:
                host = next((n.get("NodeManagerHostname", "") for n in self._ray.nodes() if n.get("NodeID") == node),
                            "")
                return f"ray:{node[:12]}:{host}" if host else f"ray:{node[:12]}"
        except Exception:  # noqa: BLE001 - the state API is optional (it needs the cluster's dashboard)
            pass
        return f"ray:{self.address}"

    def cancel(self, handle: int) -> None:
        ref = self._pending.pop(handle, None)
        if ref is not None:
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already finished or its worker is gone
                pass

    def in_flight(self) -> list[int]:
        return list(self._pending)

    def close(self) -> None:
        for h in list(self._pending):
            self.cancel(h)
        self._refs = None
