"""A real Ray cluster on this machine, for benchmarks: `ray start --head` plus worker nodes, each with
its own ports and one private --temp-dir, torn down by process group (never `ray stop`, which would
end every Ray cluster this user runs, other people's tests included).

    with LocalRayCluster(worker_nodes=4, cpus_per_node=1) as cluster:
        cluster.address          # "HOST:PORT" for ray.init / [executor] address

Ray 2.60 rewrites `--node-ip-address=127.0.0.1` to the host's own address
(`ray._private.services.resolve_ip_for_localhost`) and its GCS listens on every interface; the
cluster is still this machine's alone, but `address` is what Ray reports, not 127.0.0.1.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from mcp_server.common.procs import group_alive

RAY = [sys.executable, "-m", "ray.scripts.scripts"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRayCluster:
    """head (no task slots unless head_cpus) + `worker_nodes` nodes of `cpus_per_node` logical CPUs."""

    def __init__(self, worker_nodes: int = 1, cpus_per_node: int = 1, gpus_per_node: int = 0, head_cpus: int = 0,
                 env: Optional[dict] = None, nice: bool = True, object_store_mb: int = 256):
        if worker_nodes < 0 or cpus_per_node < 1:
            raise ValueError("worker_nodes must be >= 0 and cpus_per_node >= 1")
        self.worker_nodes, self.cpus_per_node, self.gpus_per_node = worker_nodes, cpus_per_node, gpus_per_node
        self.head_cpus = head_cpus
        # a short path: Ray's unix sockets live under it (108-byte limit)
        self.temp_dir = Path(tempfile.mkdtemp(prefix="lwray-", dir="/tmp"))
        self.port = free_port()
        self.client_port = free_port()      # the head's Ray Client server: ray://127.0.0.1:<client_port>
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        self.nice = nice
        # Ray's default object store is 30 % of free memory per node, in /dev/shm: five nodes on one 24 GiB
        # machine would ask for 36 GiB. A precaution; the runs' data is a few MB.
        self.object_store_bytes = object_store_mb * 1024 * 1024
        self.pgids: list[int] = []
        self.address: Optional[str] = None
        self.start_seconds: Optional[float] = None

    def _ports(self) -> list[str]:
        # every node on one host needs its own agent ports (the defaults collide across clusters)
        return [f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}"]

    def _launch(self, args: list[str]) -> subprocess.Popen:
        cmd = (["nice", "-n", "19"] if self.nice else []) + RAY + [
            "start", *args, "--disable-usage-stats", f"--temp-dir={self.temp_dir}",
            f"--object-store-memory={self.object_store_bytes}", *self._ports()]
        proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.pgids.append(proc.pid)   # Ray's daemons stay in this process group
        return proc

    @staticmethod
    def _finish(proc: subprocess.Popen) -> None:
        out, _ = proc.communicate(timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"`ray start` failed ({proc.returncode}):\n{out[-3000:]}")

    def start(self) -> "LocalRayCluster":
        t0 = time.monotonic()
        try:
            self._finish(self._launch(["--head", "--node-ip-address=127.0.0.1", f"--port={self.port}",
                                       f"--num-cpus={self.head_cpus}", "--num-gpus=0", "--include-dashboard=false",
                                       f"--ray-client-server-port={self.client_port}"]))
            gcs = f"127.0.0.1:{self.port}"
            # the worker nodes one after another: started together (sharing one --temp-dir), 2 of 4 raylets
            # aborted while their object store started (measured, Ray 2.60)
            for _ in range(self.worker_nodes):
                self._finish(self._launch([f"--address={gcs}", "--node-ip-address=127.0.0.1",
                                           f"--num-cpus={self.cpus_per_node}", f"--num-gpus={self.gpus_per_node}"]))
            self.address = self._wait_for_nodes(gcs)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _wait_for_nodes(self, gcs: str, timeout: float = 120.0) -> str:
        """Wait until every node is alive (one process attaches once and polls the node table); the address
        as Ray reports it."""
        code = ("import json, sys, time, ray; ray.init(address=%r, logging_level='ERROR'); "
                "end = time.monotonic() + %r\n"
                "while sum(n['Alive'] for n in ray.nodes()) < %d and time.monotonic() < end: time.sleep(0.2)\n"
                "print(json.dumps([n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']])); "
                "print(ray.get_runtime_context().gcs_address)") % (gcs, timeout, self.worker_nodes + 1)
        deadline = time.monotonic() + timeout
        while True:
            p = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True,
                               timeout=timeout + 60)
            lines = p.stdout.strip().splitlines()
            if p.returncode == 0 and len(lines) >= 2 and lines[-2].count('"') // 2 == self.worker_nodes + 1:
                return lines[-1].strip()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Ray cluster did not come up with {self.worker_nodes + 1} nodes: "
                                   f"{(p.stdout + p.stderr)[-2000:]}")
            time.sleep(1.0)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to every process group, SIGKILL to what is left after `grace` seconds."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            for pgid in self.pgids:
                try:
                    os.killpg(pgid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and any(group_alive(g) for g in self.pgids):
                time.sleep(0.1)
        left = [g for g in self.pgids if group_alive(g)]
        self.pgids = []
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        if left:
            raise RuntimeError(f"Ray process groups {left} survived SIGKILL")

    def __enter__(self) -> "LocalRayCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
