"""Smoke tests of the real-client harness (tests/realclients/).

They drive the real ``claude`` and ``codex`` CLIs offline against the scripted
fake model servers, with a trivial MCP server (``add``) and trivial hooks, to
prove that hooks and MCP tools work end to end inside the real clients.  The
first block tests the fake servers alone (no CLI needed).

A missing CLI skips the client tests, or fails them when CI=true (CI must run
``npm install --prefix tests/realclients``).  See tests/realclients/README.md.
"""
from __future__ import annotations

import json
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # makes `realclients` importable

from realclients.fake_anthropic import FakeAnthropic, Text, ToolUse, Turn  # noqa: E402
from realclients.fake_openai import ApplyPatch, FakeOpenAI, McpCall, Message  # noqa: E402
from realclients.harness import (  # noqa: E402
    claude_cli,
    command_hook,
    mcp_stdio,
    python_cmd,
    run_claude,
    run_codex,
    run_inspector,
)

# --------------------------------------------------------------------------
# the trivial MCP server and hooks, written into each test's tmp dir

ADD_SERVER = '''
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("adder")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fail(why: str) -> str:
    """Always fails with a ToolError (how loopwright reports a LoopError)."""
    raise ToolError(f"TOOL-ERROR: {why}")


if __name__ == "__main__":
    server.run()
'''

# PreToolUse: deny any write to a file named frozen.txt.  Understands Claude
# Code's file_path / notebook_path and Codex's apply_patch text.  Logs every
# payload it gets to argv[1] (one JSON per line).
GUARD_HOOK = r'''
import json, os, re, sys

payload = json.load(sys.stdin)
with open(sys.argv[1], "a") as log:
    log.write(json.dumps(payload) + "\n")
tool_input = payload.get("tool_input") or {}
targets = [tool_input.get("file_path") or "", tool_input.get("notebook_path") or ""]
targets += re.findall(r"^\*\*\* (?:Add File|Update File|Delete File|Move to): (.+)$",
                      tool_input.get("command") or "", re.M)
if any(os.path.basename(t.strip()) == "frozen.txt" for t in targets if t):
    print(json.dumps({"hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "deny",
        "permissionDecisionReason": "GUARD-DENY: frozen.txt is frozen, edit other.txt instead",
    }}))
'''

# Stop: block the first time (with a reason), allow afterwards.
STOP_HOOK = r'''
import json, os, sys

payload = json.load(sys.stdin)
log = sys.argv[1]
with open(log, "a") as f:
    f.write(json.dumps(payload) + "\n")
if not os.path.exists(log + ".blocked"):
    open(log + ".blocked", "w").close()
    print(json.dumps({"decision": "block", "reason": "STOP-HOOK: not done yet, say FINAL"}))
'''

GUARD_REASON = "GUARD-DENY: frozen.txt is frozen, edit other.txt instead"
STOP_REASON = "STOP-HOOK: not done yet, say FINAL"


class Kit:
    """Paths of the helper scripts and logs for one test."""

    def __init__(self, root: Path):
        self.root = root
        self.dir = root / "helpers"
        self.dir.mkdir()
        self.add_server = self._write("add_server.py", ADD_SERVER)
        self.guard = self._write("guard.py", GUARD_HOOK)
        self.stop = self._write("stop.py", STOP_HOOK)
        self.guard_log = root / "guard.jsonl"
        self.stop_log = root / "stop.jsonl"
        self.proj = root / "proj"
        self.proj.mkdir()
        (self.proj / "frozen.txt").write_text("original\n")

    def _write(self, name: str, text: str) -> Path:
        path = self.dir / name
        path.write_text(textwrap.dedent(text).lstrip())
        return path

    @property
    def mcp(self) -> dict:
        return {"adder": mcp_stdio(sys.executable, str(self.add_server))}

    def guard_hooks(self, matcher: str) -> dict:
        return {"PreToolUse": [command_hook(python_cmd(self.guard, self.guard_log), matcher=matcher, timeout=30)]}

    def stop_hooks(self) -> dict:
        return {"Stop": [command_hook(python_cmd(self.stop, self.stop_log), timeout=30)]}

    @staticmethod
    def read_log(path: Path) -> list[dict]:
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def kit(tmp_path: Path) -> Kit:
    return Kit(tmp_path)


# --------------------------------------------------------------------------
# the fake servers alone (fast; no CLI needed)


