"""The agent may not drive the human's CLI: it could read the hidden test split or lift a stop."""
import pytest

from mcp_server.guard.policy import policy_from_config
from mcp_server.guard.pretooluse import decide_pre_tool_use
from mcp_server.loop.config import PathsConfig


@pytest.fixture()
def policy(tmp_path):
    (tmp_path / "loopwright.toml").write_text("")
    return policy_from_config(tmp_path, PathsConfig())


def _bash(policy, command):
    payload = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "cwd": str(policy.root),
               "tool_input": {"command": command}}
    return decide_pre_tool_use(payload, policy)


@pytest.mark.parametrize("command", [
    "loopwright export-tsv",            # results.tsv carries test_bpb
    "loopwright report",                 # report.md shows the hidden test check
    "loopwright -w . export-tsv -o /tmp/r.tsv",
    "python -m mcp_server.cli export-tsv",
    "python3 -m mcp_server.cli --workspace . report",
    "loopwright stop --clear",           # lifting a human's stop request
    "loopwright score 3",                # scoring goes through the MCP tool
    "loopwright init /tmp/other --force",
    "python -m mcp_server.loop.engine",
    "cd /tmp && loopwright launch --agent claude",
])
def test_agent_cannot_run_the_human_cli(policy, command):
    d = _bash(policy, command)
    assert not d.allow and ("MCP tools" in d.reason), d.reason


@pytest.mark.parametrize("command", [
    "loopwright status",
    "loopwright -w . budget",
    "loopwright --help",
    "python -m mcp_server.cli status --limit 5",
    "loopwright doctor",
])
def test_read_only_cli_commands_pass(policy, command):
    d = _bash(policy, command)
    assert d.allow, d.reason
