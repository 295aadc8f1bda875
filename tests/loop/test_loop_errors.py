"""Bad input gets a clear error and leaves the ledger consistent; crashes leave nothing dirty."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from mcp import Client
from mcp.types import LATEST_PROTOCOL_VERSION

from mcp_server.loop import gitops
from mcp_server.loop.engine import Engine
from mcp_server.mcp.server import build_server

from conftest import alive as _alive
from conftest import make_workspace, record_baseline, set_constant


@pytest.fixture()
def ws(tmp_path, small_corpus):
    return make_workspace(tmp_path / "ws", small_corpus)


def _fake_candidate(eng: Engine, val: float, lr: str = "0.005") -> int:
    set_constant(eng.ws.root / "train.py", "LR", lr)
    sha, _ = gitops.commit_editable(eng.ws.root, ["train.py"], ".loopwright", "candidate")
    c = eng.campaign
    e = eng.ledger.start_experiment(c["id"], "candidate", commit_sha=sha, parent_commit=c["best_commit"])
    eng.ledger.update_experiment(e, status="ok", val_bpb=val, finished_at=time.time())
    return e


async def _err(client, name, args):
    res = await client.call_tool(name, args)
    assert res.is_error, res
    return res.content[0].text


async def test_unknown_ids_wrong_types_and_score_twice(ws):
    eng = Engine(ws.root)
    record_baseline(eng)
    good = _fake_candidate(eng, 1.90)
    async with Client(build_server(ws.root)) as client:
        assert "does not exist" in await _err(client, "score", {"experiment_id": 999})
        assert "does not exist" in await _err(client, "revert", {"to": 999})
        msg = await _err(client, "score", {"experiment_id": "abc"})
        assert "experiment_id" in msg
        assert "view" in await _err(client, "state_read", {"view": "everything"})
        assert "description" in await _err(client, "run_experiment", {})
        assert "kind" in await _err(client, "note", {"text": "x", "kind": "rumour"})
        assert "empty" in await _err(client, "note", {"text": "   "})
        ok = await client.call_tool("score", {"experiment_id": good})
        assert not ok.is_error and ok.structured_content["verdict"] == "keep"
        msg = await _err(client, "score", {"experiment_id": good})
        assert "already scored: keep" in msg
        assert "nothing to score" in await _err(client, "score", {})
    assert eng.ledger.experiment(good)["verdict"] == "keep"
    assert eng.campaign["best_experiment_id"] == good
    assert len(eng.ledger.events(kind="keep")) == 1   # the second score recorded nothing


async def test_run_while_another_runs_is_busy(ws):
    fd = os.open(ws.state_dir / "server.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        async with Client(build_server(ws.root)) as client:
            msg = await _err(client, "run_experiment", {"description": "x"})
            assert "another experiment is running" in msg
            # read-only tools still answer while an experiment runs
            res = await client.call_tool("budget_check", {})
            assert not res.is_error
    finally:
        os.close(fd)
    assert Engine(ws.root).ledger.count_experiments(1) == 0


async def test_frozen_file_edit_is_refused_restored_and_recorded(ws):
    prepare = ws.root / "prepare.py"
    original = prepare.read_bytes()
    prepare.write_bytes(original.replace(b"def ", b"def  ", 1) + b"\nVAL_BPB_OVERRIDE = 0.1\n")
    async with Client(build_server(ws.root)) as client:
        msg = await _err(client, "run_experiment", {"description": "sneaky"})
    assert "integrity check failed" in msg and "prepare.py" in msg
    assert prepare.read_bytes() == original
    eng = Engine(ws.root)
    tamper = eng.ledger.events(kind="tamper")
    assert len(tamper) == 1 and tamper[0]["payload"]["files"] == ["prepare.py"]
    evidence = list((ws.state_dir / "tamper").rglob("prepare.py"))
    assert evidence and b"VAL_BPB_OVERRIDE" in evidence[0].read_bytes()
    assert eng.ledger.count_experiments(1) == 0


async def test_frozen_config_change_is_tamper_but_budget_change_is_not(ws):
    toml = ws.root / "loopwright.toml"
    original = toml.read_text()
    toml.write_text(original.replace("max_experiments = 100", "max_experiments = 7"))
    eng = Engine(ws.root)
    from mcp_server.loop import integrity
    assert integrity.check(eng.ws, eng.campaign["pinned_commit"]) == []
    toml.write_text(original.replace("time_budget = 25.0", "time_budget = 600.0"))
    mism = integrity.check(eng.ws, eng.campaign["pinned_commit"])
    assert [m.kind for m in mism] == ["config"]


async def test_corrupted_config_gives_an_actionable_error(ws):
    (ws.root / "loopwright.toml").write_text("[benchmark\ntime_budget = 6")
    from mcp_server.loop.config import ConfigError
    with pytest.raises(ConfigError, match="not valid TOML"):
        build_server(ws.root)
    proc = subprocess.run([sys.executable, "-m", "mcp_server.cli", "status", "--workspace", str(ws.root)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "not valid TOML" in proc.stderr and "Traceback" not in proc.stderr


async def test_missing_data_is_refused_and_rebuilt(ws):
    (ws.data_dir / "val.bin").unlink()
    async with Client(build_server(ws.root)) as client:
        msg = await _err(client, "run_experiment", {"description": "x"})
    assert "data file is missing" in msg
    assert (ws.data_dir / "val.bin").is_file()   # rebuilt deterministically by the pinned prepare.py
    from mcp_server.loop import integrity
    eng = Engine(ws.root)
    assert integrity.check(eng.ws, eng.campaign["pinned_commit"]) == []


async def test_edits_outside_train_py_are_refused_by_name(ws):
    eng = Engine(ws.root)
    record_baseline(eng)
    set_constant(ws.root / "train.py", "LR", "0.005")
    (ws.root / "helper.py").write_text("X = 1\n")
    with pytest.raises(Exception, match="helper.py"):
        eng.run_experiment("uses a helper module")
    (ws.root / "helper.py").unlink()
    assert not eng.ledger.recent_non_baseline(1, limit=1)


async def test_seed_only_and_exact_repeat_are_refused(ws):
    eng = Engine(ws.root)
    record_baseline(eng)
    src = (ws.root / "train.py").read_text()
    (ws.root / "train.py").write_text(src + "\ntorch.manual_seed(1234)\n")
    with pytest.raises(Exception, match="only touches the random seed"):
        eng.run_experiment("lucky seed")
    (ws.root / "train.py").write_text(src)
    with pytest.raises(Exception, match="identical to the best"):
        eng.run_experiment("nothing changed")


def _rpc(proc, msg):
    proc.stdin.write(json.dumps(msg) + "\n")
    proc.stdin.flush()


@pytest.mark.slow
def test_kill_9_mid_experiment_marks_it_interrupted(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus, benchmark={"time_budget": 60.0})
    proc = subprocess.Popen([sys.executable, "-m", "mcp_server.cli", "serve", "--workspace", str(ws.root)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        _rpc(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": LATEST_PROTOCOL_VERSION, "capabilities": {},
                               "clientInfo": {"name": "test", "version": "0"}}})
        assert json.loads(proc.stdout.readline())["id"] == 1
        _rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _rpc(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                    "params": {"name": "run_experiment", "arguments": {"description": "baseline"}}})
        pid_file = ws.run_dir(1) / "train.pid"
        deadline = time.time() + 60
        while not pid_file.exists() and time.time() < deadline:
            time.sleep(0.2)
        assert pid_file.exists(), "training never started"
        train_pgid = int(pid_file.read_text())
        time.sleep(2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    eng = Engine.open_for_writing(ws.root)   # a restarted writer recovers
    row = eng.ledger.experiment(1)
    assert row["status"] == "interrupted" and "stopped during" in row["reason"]
    assert not gitops.is_dirty(ws.root)
    deadline = time.time() + 10   # SIGKILL is delivered asynchronously
    while _alive(train_pgid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(train_pgid), "the orphaned training process was not killed"
    assert eng.ledger.campaign(1)["tag"] == "t"
    assert eng.state("history").experiments[0].status == "interrupted"