def _post(url: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _sse_events(text: str) -> list[tuple[str, dict]]:
    out = []
    for chunk in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_fake_anthropic_streams_turn_by_assistant_count():
    big_input = {"file_path": "/x/y.txt", "content": "a fairly long body " * 5}
    script = [
        Turn(Text("let me write"), ToolUse("Write", big_input)),
        lambda req: f"got {req.last_tool_results()[0].text} error={req.last_tool_results()[0].is_error}",
    ]
    with FakeAnthropic(script) as fake:
        url = fake.url + "/v1/messages?beta=true"
        msgs = [{"role": "user", "content": "go"}, {"role": "system", "content": "reminder"}]
        status, body = _post(url, {"model": "m", "stream": True, "messages": msgs})
        assert status == 200
        events = _sse_events(body)
        names = [n for n, _ in events]
        assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
        # the tool input arrives over several input_json_delta pieces that join to the input
        pieces = [d["delta"]["partial_json"] for n, d in events
                  if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"]
        assert len(pieces) > 1 and json.loads("".join(pieces)) == big_input
        start = [d for n, d in events if n == "content_block_start" and d["content_block"]["type"] == "tool_use"][0]
        tool_id = start["content_block"]["id"]

        msgs += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": tool_id, "name": "Write", "input": big_input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": "denied!",
                                          "is_error": True}]},
        ]
        status, body = _post(url, {"model": "m", "stream": True, "messages": msgs})
        text = "".join(d["delta"]["text"] for n, d in _sse_events(body) if n == "content_block_delta")
        assert text == "got denied! error=True"
        # the same request again replays the same turn (stateless)
        assert _post(url, {"model": "m", "stream": True, "messages": msgs})[1] == body.replace(
            "msg_lw_001_001", "msg_lw_001_002")
        # past the script: a harmless end_turn; non-stream and other routes answer sensibly
        msgs += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}]
        status, body = _post(url, {"model": "m", "stream": False, "messages": msgs})
        assert status == 200 and json.loads(body)["stop_reason"] == "end_turn" and fake.exhausted
        assert _post(fake.url + "/v1/messages/count_tokens", {"messages": msgs})[0] == 200
        assert _post(fake.url + "/v1/nope", {})[0] == 404
        assert _post(url, {"no": "messages"})[0] == 400
        assert fake.turns_served == [0, 1, 1, 2, None] and not fake.errors  # None: the 400


def test_fake_openai_counts_model_turns():
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"
    script = [[Message("patching"), ApplyPatch(patch)], McpCall("adder", "add", {"a": 1, "b": 2}), "done"]
    with FakeOpenAI(script) as fake:
        url = fake.url + "/v1/responses"
        inp = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}]
        status, body = _post(url, {"model": "gpt-5.5", "stream": True, "input": inp})
        events = _sse_events(body)
        assert status == 200 and events[0][0] == "response.created" and events[-1][0] == "response.completed"
        done = [d["item"] for n, d in events if n == "response.output_item.done"]
        assert [i["type"] for i in done] == ["message", "custom_tool_call"] and done[1]["input"] == patch
        assert events[-1][1]["response"]["usage"]["total_tokens"] > 0
        # the client echoes the items and adds the output: that is turn 1
        inp += done + [{"type": "custom_tool_call_output", "call_id": done[1]["call_id"], "output": "ok"}]
        events = _sse_events(_post(url, {"model": "gpt-5.5", "stream": True, "input": inp})[1])
        call = [d["item"] for n, d in events if n == "response.output_item.done"][0]
        assert call["type"] == "function_call" and call["namespace"] == "mcp__adder" and call["name"] == "add"
        assert json.loads(call["arguments"]) == {"a": 1, "b": 2}
        assert _post(fake.url + "/v1/other", {})[0] == 404
        assert fake.turns_served == [0, 1] and not fake.errors
        # a callback that raises: a 400 (not retried by the clients), traceback kept
        fake.script[2] = lambda req: 1 / 0
        inp += [call, {"type": "function_call_output", "call_id": call["call_id"], "output": "3"}]
        status, body = _post(url, {"model": "gpt-5.5", "stream": True, "input": inp})
        assert status == 400 and "ZeroDivisionError" in body and "ZeroDivisionError" in fake.errors[0]


def test_missing_client_skips_or_fails_in_ci(monkeypatch, tmp_path):
    from realclients import harness

    monkeypatch.setattr(harness, "npm_bin_dirs", lambda: [tmp_path])
    monkeypatch.setenv("PATH", str(tmp_path))
    assert harness.find_binary("claude") is None
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        harness.require_binary("claude")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        harness.require_binary("claude")
    (tmp_path / "claude").write_text("#!/bin/sh\n")
    (tmp_path / "claude").chmod(0o755)
    assert harness.require_binary("claude") == str(tmp_path / "claude")


# --------------------------------------------------------------------------
# Claude Code


