"""The client configs a workspace carries must guard the same tools as the plugin's hooks.json."""
import json
from pathlib import Path

import tomllib

from mcp_server.common.facts import HOOK_MATCHER
from mcp_server.loop.setup import client_configs

REPO = Path(__file__).resolve().parent.parent


def test_workspace_hook_matchers_match_the_plugin():
    plugin = json.loads((REPO / "hooks" / "hooks.json").read_text())["hooks"]["PreToolUse"][0]["matcher"]
    assert set(plugin.split("|")) == set(HOOK_MATCHER.split("|"))
    cfgs = client_configs(Path("/ws"), "/usr/bin/python3")
    claude = json.loads(cfgs[".claude/settings.json"])["hooks"]
    assert claude["PreToolUse"][0]["matcher"] == HOOK_MATCHER
    assert {"PreToolUse", "Stop", "SessionStart"} <= set(claude)
    codex = tomllib.loads(cfgs[".codex/config.toml"])
    assert codex["hooks"]["PreToolUse"][0]["matcher"] == HOOK_MATCHER
    server = codex["mcp_servers"]["loopwright"]
    assert server["required"] is True and server["tool_timeout_sec"] >= 600
    assert server["args"][-2:] == ["--workspace", "/ws"]
    mcp = json.loads(cfgs[".mcp.json"])["mcpServers"]["loopwright"]
    assert mcp["command"] == "/usr/bin/python3" and "serve" in mcp["args"]


# -- issue 15 items 4-5 and issue 10 item 5: one wiring per client, the clients' sandboxes on --------
import os  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402

from mcp_server.agents import clients  # noqa: E402

STATE = Path("/state/ws-abc")


def test_plugin_hooks_json_is_generated_by_the_one_home():
    assert json.loads((REPO / "hooks" / "hooks.json").read_text()) == clients.plugin_hooks_json()


def test_plugin_wiring_leaves_no_copies_of_server_or_hooks_but_keeps_the_sandboxes():
    files = clients.workspace_files(Path("/ws"), "/usr/bin/python3", STATE, "plugin")
    assert ".mcp.json" not in files
    claude = json.loads(files[".claude/settings.json"])
    assert "hooks" not in claude and claude["sandbox"]["enabled"] is True
    codex = tomllib.loads(files[".codex/config.toml"])
    assert "mcp_servers" not in codex and "hooks" not in codex
    assert codex["sandbox_mode"] == "workspace-write"
    assert json.loads(files[clients.WIRING_FILE]) == {"claude": "plugin", "codex": "plugin"}


def test_claude_sandbox_is_on_with_no_escape_and_the_state_dir_out_of_reach():
    files = clients.workspace_files(Path("/ws"), "/usr/bin/python3", STATE, "workspace")
    sb = json.loads(files[".claude/settings.json"])["sandbox"]
    assert sb["enabled"] is True and sb["failIfUnavailable"] is True and sb["allowUnsandboxedCommands"] is False
    fs = sb["filesystem"]
    assert fs["allowWrite"] == ["/ws/train.py", str(clients.scratch_dir(STATE))]
    assert not clients.scratch_dir(STATE).is_relative_to("/ws") and clients.scratch_dir(STATE).name.endswith("ws-abc")
    assert str(STATE) in fs["denyWrite"] and str(STATE) in fs["denyRead"]
    assert str(STATE.parent) in fs["denyRead"]                 # every other workspace's state too
    assert {"/ws/prepare.py", "/ws/.git", "/ws/loopwright.toml", "/ws/.loopwright/workspace-id"} <= set(fs["denyWrite"])
    assert tomllib.loads(files[".codex/config.toml"])["sandbox_workspace_write"]["network_access"] is False


def test_a_corpus_on_disk_is_out_of_the_agents_shell_reach_and_a_named_one_adds_nothing():
    mine = client_configs(Path("/ws"), "/usr/bin/python3", STATE, corpus="/data/texts")
    assert "/data/texts" in json.loads(mine[".claude/settings.json"])["sandbox"]["filesystem"]["denyRead"]
    named = client_configs(Path("/ws"), "/usr/bin/python3", STATE, corpus="tinystories")
    assert json.loads(named[".claude/settings.json"])["sandbox"]["filesystem"]["denyRead"] == [str(STATE),
                                                                                              str(STATE.parent)]


