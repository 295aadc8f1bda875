"""loopwright inside the real Claude Code and Codex, with the plugin installed, driven offline
by the scripted fake model (tests/realclients).

Each session plays one research step in a fast workspace whose baseline is recorded and whose
budget allows one more experiment: a write to prepare.py is denied (file unchanged), an edit
of train.py goes through, the agent tries to stop and the Stop hook sends it back (budget
remains), run_experiment trains a real model over MCP and score judges it (both in the ledger),
and the second stop is let through because the budget is spent.

Claude Code loads the repository with --plugin-dir (its .mcp.json + hooks/hooks.json). Codex
installs a clean checkout as a plugin marketplace in an isolated CODEX_HOME
(`codex plugin marketplace add` + `codex plugin add loopwright@loopwright`) and uses
.codex-plugin/mcp.json + hooks/hooks.json; the server finds the workspace by itself.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from mcp_server.common.facts import MCP_TOOLS

from e2e_support import (
    REPO,
    clean_checkout,
    experiments,
    fast_workspace,
    git,
    h,
    install_codex_plugin,
    run_codex_with_plugins,
    seed_baseline,
)
from realclients.fake_anthropic import ToolUse
from realclients.fake_openai import ApplyPatch, FakeOpenAI, McpCall, Message

pytestmark = [pytest.mark.realclient, pytest.mark.slow]

PLUGIN_TOOL = "mcp__plugin_loopwright_loopwright__"
OLD_LR, NEW_LR = "LR = 0.0002", "LR = 0.004"
STOP_FIRST = "I will stop here."


def _frozen_snapshot(root: Path) -> bytes:
    return (root / "prepare.py").read_bytes()


def _check_ledger_after_one_candidate(root: Path, verdict: str) -> dict:
    rows = experiments(root)
    # the seeded baseline, any reference runs the paired verdict needs (is_baseline too), one candidate
    assert rows[0]["is_baseline"] == 1 and [r["is_baseline"] for r in rows].count(0) == 1, rows
    cand = next(r for r in rows if not r["is_baseline"])
    assert cand["status"] == "ok" and cand["val_bpb"] is not None, cand
    assert cand["verdict"] == verdict
    assert NEW_LR in git(root, "show", f"{cand['commit_sha']}:train.py")   # the edit is what was trained
    return cand


def _budget_spent(root: Path) -> bool:
    from mcp_server.loop.engine import Engine

    eng = Engine(root)
    try:
        return eng.budget().should_stop
    finally:
        eng.close()


def _sandbox(root: Path) -> dict:
    """The Claude Code sandbox `loopwright init` wrote into the workspace (bubblewrap on Linux), passed with
    --settings: the test loads the plugin, so the project's own settings (and their hooks) stay out."""
    sb = json.loads((root / ".claude" / "settings.json").read_text())["sandbox"]
    assert sb["enabled"] and sb["failIfUnavailable"] and sb["allowUnsandboxedCommands"] is False
    return sb


# --------------------------------------------------------------------------- Claude Code

