"""The separate-user deployment, for real (issue 23 item 7): the loop as one OS user, the agent as another.

Made here as root with useradd: a loop user that owns the workspace and the state (0700, in its own home), an
agent user in the workspace's group. As the agent, with no client sandbox at all: the held-out splits, the
ledger, the pins, the settings and a corpus on disk cannot be read, the ledger cannot be written, a budget
cannot be raised, no frozen file can be written or deleted -- while train.py can be edited and the MCP tools,
served by the loop's user over loopback HTTP, still run experiments. Skipped unless root.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import FAST, PROBE_ATTEMPT, REPO, hobbled_bench

TOOLS = ("useradd", "userdel", "groupadd", "groupdel", "runuser")


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the separate-user deployment test creates OS users: run it as root (CI does)")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not found (Debian: apt-get install passwd util-linux)")


def _run(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=kw.pop("timeout", 120), **kw)
    if check:
        assert r.returncode == 0, f"{argv}: {r.stdout}\n{r.stderr}"
    return r


def _env(home: str) -> dict:
    """What a login of that user would have, plus this tree first on the path (the test runs its own code)."""
    return {"HOME": home, "USER": Path(home).name, "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}


def _as(user: str, home: str, *argv: str, **kw) -> subprocess.CompletedProcess:
    return _run("runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in _env(home).items()), *argv, **kw)


def _python_reach() -> list[tuple[Path, int]]:
    """The directories on the way to this Python and its packages that other users cannot enter (a Python
    under /root, mode 700): given o+x (enter, not list) for the test, returned to be put back."""
    import mcp
    import torch

    granted = []
    needed = {Path(sys.executable).resolve(), Path(sys.prefix).resolve(), REPO, Path(mcp.__file__).resolve(),
              Path(torch.__file__).resolve()}
    for target in needed:
        for d in reversed(target.parents):
            mode = d.stat().st_mode
            if not mode & stat.S_IXOTH:
                granted.append((d, stat.S_IMODE(mode)))
                os.chmod(d, stat.S_IMODE(mode) | stat.S_IXOTH)
    return granted


INIT = r"""
import json, sys
from mcp_server.loop.setup import init_workspace
from mcp_server.loop.deploy import share_with_group
root, corpus, bench, group, overrides, url = sys.argv[1:7]
# what `loopwright init --agent-group GROUP --mcp-url URL` does, with the tiny benchmark
ws = init_workspace(root, tag="t", corpus=corpus, overrides=json.loads(overrides), bench_dir=bench, mcp_url=url)
share_with_group(ws.root, group, ws.cfg.paths.editable)
print(json.dumps({"state": str(ws.state_dir), "data": str(ws.data_dir), "db": str(ws.db_path)}))
"""

# Everything the agent's shell might try, as the agent's user.
PROBE = r"""
import json, os, sys
state, data, db, ws, corpus = sys.argv[1:6]
""" + PROBE_ATTEMPT + r"""
def append(path):
    with open(path, "a") as f:
        f.write("\n# x\n")
attempt("read val", lambda: open(os.path.join(data, "val.bin"), "rb").read(1))
attempt("read test", lambda: open(os.path.join(data, "test.bin"), "rb").read(1))
attempt("read ledger", lambda: open(db, "rb").read(1))
attempt("read pins", lambda: open(os.path.join(state, "workspace.json")).read(1))
attempt("read settings", lambda: open(os.path.join(state, "settings.toml")).read(1))
attempt("list state home", lambda: os.listdir(os.path.dirname(os.path.dirname(state))))
attempt("read corpus", lambda: os.listdir(corpus))
attempt("write ledger", lambda: append(db))
attempt("plant in state", lambda: open(os.path.join(state, "planted"), "w").close())
for rel in ("prepare.py", "loopwright.toml", "loopwright.lock", ".git/HEAD", ".loopwright/workspace-id"):
    attempt(f"write {rel}", lambda r=rel: append(os.path.join(ws, r)))
