"""The client configs a workspace carries must guard the same tools as the plugin's hooks.json."""
import json
import tomllib
from pathlib import Path

from mcp_server.loop.workspace import HOOK_MATCHER, client_configs

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