@pytest.mark.timeout(420)
def test_claude_code_plugin_runs_the_loop(tmp_path, small_corpus):
    h.require_binary("claude")   # skip (fail with CI=true) before building the workspace
    root = fast_workspace(tmp_path, small_corpus)
    seed_baseline(root)
    prepare, train = root / "prepare.py", root / "train.py"
    before = _frozen_snapshot(root)
    seen: dict = {}

    def after_stop_attempt(req):
        feedback = req.user_texts_after_last_assistant()
        assert "Stop hook feedback" in feedback and "Budget remains" in feedback, feedback
        return ToolUse(PLUGIN_TOOL + "run_experiment", {"description": "normal learning rate",
                                                        "hypothesis": "LR 2e-4 is far too low"})

    def after_run(req):
        res = req.last_tool_results()[0]
        assert not res.is_error, res.text
        seen["run"] = json.loads(res.text)
        return ToolUse(PLUGIN_TOOL + "score", {"experiment_id": seen["run"]["experiment_id"]})

    def after_score(req):
        res = req.last_tool_results()[0]
        assert not res.is_error, res.text
        seen["score"] = json.loads(res.text)
        return "The budget is spent; done."

    script = [
        ToolUse("Read", {"file_path": str(prepare)}),
        ToolUse("Write", {"file_path": str(prepare), "content": "# nothing to see\n"}),
        ToolUse("Read", {"file_path": str(train)}),
        ToolUse("Edit", {"file_path": str(train), "old_string": OLD_LR, "new_string": NEW_LR}),
        STOP_FIRST,
        after_stop_attempt,
        after_run,
        after_score,
    ]
    import tempfile

    run = h.run_claude(root, script, plugin_dir=REPO, timeout=360, settings={"sandbox": _sandbox(root)},
                       run_dir=tempfile.mkdtemp(prefix="lw-", dir="/tmp"),   # short: the sandbox's socket paths
                       extra_env={"LOOPWRIGHT_PYTHON": sys.executable, "CLAUDE_CODE_STOP_HOOK_BLOCK_CAP": "0",
                                  "MCP_CONNECT_TIMEOUT_MS": "60000"}).check()

    init = run.of_type("system", "init")[0]
    assert {"name": "plugin:loopwright:loopwright", "status": "connected"} in init["mcp_servers"], init["mcp_servers"]
    # the frozen file: denied by the plugin's PreToolUse hook, unchanged on disk
    denied = run.tool_result("toolu_lw_01_0")
    assert denied.is_error and "prepare.py is the frozen evaluator" in denied.text, denied.text
    assert _frozen_snapshot(root) == before
    assert [d["tool_use_id"] for d in run.result["permission_denials"]] == ["toolu_lw_01_0"]
    # the editable file: allowed, then committed and trained by run_experiment over MCP
    assert not run.tool_result("toolu_lw_03_0").is_error
    assert seen["run"]["status"] == "ok" and seen["run"]["val_bpb"] > 0
    assert seen["score"]["verdict"] in ("keep", "discard", "retest")
    _check_ledger_after_one_candidate(root, seen["score"]["verdict"])
    # Stop: blocked while budget remained, let through once it was spent
    stops = run.hook_events("Stop")
    assert len(stops) == 2, [s.get("stdout") for s in stops]
    assert json.loads(stops[0]["stdout"])["decision"] == "block"
    assert "block" not in (stops[1].get("stdout") or "")
    assert run.final_text == "The budget is spent; done." and _budget_spent(root)
    _no_server_left(root)   # issue 15 item 8: the plugin's server left with Claude Code


# --------------------------------------------------------------------------- Codex

def _codex_flow(state: dict):
    """One callable for every turn: what to do next follows from what the client sent back (the
    plugin's MCP server starts in the background, so an early call may find it not ready yet)."""
    patch = "*** Begin Patch\n*** Update File: {f}\n@@\n-{a}\n+{b}\n*** End Patch\n"
    lr_line = state["lr_line"]

    def step(req):
        out = {o.call_id: o.text for o in req.tool_outputs()}
        said_stop = any(STOP_FIRST in json.dumps(item) for item in req.input if item.get("role") == "assistant")
        if "deny_prepare" not in out:
            return ApplyPatch(patch.format(f="prepare.py", a="import os", b="import os  # changed"), "deny_prepare")
        if "edit_train" not in out:
            return ApplyPatch(patch.format(f="train.py", a=lr_line, b=lr_line.replace(OLD_LR, NEW_LR)), "edit_train")
        if not said_stop:
            return Message(STOP_FIRST)
        if "stop_feedback" not in state:
            state["stop_feedback"] = req.user_texts_after_last_model_item()
        runs = sorted(k for k in out if k.startswith("run_"))
        if not runs or "unsupported call" in out[runs[-1]]:
            if len(runs) >= 30:
                raise AssertionError(f"the loopwright MCP server never came up: {out[runs[-1]]}")
            if runs:
                import time
                time.sleep(1)
            return McpCall("loopwright", "run_experiment", {"description": "normal learning rate"},
                           call_id=f"run_{len(runs):02d}")
        if "score" not in out:
            state["run"] = out[runs[-1]]
            return McpCall("loopwright", "score", {}, call_id="score")
        state["score"] = out["score"]
        return Message("The budget is spent; done.")

    return step


