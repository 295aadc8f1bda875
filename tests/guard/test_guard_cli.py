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


# Inside Claude Code's sandbox only train.py itself is writable (a file bind), not the workspace folder:
# an editor that writes a temp file and renames it over train.py fails ("cannot rename ...: Device or
# resource busy"). The guard refuses those before they run and says what works (issue 24 item 10).
@pytest.mark.parametrize("command", [
    "sed -i 's/LR = 0.01/LR = 0.02/' train.py",
    "sed -i.bak -e 's/0.01/0.02/' train.py",
    "sed --in-place 's/0.01/0.02/' ./train.py",
    "cd /tmp && sed -ni 's/a/b/p' {root}/train.py",
    "perl -pi -e 's/0.01/0.02/' train.py",
    "perl -i.orig -pe 's/0.01/0.02/' train.py",
    "mv /tmp/new_train.py train.py",
    "mv -f /tmp/new_train.py {root}/train.py",
    "mv train.py /tmp/old.py",
    "mv /tmp/work/train.py .",              # into the workspace folder, onto train.py
])
def test_rename_editors_on_train_py_are_refused_with_what_works(policy, command):
    d = _bash(policy, command.format(root=policy.root))
    assert not d.allow
    assert "Device or resource busy" in d.reason and "Edit tool" in d.reason and "cat > train.py" in d.reason, d.reason


@pytest.mark.parametrize("command", [
    "cp /tmp/new_train.py train.py",        # cp opens and truncates the file: works in the sandbox
    "sed 's/0.01/0.02/' train.py > /tmp/t && cat /tmp/t > train.py",
    "cat > train.py <<'EOF'\nLR = 0.02\nEOF",
    "sed -n '1,20p' train.py",
    "sed -i 's/a/b/' /tmp/scratch.py",       # not an editable file
    "perl -pi -e 's/a/b/' /tmp/scratch.py",
    "mv /tmp/a.py /tmp/b.py",
])
def test_in_place_writes_of_train_py_and_renames_elsewhere_pass(policy, command):
    d = _bash(policy, command)
    assert d.allow, d.reason