@pytest.mark.realclient
@pytest.mark.timeout(120)
def test_claude_guard_hook_and_mcp_tool(kit: Kit):
    frozen, other = kit.proj / "frozen.txt", kit.proj / "other.txt"
    script = [
        ToolUse("Read", {"file_path": str(frozen)}),  # Write refuses files not Read first
        ToolUse("Write", {"file_path": str(frozen), "content": "tampered\n"}),
        ToolUse("Write", {"file_path": str(other), "content": "fine\n"}),
        ToolUse("mcp__adder__add", {"a": 2, "b": 3}),
        ToolUse("mcp__adder__fail", {"why": "budget spent"}),
        lambda req: f"sum={req.tool_result('toolu_lw_03_0').text}",
    ]
    run = run_claude(kit.proj, script, mcp_servers=kit.mcp, hooks=kit.guard_hooks("Write|Edit|MultiEdit"),
                     timeout=90).check()

    assert frozen.read_text() == "original\n"
    assert other.read_text() == "fine\n"
    denied = run.tool_result("toolu_lw_01_0")
    assert denied.is_error and GUARD_REASON in denied.text
    assert not run.tool_result("toolu_lw_02_0").is_error
    added = run.tool_result("toolu_lw_03_0")
    assert not added.is_error and json.loads(added.text) == {"result": 5}
    failed = run.tool_result("toolu_lw_04_0")
    assert failed.is_error and failed.text == "Error executing tool fail: TOOL-ERROR: budget spent"
    assert run.final_text == 'sum={"result":5}'
    assert [d["tool_use_id"] for d in run.result["permission_denials"]] == ["toolu_lw_01_0"]
    # the hook saw both Writes (not the Read: the matcher), with Claude's payload shape
    seen = kit.read_log(kit.guard_log)
    assert [(p["tool_name"], Path(p["tool_input"]["file_path"]).name) for p in seen] == [
        ("Write", "frozen.txt"), ("Write", "other.txt")]
    assert seen[0]["hook_event_name"] == "PreToolUse" and seen[0]["cwd"] == str(kit.proj)
    assert [e["hook_name"] for e in run.hook_events("PreToolUse")] == ["PreToolUse:Write"] * 2


@pytest.mark.realclient
@pytest.mark.timeout(120)
def test_claude_stop_hook_blocks_once(kit: Kit):
    def after_block(req):
        assert STOP_REASON in req.user_texts_after_last_assistant()
        return "FINAL"

    run = run_claude(kit.proj, ["first try", after_block], hooks=kit.stop_hooks(), timeout=90).check()

    assert run.final_text == "FINAL"
    assert [r.turn for r in run.model_requests] == [0, 1]
    assert "Stop hook feedback" in run.last_request.user_texts_after_last_assistant()
    stops = kit.read_log(kit.stop_log)
    assert [s["stop_hook_active"] for s in stops] == [False, True]
    assert [s["last_assistant_message"] for s in stops] == ["first try", "FINAL"]


@pytest.mark.realclient
@pytest.mark.timeout(120)
def test_claude_plugin_dir_hooks_and_mcp(kit: Kit):
    plugin = kit.root / "plugin"
    (plugin / ".claude-plugin").mkdir(parents=True)
    (plugin / "hooks").mkdir()
    (plugin / ".claude-plugin" / "plugin.json").write_text(json.dumps({"name": "lwsmoke", "version": "0.0.1"}))
    (plugin / "add_server.py").write_text(kit.add_server.read_text())
    (plugin / ".mcp.json").write_text(json.dumps({"mcpServers": {"adder": {
        "command": sys.executable, "args": ["${CLAUDE_PLUGIN_ROOT}/add_server.py"]}}}))
    (plugin / "hooks" / "hooks.json").write_text(json.dumps({"hooks": kit.guard_hooks("Write|Edit")}))
    script = [
        ToolUse("mcp__plugin_lwsmoke_adder__add", {"a": 20, "b": 22}),
        ToolUse("Write", {"file_path": str(kit.proj / "frozen.txt"), "content": "x\n"}),  # not Read: Claude refuses
        ToolUse("Write", {"file_path": str(kit.proj / "sub" / "frozen.txt"), "content": "x\n"}),  # new: hook denies
        "done",
    ]
    run = run_claude(kit.proj, script, plugin_dir=plugin, timeout=90).check()

    init = run.of_type("system", "init")[0]
    assert {"name": "plugin:lwsmoke:adder", "status": "connected"} in init["mcp_servers"]
    assert json.loads(run.tool_result("toolu_lw_00_0").text) == {"result": 42}
    assert "has not been read yet" in run.tool_result("toolu_lw_01_0").text
    assert GUARD_REASON in run.tool_result("toolu_lw_02_0").text
    assert not (kit.proj / "sub" / "frozen.txt").exists()