@pytest.mark.timeout(420)
def test_codex_plugin_runs_the_loop(tmp_path, small_corpus):
    h.require_binary("codex")
    root = fast_workspace(tmp_path, small_corpus)
    seed_baseline(root)
    before = _frozen_snapshot(root)
    lr_line = next(line for line in (root / "train.py").read_text().splitlines() if line.startswith(OLD_LR))
    run_dir = tmp_path / "codex-run"
    run_dir.mkdir()
    installed = install_codex_plugin(run_dir, clean_checkout(tmp_path / "loopwright-clone"))
    state: dict = {"lr_line": lr_line}
    fake = FakeOpenAI([_codex_flow(state)] * 45)
    # No LOOPWRIGHT_WORKSPACE: the plugin's launcher takes the workspace from `codex -C`.
    run = run_codex_with_plugins(root, fake, run_dir, installed, timeout=360, cwd=tmp_path,
                                 extra_env={"LOOPWRIGHT_PYTHON": sys.executable}).check(allow_exhausted=False)

    denied = run.tool_result("deny_prepare").text
    assert "blocked by PreToolUse hook" in denied and "prepare.py is the frozen evaluator" in denied, denied
    assert _frozen_snapshot(root) == before
    assert "Success" in run.tool_result("edit_train").text
    assert "Budget remains" in state["stop_feedback"], state["stop_feedback"]
    result = json.loads(state["run"].split("Output:", 1)[1])
    assert result["status"] == "ok" and result["val_bpb"] > 0, result
    verdict = json.loads(state["score"].split("Output:", 1)[1])["verdict"]
    _check_ledger_after_one_candidate(root, verdict)
    calls = [i for i in run.items("mcp_tool_call") if i.get("status") == "completed"]
    assert [(c["server"], c["tool"]) for c in calls][-2:] == [("loopwright", "run_experiment"), ("loopwright", "score")]
    assert run.final_text == "The budget is spent; done." and _budget_spent(root)
    _no_server_left(root)   # issue 15 item 8: the plugin's server left with Codex


def _servers_of(root: Path) -> list[int]:
    """Live `loopwright serve` processes for this workspace (by argument, environment or cwd)."""
    import os

    out, key = [], str(root).encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            env = open(f"/proc/{pid}/environ", "rb").read()
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            cwd = os.readlink(f"/proc/{pid}/cwd").encode()
        except OSError:
            continue
        if b"serve" in cmd and (b"mcp_server.cli" in cmd or b"loopwright" in cmd) and state not in ("Z", "X") \
                and (key in cmd or b"LOOPWRIGHT_WORKSPACE=" + key + b"\0" in env or cwd == key):
            out.append(int(pid))
    return out


def _no_server_left(root: Path, within_s: float = 10) -> None:
    import time

    deadline = time.time() + within_s
    while _servers_of(root) and time.time() < deadline:
        time.sleep(0.3)
    assert not _servers_of(root), f"loopwright servers outlived the client: {_servers_of(root)}"


# --------------------------------------------------------------------------- other real clients

@pytest.fixture(scope="module")
def plain_ws(tmp_path_factory, small_corpus) -> Path:
    return fast_workspace(tmp_path_factory.mktemp("plain"), small_corpus)


def test_claude_plugin_validate(tmp_path):
    marketplace = h.claude_cli(["plugin", "validate", str(REPO)], run_dir=tmp_path)
    assert marketplace.exit_code == 0 and "Validation passed" in marketplace.stdout, marketplace.stdout + marketplace.stderr
    plugin = h.claude_cli(["plugin", "validate", str(REPO / ".claude-plugin" / "plugin.json")], run_dir=tmp_path)
    assert plugin.exit_code == 0 and "Validation passed" in plugin.stdout, plugin.stdout + plugin.stderr