attempt("delete prepare.py", lambda: os.unlink(os.path.join(ws, "prepare.py")))
attempt("create in workspace", lambda: open(os.path.join(ws, "sitecustomize.py"), "w").close())
attempt("read prepare.py", lambda: open(os.path.join(ws, "prepare.py")).read(1))
attempt("edit train.py", lambda: append(os.path.join(ws, "train.py")))
print(json.dumps(out))
"""
DENIED = ["read val", "read test", "read ledger", "read pins", "read settings", "list state home", "read corpus",
          "write ledger", "plant in state", "write prepare.py", "write loopwright.toml", "write loopwright.lock",
          "write .git/HEAD", "write .loopwright/workspace-id", "delete prepare.py", "create in workspace"]

# The agent's MCP client: the loop's tools over loopback HTTP, served by the loop's user.
CLIENT = r"""
import asyncio, json, sys
from mcp import Client
url, ws = sys.argv[1:3]
async def main():
    out = {}
    async with Client(url, read_timeout_seconds=600) as c:
        # the probe's edit of train.py is dropped by the loop's revert (git re-creates the file), then a baseline
        for name, args in (("state_read", {}), ("revert", {}), ("run_experiment", {"description": "baseline"})):
            r = await c.call_tool(name, args)
            out[name] = {"error": r.is_error, "result": r.structured_content,
                         "text": [getattr(x, "text", "") for x in r.content]}
    print(json.dumps(out))