@pytest.mark.realclient
@pytest.mark.timeout(120)
def test_claude_mcp_list_shows_connected(kit: Kit):
    run_dir = kit.root / "claude-cli"
    add = claude_cli(["mcp", "add", "adder", "--", sys.executable, str(kit.add_server)], run_dir=run_dir, cwd=kit.proj)
    assert add.exit_code == 0, add.stderr
    listed = claude_cli(["mcp", "list"], run_dir=run_dir, cwd=kit.proj)
    assert listed.exit_code == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if line.startswith("adder:"))
    assert "Connected" in line, listed.stdout
    # isolation: the config landed in the run's CLAUDE_CONFIG_DIR
    assert "adder" in (run_dir / "claude-config" / ".claude.json").read_text()


@pytest.mark.realclient
@pytest.mark.timeout(120)
def test_inspector_cli_lists_and_calls_tools(kit: Kit):
    listed, proc = run_inspector([sys.executable, kit.add_server], method="tools/list", run_dir=kit.root / "insp")
    assert proc.exit_code == 0, proc.stderr
    tools = {t["name"]: t for t in listed["tools"]}
    assert set(tools) == {"add", "fail"} and set(tools["add"]["inputSchema"]["properties"]) == {"a", "b"}
    called, proc = run_inspector([sys.executable, kit.add_server], method="tools/call", tool_name="add",
                                 tool_args={"a": 2, "b": 40}, run_dir=kit.root / "insp")
    assert proc.exit_code == 0, proc.stderr
    assert called["structuredContent"] == {"result": 42} and not called["isError"]


# --------------------------------------------------------------------------
# Codex


@pytest.mark.realclient
@pytest.mark.timeout(120)
def test_codex_guard_hook_and_mcp_tool(kit: Kit):
    frozen, other = kit.proj / "frozen.txt", kit.proj / "other.txt"
    script = [
        McpCall("adder", "add", {"a": 2, "b": 3}),
        ApplyPatch("*** Begin Patch\n*** Update File: frozen.txt\n@@\n-original\n+tampered\n*** End Patch"),
        ApplyPatch("*** Begin Patch\n*** Add File: other.txt\n+fine\n*** End Patch"),
        McpCall("adder", "fail", {"why": "budget spent"}),
        lambda req: f"outputs={len(req.tool_outputs())}",
    ]
    run = run_codex(kit.proj, script, mcp_servers=kit.mcp, hooks=kit.guard_hooks("Edit|Write|MultiEdit"),
                    timeout=90).check()

    assert frozen.read_text() == "original\n"
    assert other.read_text() == "fine\n"
    added = run.tool_result("call_lw_000_0")
    assert added.type == "function_call_output" and '{"result":5}' in added.text
    blocked = run.tool_result("call_lw_001_0")
    assert blocked.type == "custom_tool_call_output"
    assert "blocked by PreToolUse hook" in blocked.text and GUARD_REASON in blocked.text
    assert "Success" in run.tool_result("call_lw_002_0").text
    # a ToolError reaches the model as plain output text: codex has no is_error flag
    assert "Error executing tool fail: TOOL-ERROR: budget spent" in run.tool_result("call_lw_003_0").text
    assert run.final_text == "outputs=4"
    mcp_items = run.items("mcp_tool_call")
    assert [(i["tool"], i["status"], i["result"]["structured_content"]) for i in mcp_items] == [
        ("add", "completed", {"result": 5}), ("fail", "failed", None)]
    assert [c["path"] for i in run.items("file_change") for c in i["changes"]] == [str(other)]
    # the hook saw both patches (matched through the Edit|Write alias), as apply_patch + command
    seen = kit.read_log(kit.guard_log)
    assert [p["tool_name"] for p in seen] == ["apply_patch", "apply_patch"]
    assert "*** Update File: frozen.txt" in seen[0]["tool_input"]["command"]
    assert "file_path" not in seen[0]["tool_input"]


@pytest.mark.realclient
@pytest.mark.timeout(120)
def test_codex_stop_hook_blocks_once(kit: Kit):
    def after_block(req):
        assert STOP_REASON in req.user_texts_after_last_model_item()
        return "FINAL"

    run = run_codex(kit.proj, ["first try", after_block], hooks=kit.stop_hooks(), timeout=90).check()

    assert [i["text"] for i in run.items("agent_message")] == ["first try", "FINAL"]
    assert [r.turn for r in run.model_requests] == [0, 1]
    assert "<hook_prompt" in run.last_request.user_texts_after_last_model_item()
    stops = kit.read_log(kit.stop_log)
    assert [s["stop_hook_active"] for s in stops] == [False, True]
    assert [s["last_assistant_message"] for s in stops] == ["first try", "FINAL"]