def test_claude_mcp_list_shows_loopwright_connected(tmp_path, plain_ws):
    serve = [sys.executable, "-m", "mcp_server.cli", "serve", "--workspace", str(plain_ws)]
    added = h.claude_cli(["mcp", "add", "loopwright", "--", *serve], run_dir=tmp_path, cwd=plain_ws)
    assert added.exit_code == 0, added.stderr
    listed = h.claude_cli(["mcp", "list"], run_dir=tmp_path, cwd=plain_ws)
    line = next((ln for ln in listed.stdout.splitlines() if ln.startswith("loopwright:")), "")
    assert listed.exit_code == 0 and "Connected" in line and str(plain_ws) in line, listed.stdout + listed.stderr


def test_mcp_inspector_lists_and_calls_the_tools(plain_ws):
    serve = [sys.executable, "-m", "mcp_server.cli", "serve", "--workspace", str(plain_ws)]
    tools, proc = h.run_inspector(serve)
    assert tools is not None, proc.stdout + proc.stderr
    assert sorted(t["name"] for t in tools["tools"]) == sorted(MCP_TOOLS)
    budget, proc = h.run_inspector(serve, method="tools/call", tool_name="budget_check")
    assert budget is not None and not budget.get("isError"), proc.stdout + proc.stderr
    assert budget["structuredContent"]["experiments_left"] == 2


@pytest.mark.timeout(300)
def test_claude_code_sandbox_keeps_a_hook_allowed_bash_write_out_of_the_state_dir(tmp_path, small_corpus):
    """The guard cannot see a path computed at run time; the OS sandbox (bubblewrap, from the settings init
    wrote) keeps the write away from the ledger anyway. The same command outside the sandbox does write."""
    import hashlib

    from mcp_server.agents import clients
    from mcp_server.loop.workspace import Workspace

    h.require_binary("claude")
    root = fast_workspace(tmp_path, small_corpus)
    state = Workspace.open(root).state_dir
    db = state / "state.db"
    before = (hashlib.sha256(db.read_bytes()).hexdigest(), sorted(p.name for p in state.iterdir()))
    # a path the guard cannot see: joined at run time from its components (no literal state-home path)
    parts = [p for p in str(state).split(os.sep) if p]
    attack = (f"python3 -c \"import os; d = os.sep + os.sep.join({parts!r}); "
              "open(os.path.join(d, 'state.db'), 'ab').write(b'forged'); "
              "open(os.path.join(d, 'planted'), 'w').write('x'); print('wrote', d)\"")
    scratch = clients.scratch_dir(state) / "note.txt"
    script = [ToolUse("Bash", {"command": attack, "description": "tamper"}),
              ToolUse("Bash", {"command": f"echo ok > {scratch} && cat {scratch}", "description": "scratch"}),
              ToolUse("Bash", {"command": f"ls -A {state} | wc -l", "description": "look"}),
              "done"]
    import tempfile

    short = tempfile.mkdtemp(prefix="lw-", dir="/tmp")   # the sandbox's bridge sockets need a short path
    run = h.run_claude(root, script, plugin_dir=REPO, timeout=240, settings={"sandbox": _sandbox(root)},
                       run_dir=short,
                       extra_env={"LOOPWRIGHT_PYTHON": sys.executable, "MCP_CONNECT_TIMEOUT_MS": "60000"})
    run.check(allow_exhausted=True)   # the Stop hook keeps the session going (budget remains) until its cap
    assert run.result["permission_denials"] == []                   # the hook let all three through
    attempt, note, look = run.tool_results()[:3]
    assert not attempt.is_error and "wrote" in attempt.text, attempt.text   # it ran, inside the sandbox
    after = (hashlib.sha256(db.read_bytes()).hexdigest(), sorted(p.name for p in state.iterdir()))
    assert after == before, "the sandboxed command reached the state dir"
    assert not note.is_error and note.text.strip() == "ok"          # the scratch dir is writable
    assert look.text.strip().splitlines()[-1].strip() in ("0", "1")  # inside, the state dir is not the real one
    # control: the very same command, unsandboxed, does write there (so it was the sandbox that stopped it)
    import subprocess

    subprocess.run(["sh", "-c", attack], check=True, timeout=60)
    assert (state / "planted").exists()


