"""Time from spawning the loopwright MCP server to its tools/list answer (what a client waits for).

    python bench/perf/server_start.py --workspace WS [--runs 5] [--cmd "loopwright serve"]
    python bench/perf/server_start.py --tiny      # a smoke run: one start on a scratch workspace (tiny corpus)

Prints the median and each run's wall seconds, the median CPU seconds of the server process, and which heavy modules the server imported.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny  # noqa: E402

HEAVY = ("torch", "matplotlib", "slack_sdk", "jira", "numpy", "uvicorn", "starlette", "rich", "git")


def rpc(proc, msg: dict) -> None:
    proc.stdin.write((json.dumps(msg) + "\n").encode())
    proc.stdin.flush()


def one(cmd: list[str], env: dict) -> tuple[float, float, int]:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    rpc(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                          "clientInfo": {"name": "bench", "version": "0"}}})
    proc.stdout.readline()
    rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    rpc(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    n = len(json.loads(proc.stdout.readline())["result"]["tools"])
    dt = time.perf_counter() - t0
    proc.stdin.close()
    proc.wait(10)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the whole server process (start-up to exit right after tools/list): steadier than
    # wall time on a shared machine
    return dt, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workspace", help="the workspace the server opens (required unless --tiny)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cmd", default=f"{sys.executable} -m mcp_server.cli serve")
    ap.add_argument("--tiny", action="store_true", help="a smoke run: one start on a scratch workspace made here "
                    "(tiny corpus, state in a temp dir; the figures mean nothing)")
    a = ap.parse_args()
    if a.tiny and not a.workspace:
        from mcp_server.loop.setup import init_workspace

        tmp = Path(tempfile.mkdtemp(prefix="lw-server-start-"))
        os.environ["LOOPWRIGHT_HOME"] = str(tmp / "home")
        a.workspace = str(init_workspace(tmp / "ws", tag="bench", corpus=str(tiny.tiny_corpus(tmp / "corpus"))).root)
        a.runs = 1
    if not a.workspace:
        ap.error("--workspace WS is required (a workspace made by `loopwright init`), or pass --tiny")
    env = {**os.environ, "LOOPWRIGHT_WORKSPACE": a.workspace}
    cmd = shlex.split(a.cmd) + ["--workspace", a.workspace]
    times, cpus = [], []
    for _ in range(a.runs):
        dt, cpu, n = one(cmd, env)
        times.append(dt)
        cpus.append(cpu)
    probe = subprocess.run([sys.executable, "-c", "import sys, mcp_server.mcp.server as s; "
                            f"s.build_server({a.workspace!r}, strict=False); "
                            f"print([m for m in {HEAVY!r} if m in sys.modules])"],
                           capture_output=True, text=True)
    print(f"tools/list after {statistics.median(times):.2f} s median ({', '.join(f'{t:.2f}' for t in times)}); "
          f"CPU {statistics.median(cpus):.2f} s median; {n} tools; heavy modules imported by build_server: {probe.stdout.strip() or probe.stderr[-300:]}")
    print("load:", open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else "?")


if __name__ == "__main__":
    main()