asyncio.run(main())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(loop: str, home: str, ws: Path, port: int) -> subprocess.Popen:
    env = [f"{k}={v}" for k, v in _env(home).items()]
    return subprocess.Popen(["runuser", "-u", loop, "--", "env", "-i", *env, sys.executable, "-m", "mcp_server.cli",
                             "serve", "--http", "--host", "127.0.0.1", "--port", str(port), "--workspace", str(ws)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_listening(proc: subprocess.Popen, port: int) -> None:
    """Until the port takes a connection; bounded by attempts, and over at once if the server died."""
    import time

    for _ in range(1200):
        if proc.poll() is not None:
            raise AssertionError(f"the server exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("the server never listened")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_loop_and_agent_as_separate_users(tmp_path, small_corpus):
    _need_root()
    tag = secrets.token_hex(3)
    loop, agent, group = f"lwl{tag}", f"lwa{tag}", f"lwg{tag}"
    base = Path(tempfile.mkdtemp(prefix="lw-deploy-", dir="/var/tmp"))   # not under root's private tmp_path
    granted: list[tuple[Path, int]] = []
    server = None
    try:
        _run("groupadd", group)
        for user in (loop, agent):
            _run("useradd", "--create-home", "--user-group", "--groups", group, "--shell", "/bin/sh", user)
        lhome, ahome = f"/home/{loop}", f"/home/{agent}"
        os.chmod(lhome, 0o700)
        granted = _python_reach()
        os.chmod(base, 0o755)
        # a corpus on disk, the loop's alone; the tiny fixed-step benchmark, readable
        corpus = Path(lhome) / "corpus"
        shutil.copytree(small_corpus, corpus)
        bench = hobbled_bench(base / "bench", tiny=True)
        _run("chown", "-R", f"{loop}:{loop}", str(corpus))
        os.chmod(corpus, 0o700)
        ws = base / "ws"
        ws.mkdir()
        _run("chown", f"{loop}:{loop}", str(ws))

        port = _free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        r = _as(loop, lhome, sys.executable, "-c", INIT, str(ws), str(corpus), str(bench), group, json.dumps(FAST),
                url, timeout=300)
        paths = json.loads(r.stdout.strip().splitlines()[-1])
        state = Path(paths["state"])
        assert state.is_relative_to(Path(lhome) / ".local/share/loopwright/workspaces"), state
        assert stat.S_IMODE(state.stat().st_mode) == 0o700 and state.stat().st_uid == _uid(loop)
        # the agent's clients do not start the loop (as the agent it could not read its state): they reach it
        assert json.loads((ws / ".mcp.json").read_text())["mcpServers"]["loopwright"] == {"type": "http", "url": url}
        assert f'url = "{url}"' in (ws / ".codex" / "config.toml").read_text()

        # as the agent, no sandbox: the state, the data and the frozen files are out of reach; train.py is not
        probe = base / "probe.py"
        probe.write_text(PROBE)
        got = json.loads(_as(agent, ahome, sys.executable, str(probe), str(state), paths["data"], paths["db"],
                             str(ws), str(corpus)).stdout.strip().splitlines()[-1])
        assert [k for k in DENIED if got[k] == "ok"] == [], got
        assert got["read prepare.py"] == got["edit train.py"] == "ok", got
        assert not (ws / "sitecustomize.py").exists() and (ws / "prepare.py").is_file()
        # raising the budget through the CLI fails too (the settings are the loop's)
        r = _as(agent, ahome, sys.executable, "-m", "mcp_server.cli", "config", "set", "budget.max_experiments",
                "999", "-w", str(ws), check=False)
        assert r.returncode != 0, r.stdout + r.stderr

        # the MCP tools, through the server running as the loop's user
        server = _serve(loop, lhome, ws, port)
        _wait_listening(server, port)
        client = base / "client.py"
        client.write_text(CLIENT)
        res = json.loads(_as(agent, ahome, sys.executable, str(client), url, str(ws),
                             timeout=600).stdout.strip().splitlines()[-1])
        assert not res["state_read"]["error"], res["state_read"]
        run = res["run_experiment"]
        assert not run["error"], run
        assert len(run["result"]["baseline"]["samples"]) == 2 and 0 < run["result"]["baseline"]["mean"] < 8, run
        assert not res["revert"]["error"], res["revert"]
        # git re-created train.py on the revert: it is still the agent's to edit (mode and group kept)
        assert "# x" not in (ws / "train.py").read_text()
        st = (ws / "train.py").stat()
        assert stat.S_IMODE(st.st_mode) == 0o664 and st.st_gid == _gid(group), (oct(st.st_mode), st.st_gid)
        again = json.loads(_as(agent, ahome, sys.executable, str(probe), str(state), paths["data"], paths["db"],
                               str(ws), str(corpus)).stdout.strip().splitlines()[-1])
        assert again["edit train.py"] == "ok" and [k for k in DENIED if again[k] == "ok"] == [], again
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, 15)
            server.wait(timeout=60)
        for d, mode in granted:
            os.chmod(d, mode)
        for user in (loop, agent):
            _run("userdel", "-r", user, check=False)
        _run("groupdel", group, check=False)
        shutil.rmtree(base, ignore_errors=True)


def _uid(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_uid


def _gid(group: str) -> int:
    import grp

    return grp.getgrnam(group).gr_gid


def test_init_agent_group_refuses_a_missing_group_before_making_anything(tmp_path):
    ws = tmp_path / "ws"
    r = subprocess.run([sys.executable, "-m", "mcp_server.cli", "init", str(ws), "--agent-group",
                        f"no-such-group-{secrets.token_hex(3)}"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "does not exist: create it (`groupadd" in r.stderr, r.stderr
    assert not ws.exists()
    r = subprocess.run([sys.executable, "-m", "mcp_server.cli", "init", str(ws), "--mcp-url", "http://127.0.0.1:1/mcp"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--mcp-url goes with --agent-group" in r.stderr, r.stderr
    assert not ws.exists()


def test_a_revert_keeps_an_editable_files_group_write(tmp_path):
    """Git re-creates a file it changes with the process's umask: in a shared workspace that would take the
    agent's group write off train.py at the first revert (gitops keeps the mode and group instead)."""
    from mcp_server.loop import gitops

    root = tmp_path / "ws"
    root.mkdir()
    _run("git", "init", "-q", str(root))
    train = root / "train.py"
    train.write_text("LR = 1\n")
    _run("git", "-C", str(root), "add", "train.py")
    _run("git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pin")
    head = gitops.head_sha(root)
    os.chmod(train, 0o664)
    old = os.umask(0o022)
    try:
        for undo in (lambda: gitops.reset_to(root, head), lambda: gitops.checkout_files(root, head, ["train.py"])):
            train.write_text("LR = 2\n")
            undo()
            assert train.read_text() == "LR = 1\n"
            assert stat.S_IMODE(train.stat().st_mode) == 0o664
    finally:
        os.umask(old)
