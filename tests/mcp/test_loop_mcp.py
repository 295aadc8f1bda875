"""The loop through the real MCP client: in process and over a real stdio subprocess.

Each cycle trains real (tiny) models: the workspace's baseline has a deliberately
low learning rate, so restoring the normal one is a real, reproducible gain and
a near-zero learning rate a real loss.
"""
from __future__ import annotations

import os
import sys

import pytest
from mcp import Client, StdioServerParameters

from mcp_server.loop import gitops
from mcp_server.mcp.server import build_server

from conftest import hobbled_bench, make_workspace, set_constant

pytestmark = pytest.mark.slow


async def _call(client, name, args=None, progress=None):
    res = await client.call_tool(name, args or {}, progress_callback=progress)
    assert not res.is_error, res.content
    return res.structured_content


async def _full_cycle(client, ws, progress_log):
    root = ws.root
    train = root / "train.py"
    pinned = gitops.head_sha(root)

    async def on_progress(done, total, message):
        progress_log.append((done, total, message))

    # 1. baseline (2 seeds) on the first call, with progress notifications
    base = await _call(client, "run_experiment", {"description": "baseline"}, on_progress)
    assert base["baseline"]["samples"] and len(base["baseline"]["samples"]) == 2
    assert 0 < base["baseline"]["mean"] < 8
    assert progress_log and "loss" in progress_log[-1][2]

    # 2. a real improvement: restore the normal learning rate -> keep, branch advances
    set_constant(train, "LR", "0.004")
    good = await _call(client, "run_experiment", {"description": "normal learning rate",
                                                   "hypothesis": "LR 2e-4 is far too low"})
    assert good["status"] == "ok" and good["delta_vs_best"] < 0
    # paired: the candidate ran on the baseline's seeds, each run paired with that seed's baseline run
    assert sorted(p["seed"] for p in good["pairs"]) == sorted(base["baseline"]["seeds"])
    assert all(p["d"] < 0 for p in good["pairs"])
    verdict = await _call(client, "score", {})
    assert verdict["verdict"] == "keep", verdict
    good_commit = gitops.head_sha(root)
    assert good_commit != pinned and verdict["best_commit"] == good_commit[:10]

    # 3. a worse change -> discard, tree back at the best commit
    set_constant(train, "LR", "0.0000001")
    bad = await _call(client, "run_experiment", {"description": "tiny learning rate"})
    assert bad["status"] == "ok" and bad["delta_vs_best"] > 0
    verdict = await _call(client, "score", {"experiment_id": bad["experiment_id"]})
    assert verdict["verdict"] == "discard"
    assert gitops.head_sha(root) == good_commit and not gitops.is_dirty(root)
    assert "LR = 0.004" in train.read_text()

    # 4. revert: an uncommitted edit goes away
    set_constant(train, "DEPTH", "1")
    rev = await _call(client, "revert", {})
    assert rev["commit"] == good_commit[:10] and "DEPTH = 1" not in train.read_text()

    # 5. state and notes
    await _call(client, "note", {"text": "LR below 1e-4 does not learn in 24 steps", "kind": "dead_end"})
    state = await _call(client, "state_read", {"view": "summary"})
    assert state["summary"]["kept"] == 1 and state["summary"]["discarded"] == 1
    notes = await _call(client, "state_read", {"view": "notes"})
    assert notes["notes"][0]["kind"] == "dead_end"

    # 6. the budget runs out -> should_stop
    budget = await _call(client, "budget_check")
    runs = 2 + len(good["pairs"]) + len(bad["pairs"])   # budget counts runs: baseline seeds + each pair's run
    assert budget["should_stop"] is False and budget["experiments_used"] == runs
    assert 0 < budget["keep_threshold"] < budget["mde"] and "Detectable effect" in budget["next_step"]
    from mcp_server.loop import settings as setmod
    # an operational setting: the human changes it between calls (`loopwright config set`), out of the agent's reach
    setmod.save(ws.settings_path, setmod.set_value(ws.settings(), "budget.max_experiments", str(runs)))
    budget = await _call(client, "budget_check")
    assert budget["should_stop"] is True and "experiment budget spent" in budget["reasons"][0]
    set_constant(train, "DEPTH", "3")
    res = await client.call_tool("run_experiment", {"description": "one more"})
    assert res.is_error and "budget is spent" in res.content[0].text


async def test_tools_and_their_annotations_in_process(tmp_path, small_corpus):
    # the full cycle runs over real stdio below; the in-process agent tests (test_proposer) drive the rest
    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench", tiny=True))
    async with Client(build_server(ws.root)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert {"run_experiment", "score", "revert", "budget_check", "state_read", "note"} <= set(tools)
        assert tools["state_read"].annotations.read_only_hint is True
        assert tools["run_experiment"].annotations.read_only_hint is False
        assert tools["run_experiment"].output_schema is not None


async def test_full_cycle_over_stdio(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench", tiny=True))
    # the SDK's default environment for a server drops LOOPWRIGHT_HOME (where this test's state lives)
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "mcp_server.cli", "serve", "--workspace", str(ws.root)],
                                   env=dict(os.environ))
    async with Client(params, read_timeout_seconds=600) as client:
        await _full_cycle(client, ws, [])


# A server whose tool handler writes to the process's stdout every way something else in the process can: a
# raw write to fd 1, print() from a background thread (as Ray's driver prints "(raylet) ... marked dead"),
# and a child process that inherits fd 1. Over stdio that fd is the protocol channel.
_NOISY_SERVER = r'''
import os, subprocess, sys, threading
import mcp_server.mcp.server as m
log = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
os.dup2(log, 2)              # the server's stderr, for the test to read
orig = m.build_server
def build(*a, **k):
    s = orig(*a, **k)
    @s.tool()
    def shout() -> str:
        os.write(1, b"raw bytes on fd 1\n")
        t = threading.Thread(target=lambda: print("(raylet) node 0123abcd marked dead", flush=True))
        t.start(); t.join()
        subprocess.run([sys.executable, "-c", "print('a child on the inherited fd 1')"], check=True)
        return "shouted"
    return s
m.build_server = build
m.serve(sys.argv[1])
'''


async def test_stdout_noise_never_reaches_the_protocol_stream(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench", tiny=True))
    script = tmp_path / "noisy_server.py"
    script.write_text(_NOISY_SERVER)
    params = StdioServerParameters(command=sys.executable, args=[str(script), str(ws.root), str(tmp_path / "stderr.log")],
                                   env=dict(os.environ))
    async with Client(params, read_timeout_seconds=120) as client:
        for _ in range(2):
            assert (await client.call_tool("shout", {})).content[0].text == "shouted"
        state = await _call(client, "state_read", {"view": "summary"})      # the session still works
        assert "summary" in state
    err = (tmp_path / "stderr.log").read_text()
    assert "raw bytes on fd 1" in err and "marked dead" in err and "a child on the inherited fd 1" in err, err[-2000:]
