"""The stdio MCP server leaves with its client: when its parent dies or stdin closes mid-call."""
from __future__ import annotations

import subprocess
import sys
import time

from conftest import make_workspace


# -- item 8: the stdio server leaves with its client ----------------------------------------------
def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_server_exits_when_its_parent_dies_though_stdin_stays_open(tmp_path, small_corpus):
    import os
    import signal

    ws = make_workspace(tmp_path / "ws", small_corpus)
    r_fd, w_fd = os.pipe()            # the server's stdin: this test keeps the write end open throughout
    parent_code = ("import subprocess, sys, time\n"
                   f"p = subprocess.Popen([sys.executable, '-m', 'mcp_server.cli', 'serve', '--workspace', "
                   f"{str(ws.root)!r}], stdin={r_fd}, stdout=subprocess.DEVNULL, "
                   f"stderr=open({str(tmp_path / 'server.err')!r}, 'w'))\n"
                   "print(p.pid, flush=True)\n"
                   "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], pass_fds=(r_fd,), stdout=subprocess.PIPE,
                              text=True)
    os.close(r_fd)
    try:
        server = int(parent.stdout.readline())
        deadline = time.time() + 60                     # let it start (it logs its parent)
        while "on stdio for parent process" not in (tmp_path / "server.err").read_text() and time.time() < deadline:
            time.sleep(0.2)
        assert _alive(server)
        os.kill(parent.pid, signal.SIGKILL)             # the client dies without closing the pipe
        parent.wait(10)
        deadline = time.time() + 10
        while _alive(server) and time.time() < deadline:
            time.sleep(0.2)
        assert not _alive(server), "server outlived its parent"
    finally:
        os.close(w_fd)
        if parent.poll() is None:
            parent.kill()


def test_server_exits_when_stdin_closes_during_a_tool_call(tmp_path, small_corpus):
    """A slow call (here a train.py that sleeps) must not keep the server, or its run, alive after EOF."""
    import json

    ws = make_workspace(tmp_path / "ws", small_corpus)
    proc = subprocess.Popen([sys.executable, "-m", "mcp_server.cli", "serve", "--workspace", str(ws.root)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def send(msg):
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        proc.stdin.flush()

    send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    proc.stdout.readline()
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
          "params": {"name": "run_experiment", "arguments": {"description": "baseline"}}})
    deadline = time.time() + 60
    train = []
    while not train and time.time() < deadline:          # wait until the baseline's train.py runs
        time.sleep(0.5)
        train = [p for p in _descendants(proc.pid) if _is_train(int(p))]
    assert train, "train.py never started"
    proc.stdin.close()
    proc.wait(15)
    deadline = time.time() + 10
    while any(_alive(int(p)) for p in train) and time.time() < deadline:
        time.sleep(0.2)
    survivors = {p: open(f"/proc/{p}/cmdline", "rb").read()[:200] for p in train if _alive(int(p))}
    assert not survivors, f"the run outlived the server: {survivors}"


import os  # noqa: E402


def _is_train(pid: int) -> bool:
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return False
    return any(c.endswith(b"train.py") for c in cmd) and _alive(pid)


def _descendants(root: int) -> list[str]:
    parent = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                parent[p] = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]
            except OSError:
                pass
    out, frontier = [], {str(root)}
    while frontier:
        kids = {p for p, pp in parent.items() if pp in frontier}
        out += kids
        frontier = kids
    return out
