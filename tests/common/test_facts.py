"""One home per shared fact (mcp_server/common/): every copy that cannot import it agrees with it,
and the shared lock / process-group helpers do what their callers rely on."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mcp import Client

from mcp_server.common.facts import HOOK_MATCHER, MCP_SERVER, MCP_TOOLS
from mcp_server.common.locks import FileLock
from mcp_server.common.procs import group_alive, kill_group, kill_group_now

from conftest import make_workspace

REPO = Path(__file__).resolve().parents[2]


def test_plugin_hooks_json_uses_the_one_matcher():
    cfg = json.loads((REPO / "hooks" / "hooks.json").read_text())["hooks"]
    assert [g["matcher"] for g in cfg["PreToolUse"]] == [HOOK_MATCHER]


def test_workspace_client_configs_use_the_one_matcher_and_server_name(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus)
    claude = json.loads((ws.root / ".claude" / "settings.json").read_text())
    assert [g["matcher"] for g in claude["hooks"]["PreToolUse"]] == [HOOK_MATCHER]
    assert list(json.loads((ws.root / ".mcp.json").read_text())["mcpServers"]) == [MCP_SERVER]
    codex = (ws.root / ".codex" / "config.toml").read_text()
    assert f"matcher = {json.dumps(HOOK_MATCHER)}" in codex or f"matcher = '{HOOK_MATCHER}'" in codex


async def test_the_server_registers_exactly_the_named_tools(tmp_path, small_corpus):
    from mcp_server.mcp.server import build_server

    ws = make_workspace(tmp_path / "ws", small_corpus)
    async with Client(build_server(ws.root)) as client:
        names = {t.name for t in (await client.list_tools()).tools}
    assert names == set(MCP_TOOLS)


def test_file_lock_excludes_a_second_holder_until_released(tmp_path):
    path = tmp_path / "sub" / "x.lock"
    held = FileLock(path).try_acquire()
    assert held is not None and path.read_text().strip() == str(os.getpid())
    assert FileLock(path).try_acquire() is None
    child = subprocess.run([sys.executable, "-c", "import sys; from mcp_server.common.locks import FileLock; "
                            f"sys.exit(FileLock({str(path)!r}).try_acquire() is None)"], timeout=60)
    assert child.returncode == 1                     # another process is refused too
    held.release()
    with FileLock(path).try_acquire() as again:
        assert again is not None


def test_kill_group_takes_the_children_too(tmp_path):
    marker = tmp_path / "child.pid"
    proc = subprocess.Popen(["sh", "-c", f"sleep 60 & echo $! > {marker}; wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while not marker.exists() or not marker.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert group_alive(proc.pid)
    kill_group(proc, grace_s=2.0)
    assert proc.returncode is not None and not group_alive(proc.pid)
    child = int(marker.read_text())
    assert not Path(f"/proc/{child}").exists() or Path(f"/proc/{child}/stat").read_text().split(")")[1].split()[0] in "ZX"
    kill_group_now(proc.pid)                         # an already-dead group is no error


def test_one_version_everywhere():
    from mcp_server import __version__

    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'attr = "mcp_server.__version__"' in pyproject
    for plugin in (".claude-plugin", ".codex-plugin"):
        assert json.loads((REPO / plugin / "plugin.json").read_text())["version"] == __version__, plugin
