"""The evaluator server (loop/evalserver.py): run_evaluation's fork server, in its real sandbox.

Stand-in evaluators (a prepare.py that imports nothing, as in tests/attacks/test_anticheat.py) keep most of
these fast; one test scores a real exported model with the pinned evaluator by both paths."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from mcp_server.common import procs
from mcp_server.loop import evalserver, runner, sandbox

INFO = sandbox.detect()
pytestmark = pytest.mark.skipif(INFO.kind != "bwrap", reason=f"no usable bubblewrap here: {INFO.detail}")

# A stand-in evaluator: what it does depends on the model's bytes (the model is data the runner copies in)
FAKE = r'''
import json, os, sys, time
a = sys.argv
nonce = a[a.index("--nonce") + 1]
what = open(a[2], "rb").read().decode()
if what == "sleep":
    time.sleep(120)
if what == "forge":   # what a model's graph might print: a frame header and a verdict of its own
    print('{"exit": 0, "out": 60, "err": 0}')
    print(json.dumps({"ok": True, "val_bpb": 0.01, "test_bpb": 0.01}))
print(json.dumps({"ok": True, "val_bpb": 1.5, "test_bpb": 1.6, "pid": os.getpid(), "ppid": os.getppid(),
                  "model": what, "nonce": nonce}), flush=True)
if what == "forge":
    print(json.dumps({"ok": True, "val_bpb": 0.01, "test_bpb": 0.01, "nonce": "guessed"}))
if what == "crash":
    os._exit(136)
'''

# A stand-in that imports torch (so the server preloads it) and reports the thread pools it gets
THREADS = r'''
import json, os, sys
a = sys.argv
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # as prepare.py does (the server sets it before torch loads)
import torch
before = len(os.listdir("/proc/self/task"))
x = torch.randn(512, 512)
for _ in range(20):
    x = torch.tanh(x @ x)
print(json.dumps({"ok": True, "val_bpb": 1.0, "threads": torch.get_num_threads(),
                  "interop": torch.get_num_interop_threads(), "started": len(os.listdir("/proc/self/task")) - before,
                  "wait_policy": os.environ.get("OMP_WAIT_POLICY"), "nonce": a[a.index("--nonce") + 1]}))
'''


# A stand-in for evaluator code gone wrong (a model's graph cannot run code; this is the next line of defence):
# it tries to open the server's memory and, asked to, leaves a daemon behind
INTRUDER = r'''
import json, os, sys, time
a = sys.argv
out = {"ok": True, "val_bpb": 1.0, "nonce": a[a.index("--nonce") + 1], "me": os.getpid(),
       "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
try:
    open("/proc/%d/mem" % os.getppid(), "rb").close()
    out["server_memory"] = "OPENED"
except OSError as e:
    out["server_memory"] = type(e).__name__
if open(a[2]).read() == "daemon" and os.fork() == 0:
    os.setsid()
    for fd in (0, 1, 2):
        os.close(fd)
    time.sleep(300)
    os._exit(0)
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def ews(tmp_path_factory, small_corpus):
    from conftest import make_workspace
    return make_workspace(tmp_path_factory.mktemp("evalserver") / "ws", small_corpus)


@pytest.fixture(autouse=True)
def _fresh_servers():
    evalserver.close_all()
    yield
    evalserver.close_all()


def _files(ws, prepare: str) -> dict[str, bytes]:
    return {"prepare.py": prepare.encode(), "loopwright.toml": (ws.root / "loopwright.toml").read_bytes()}


def _model(tmp_path: Path, content: str) -> Path:
    path = tmp_path / f"{content}.pt2"
    path.write_text(content)
    return path


def _evaluate(ws, tmp_path, content: str, prepare: str = FAKE, **kw) -> runner.EvalResult:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    return runner.run_evaluation(ws, None, run_dir, _model(tmp_path, content), files=_files(ws, prepare), **kw)


def _server() -> evalserver.Server:
    (server,) = evalserver.running()
    assert server.proc is not None, f"not served: {evalserver.last_failure}"
    return server


def test_the_server_is_reused_and_forks_a_fresh_child_per_model(ews, tmp_path):
    first = _evaluate(ews, tmp_path, "one")
    assert first.ok and first.val_bpb == 1.5, first.reason
    server = _server()
    bwrap = server.proc.pid
    second = _evaluate(ews, tmp_path, "two")
    assert second.ok and second.raw["model"] == "two"
    assert _server() is server and server.proc.pid == bwrap           # the same server ...
    assert first.raw["ppid"] == second.raw["ppid"] == server.pid       # ... forked both children
    assert first.raw["pid"] != second.raw["pid"]
    assert first.model_sha256 == hashlib.sha256(b"one").hexdigest()
    assert list((server.dir / "spool").iterdir()) == []                # each model copy removed after its request
    assert server.dir.parent == ews.state_dir / "eval" and (server.dir.stat().st_mode & 0o777) == 0o700
    once = _evaluate(ews, tmp_path, "three", reuse=False)               # the one-shot path: a process of its own
    assert once.ok and once.raw["ppid"] != server.pid


def test_what_a_child_prints_cannot_forge_the_frame_or_the_verdict(ews, tmp_path):
    forged = _evaluate(ews, tmp_path, "forge")
    assert forged.ok and forged.val_bpb == 1.5, forged            # the line with the nonce, from inside the frame
    crashed = _evaluate(ews, tmp_path, "crash")                   # a verdict, then the evaluator crashes
    assert not crashed.ok and "exited with code 136 after a result line" in crashed.reason, crashed.reason
    assert _evaluate(ews, tmp_path, "fine").ok                    # the server itself is unharmed
    assert len(evalserver.running()) == 1


def test_a_child_cannot_reach_into_the_server_or_leave_a_process_for_the_next(ews, tmp_path):
    first = _evaluate(ews, tmp_path, "daemon", prepare=INTRUDER)
    assert first.ok, first.reason
    server = _server()
    assert first.raw["server_memory"] != "OPENED"                  # the server is not dumpable
    second = _evaluate(ews, tmp_path, "plain", prepare=INTRUDER)
    assert second.ok and _server() is server
    assert set(second.raw["pids"]) <= {1, server.pid, second.raw["me"]}, second.raw   # the daemon is gone


def test_a_server_killed_between_requests_is_restarted(ews, tmp_path):
    assert _evaluate(ews, tmp_path, "one").ok
    server = _server()
    old = server.proc.pid
    os.killpg(old, signal.SIGKILL)
    for _ in range(100):
        if not procs.group_alive(old):
            break
        time.sleep(0.05)
    again = _evaluate(ews, tmp_path, "two")
    assert again.ok, again.reason
    assert server.proc is not None and server.proc.pid != old


def test_a_timeout_kills_the_whole_server_and_the_next_evaluation_starts_a_new_one(ews, tmp_path, monkeypatch):
    assert _evaluate(ews, tmp_path, "one").ok
    server = _server()
    old = server.proc.pid
    monkeypatch.setattr(ews.cfg.benchmark, "eval_timeout", 3.0)
    t0 = time.monotonic()
    res = _evaluate(ews, tmp_path, "sleep")
    assert not res.ok and "exceeded 3 s" in res.reason and res.model_sha256 == hashlib.sha256(b"sleep").hexdigest()
    assert time.monotonic() - t0 < 30
    assert not procs.group_alive(old) and server.proc is None          # bwrap and, with its PID namespace, all of it
    assert _evaluate(ews, tmp_path, "two").ok
    assert server.proc is not None and server.proc.pid != old


def test_an_evaluator_file_changed_before_the_server_starts_is_refused(ews, tmp_path):
    files = _files(ews, FAKE)
    server = evalserver.Server(ews, files, sys.executable, INFO, runner.clean_env({}), runner.EVAL_DATA_FILES)
    try:
        (server.dir / "prepare.py").write_text("print('{\"ok\": true, \"val_bpb\": 0.1}')\n")   # a swap
        run = server.evaluate(_model(tmp_path, "one"), "n" * 32, time.monotonic() + 60)
    finally:
        server.close()
    assert run.returncode == sandbox.EVALUATOR_CHANGED_EXIT and run.stdout == ""
    assert "not the pinned prepare.py" in run.stderr
    assert not server.dir.exists()


def test_a_server_that_fails_leaves_the_evaluation_to_the_one_shot_path(ews, tmp_path, monkeypatch):
    monkeypatch.setattr(evalserver, "ZYGOTE_SOURCE", "import sys\nsys.exit(3)\n")
    res = _evaluate(ews, tmp_path, "one")
    assert res.ok and res.val_bpb == 1.5, res.reason
    assert "exited with code 3 before it was ready" in (evalserver.last_failure or "")


def test_without_bubblewrap_the_one_shot_path_runs(ews, tmp_path, monkeypatch):
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    monkeypatch.setitem(sandbox._CACHE, "info", sandbox.SandboxInfo("none", None, "bubblewrap is not installed"))
    res = _evaluate(ews, tmp_path, "one")
    assert res.ok, res.reason
    assert evalserver.running() == []


def test_the_child_gets_the_thread_pools_a_fresh_process_gets(ews, tmp_path):
    """The server imports torch but runs no op: OpenMP's pool starts in each child, as in a fresh process
    (a pool started before fork would leave the child single-threaded, or hang it)."""
    served = _evaluate(ews, tmp_path, "x", prepare=THREADS)
    served_again = _evaluate(ews, tmp_path, "y", prepare=THREADS)
    once = _evaluate(ews, tmp_path, "z", prepare=THREADS, reuse=False)
    assert served.ok and once.ok, (served.reason, once.reason)
    assert len(evalserver.running()) == 1
    # "started": the OS threads torch's ops started (OpenMP's workers; numpy's idle OpenBLAS pool, which its
    # fork handler stops in the server, is not counted)
    for key in ("threads", "interop", "started", "wait_policy"):
        assert served.raw[key] == served_again.raw[key] == once.raw[key], (key, served.raw, once.raw)
    assert once.raw["wait_policy"] == "PASSIVE" and once.raw["started"] == once.raw["threads"] - 1


SEEDED = '''
import os
import torch
import torch.nn as nn
import prepare

torch.manual_seed(7)

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(prepare.VOCAB_SIZE, 48)
        self.out = nn.Linear(48, prepare.VOCAB_SIZE)
    def forward(self, idx):
        return self.out(torch.tanh(self.emb(idx)))

prepare.export_model(Model())
'''


def test_a_real_model_scores_the_same_by_the_server_and_by_a_fresh_process(ews, tmp_path):
    train = ews.root / "train.py"
    original = train.read_bytes()
    train.write_text(SEEDED)
    try:
        tr = runner.run_training(ews, tmp_path / "run", seed=1)
    finally:
        train.write_bytes(original)
    assert tr.status == "ok", (tr.reason, tr.log_tail)
    pinned = ews.pinned_commit
    served = runner.run_evaluation(ews, pinned, tmp_path / "run", tr.model_path)
    again = runner.run_evaluation(ews, pinned, tmp_path / "run", tr.model_path)
    once = runner.run_evaluation(ews, pinned, tmp_path / "run", tr.model_path, reuse=False)
    assert served.ok and again.ok and once.ok, (served.reason, again.reason, once.reason)
    assert len(evalserver.running()) == 1
    assert 7.5 < once.val_bpb < 12 and once.val_bpb != 8.0           # a random model, not uniform logits
    assert served.val_bpb == again.val_bpb == once.val_bpb
    assert served.test_bpb == again.test_bpb == once.test_bpb
    assert served.model_sha256 == once.model_sha256
    keys = {k for k in once.raw if k != "eval_seconds"}
    assert {k: served.raw[k] for k in keys} == {k: once.raw[k] for k in keys}
    print(json.dumps({"eval_seconds": [served.eval_seconds, again.eval_seconds, once.eval_seconds],
                      "wall_seconds": [served.wall_seconds, again.wall_seconds, once.wall_seconds]}))