def test_launcher_overrides_carry_the_sandbox_server_and_hooks():
    args = clients.codex_overrides(Path("/ws"), "/usr/bin/python3", 900)
    pairs = dict(a.split("=", 1) for a in args[1::2])
    assert pairs["sandbox_mode"] == '"workspace-write"'
    assert tomllib.loads(f"x = {pairs['hooks.PreToolUse']}")["x"][0]["matcher"] == HOOK_MATCHER
    assert pairs["mcp_servers.loopwright.tool_timeout_sec"] == "900"


def _claude_home(tmp: Path, enabled: bool = True) -> dict:
    d = tmp / "claude-config"
    (d / "plugins").mkdir(parents=True)
    (d / "plugins" / "installed_plugins.json").write_text(json.dumps(
        {"version": 2, "plugins": {"loopwright@loopwright": [{"scope": "user", "installPath": str(d)}]}}))
    (d / "settings.json").write_text(json.dumps({"enabledPlugins": {"loopwright@loopwright": enabled}}))
    return {"CLAUDE_CONFIG_DIR": str(d), "CODEX_HOME": str(tmp / "codex-home"), "HOME": str(tmp)}


def test_auto_wiring_follows_what_is_installed(tmp_path):
    env = _claude_home(tmp_path)
    assert clients.resolve_wiring("auto", env) == {"claude": "plugin", "codex": "workspace"}
    (tmp_path / "codex-home").mkdir()
    (tmp_path / "codex-home" / "config.toml").write_text('[plugins."loopwright@loopwright"]\nenabled = true\n')
    assert clients.resolve_wiring("auto", env) == {"claude": "plugin", "codex": "plugin"}
    assert clients.resolve_wiring("auto", _claude_home(tmp_path / "off", enabled=False))["claude"] == "workspace"
    with pytest.raises(ValueError, match="use one of auto, plugin, workspace"):
        clients.resolve_wiring("both")


def test_doctor_finds_doubles_and_says_how_to_undo_them(tmp_path):
    env = _claude_home(tmp_path)
    (tmp_path / "codex-home").mkdir()
    (tmp_path / "codex-home" / "config.toml").write_text(
        '[plugins."loopwright@loopwright"]\nenabled = true\n[mcp_servers.loopwright]\ncommand = "x"\n')
    ws = tmp_path / "ws"
    clients.apply_wiring(ws, "/usr/bin/python3", STATE, "workspace", env=env)     # the README's double wiring
    found = {f.what.split(":")[0]: f for f in clients.check_wiring(ws, STATE, env)}
    assert not found["Claude Code"].ok and "wired twice" in found["Claude Code"].what
    assert "claude plugin disable loopwright@loopwright" in found["Claude Code"].fix
    assert not found["Codex"].ok and "wired twice" in found["Codex"].what
    chosen = clients.apply_wiring(ws, "/usr/bin/python3", STATE, "auto", env=env)
    assert chosen == {"claude": "plugin", "codex": "plugin"} and not (ws / ".mcp.json").exists()
    found = {f.what.split(":")[0]: f for f in clients.check_wiring(ws, STATE, env)}
    assert found["Claude Code"].ok
    # the user-level Codex block next to the plugin is still a double: never tell a plugin user to write it
    assert not found["Codex"].ok and "codex-config --write" in found["Codex"].fix
    assert all(f.ok for f in clients.check_sandboxes(ws, STATE))


@pytest.mark.realclient
def test_plugin_installed_by_the_real_claude_cli_is_detected(tmp_path):
    from realclients import harness as h

    exe = h.require_binary("claude")
    env = {**os.environ, "HOME": str(tmp_path), "CLAUDE_CONFIG_DIR": str(tmp_path / "cc"),
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    for args in (["plugin", "marketplace", "add", str(REPO)], ["plugin", "install", "loopwright@loopwright"]):
        r = subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    assert "loopwright@loopwright" in (clients.installed_plugin("claude", env) or "")
    assert clients.resolve_wiring("auto", env)["claude"] == "plugin"