@pytest.mark.timeout(300)
def test_claude_code_sandbox_denies_the_default_corpus_held_out_modules(tmp_path, plain_ws):
    """The default corpus's val/test are standard-library modules; the sandbox init writes for it keeps the
    agent's Bash from reading them (to paste into train.py as training text). The same read outside works."""
    import subprocess
    import tempfile

    from mcp_server.agents import clients
    from mcp_server.loop import sandbox
    from mcp_server.loop.workspace import Workspace

    h.require_binary("claude")
    held_out = sandbox.agent_private_paths("stdlib-hidden")
    module = next(p for p in held_out if p.endswith("/mailbox.py"))
    read = f"head -c 64 {module} > /dev/null && echo READ || echo DENIED"
    sb = clients.claude_sandbox(plain_ws, Workspace.open(plain_ws).state_dir, private=held_out)
    short = tempfile.mkdtemp(prefix="lw-", dir="/tmp")   # the sandbox's bridge sockets need a short path
    script = [ToolUse("Bash", {"command": read, "description": "read"}),
              ToolUse("Read", {"file_path": module}),           # its own file tool, outside the sandbox
              "done"]
    run = h.run_claude(plain_ws, script, plugin_dir=REPO, timeout=240, run_dir=short,
                       settings={"sandbox": sb, "permissions": clients.claude_read_denies(held_out)},
                       extra_env={"LOOPWRIGHT_PYTHON": sys.executable, "MCP_CONNECT_TIMEOUT_MS": "60000"})
    run.check(allow_exhausted=True)
    bash, file_read = run.tool_results()[:2]
    assert bash.text.strip().splitlines()[-1] == "DENIED", bash.text
    # refused, and mailbox.py's text (it defines class Mailbox) never reached the model
    assert file_read.is_error and "class Mailbox" not in file_read.text, file_read.text
    assert subprocess.run(["sh", "-c", read], capture_output=True, text=True).stdout.strip() == "READ"


@pytest.mark.timeout(300)
def test_reviewer_subagent_can_call_the_loopwright_tools_it_is_told_to_use(tmp_path, small_corpus):
    """Issue 15 item 6: the plugin's reviewer agent calls state_read as its instructions say (before, its
    `tools:` granted no MCP tool and the call failed with "No such tool available")."""
    import tempfile

    h.require_binary("claude")
    root = fast_workspace(tmp_path, small_corpus)
    seed_baseline(root)
    seen: dict = {}
    reviewer = "reviewer of a loopwright"

    def first(req):
        if reviewer in req.system_text:
            seen["tools"] = [t.get("name") for t in req.body.get("tools", [])]
            return ToolUse(PLUGIN_TOOL + "state_read", {"view": "noise"})
        return ToolUse("Agent", {"description": "review", "prompt": "Review the last change.",
                                 "subagent_type": "loopwright:reviewer"})

    def second(req):
        if reviewer in req.system_text:
            seen["result"] = req.last_tool_results()[0]
            return "REVIEW: ok"
        return "done"

    run = h.run_claude(root, [first, second, "done"], plugin_dir=REPO, timeout=240,
                       run_dir=tempfile.mkdtemp(prefix="lw-", dir="/tmp"),
                       extra_env={"LOOPWRIGHT_PYTHON": sys.executable, "MCP_CONNECT_TIMEOUT_MS": "60000"})
    run.check(allow_exhausted=True)
    assert PLUGIN_TOOL + "state_read" in seen["tools"] and PLUGIN_TOOL + "budget_check" in seen["tools"]
    assert not {PLUGIN_TOOL + t for t in ("run_experiment", "score", "revert")} & set(seen["tools"])
    assert not seen["result"].is_error, seen["result"].text
    assert "sigma" in seen["result"].text
