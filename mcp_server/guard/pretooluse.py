"""PreToolUse: allow or deny one tool call, across every workspace it may touch.

Denies writes to the frozen verifier (prepare.py, loopwright.toml, ...), the loop's state
directory and .git, git commands that move the loop's refs, and reads of the hidden test
split; everything else passes. A crash, bad payload or unusable interpreter blocks the tool
call (exit 2): the guard fails closed.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Optional

from mcp_server.guard.payload import payload_cwd, tool_input
from mcp_server.guard.policy import Policy, find_workspace_roots, load_policy, parse_apply_patch
from mcp_server.guard.shell import ShellGuard

EDIT_TOOLS = {"Edit", "Write", "MultiEdit", "NotebookEdit"}
READ_TOOLS = {"Read", "Grep", "Glob", "LS", "NotebookRead"}
PATCH_TOOLS = {"apply_patch", "ApplyPatch", "applypatch"}
SHELL_TOOLS = {"Bash", "shell", "exec_command", "local_shell", "shell_command", "container.exec",
               "unified_exec"}
STDIN_TOOLS = {"write_stdin"}    # Codex: keystrokes typed into a running shell session
GIT_TOOLS = {"EnterWorktree"}    # Claude Code: creates a branch + worktree in the loop's repository
PATH_KEYS_IN_INPUT = ("file_path", "notebook_path", "path")


@dataclass(frozen=True)
class Decision:
    allow: bool
    reason: str = ""


ALLOW = Decision(True)


def decide_pre_tool_use(payload: dict, policy: Policy) -> Decision:
    """Allow or deny one tool call for one workspace policy."""
    tool = str(payload.get("tool_name") or "")
    inp = tool_input(payload)
    cwd = payload_cwd(payload, inp)
    if tool.startswith("mcp__"):
        return ALLOW                                # the loop's own tools (and others') decide for themselves
    if tool in EDIT_TOOLS:
        return _decide_edit(tool, inp, cwd, policy)
    if tool in READ_TOOLS:
        return _decide_read(tool, inp, cwd, policy)
    if tool in PATCH_TOOLS:
        return _decide_patch(inp, cwd, policy)
    if tool in SHELL_TOOLS or tool in STDIN_TOOLS:
        return _decide_shell(tool, inp, cwd, policy)
    if tool in GIT_TOOLS:
        return _deny(f"{tool} creates a branch and a worktree in the loop's repository. The loop owns git: "
                     f"work in this workspace, edit {policy.editable[0]} and call run_experiment.")
    return _decide_unknown(tool, inp, cwd, policy)


def _patch_text(inp: dict) -> Optional[str]:
    for key in ("command", "patch", "input"):
        value = inp.get(key)
        if isinstance(value, list):
            value = "\n".join(map(str, value))
        if isinstance(value, str) and value.strip():
            return value
    return None


def _deny(reason: str) -> Decision:
    return Decision(False, reason)


def _decide_edit(tool: str, inp: dict, cwd: str, policy: Policy) -> Decision:
    paths = [inp[k] for k in PATH_KEYS_IN_INPUT if isinstance(inp.get(k), str) and inp[k]]
    if not paths:
        text = _patch_text(inp)
        if text and parse_apply_patch(text):        # Codex may route apply_patch under an edit alias
            return _decide_patch(inp, cwd, policy)
        return _deny(f"{tool} without a file path: the guard cannot tell which file it changes.")
    for path in paths:
        problem = policy.write_problem(path, cwd, strict=True)
        if problem:
            return _deny(problem)
    return ALLOW


def _decide_read(tool: str, inp: dict, cwd: str, policy: Policy) -> Decision:
    paths = [inp[k] for k in PATH_KEYS_IN_INPUT if isinstance(inp.get(k), str) and inp[k]]
    for path in paths:
        problem = policy.read_problem(path, cwd)
        if problem is None and tool == "Grep" and policy.in_state_dir(path, cwd):
            problem = policy.covers_hidden_problem(path, cwd)
        if problem:
            return _deny(problem)
    for key in ("glob", "pattern"):
        value = inp.get(key)
        if tool == "Grep" and key == "pattern":
            continue                                # a regex, not a file name
        if isinstance(value, str):
            problem = policy.hidden_mention(value) or policy.read_problem(value, cwd)
            if problem:
                return _deny(problem)
    return ALLOW


def _decide_patch(inp: dict, cwd: str, policy: Policy) -> Decision:
    text = _patch_text(inp)
    if text is None:
        return _deny("apply_patch without patch text: the guard cannot tell which files it changes.")
    problem = policy.apply_patch_problem(text, cwd)
    return _deny(problem) if problem else ALLOW


def _shell_text(tool: str, inp: dict) -> Optional[str]:
    keys = ("chars",) if tool in STDIN_TOOLS else ("command", "cmd", "argv", "args")
    for key in keys:
        value = inp.get(key)
        if isinstance(value, list) and value:
            return shlex.join(str(v) for v in value)   # ["bash", "-lc", "..."] is analysed as such
        if isinstance(value, str):
            shell = inp.get("shell")                   # Codex exec_command may name another interpreter
            if isinstance(shell, str) and shell and tool not in STDIN_TOOLS:
                return shlex.join([shell, "-c", value])
            return value
    return None


def _decide_shell(tool: str, inp: dict, cwd: str, policy: Policy) -> Decision:
    text = _shell_text(tool, inp)
    if text is None:
        if tool in STDIN_TOOLS:
            return ALLOW                            # polling a session without typing
        return _deny(f"{tool} call without a command: the guard cannot tell what it runs.")
    reason = ShellGuard(policy, cwd).check(text)
    return _deny(reason) if reason else ALLOW


def _decide_unknown(tool: str, inp: dict, cwd: str, policy: Policy) -> Decision:
    """A tool we do not know that names a file or carries a patch: treat it as a writer."""
    for path in (inp[k] for k in PATH_KEYS_IN_INPUT if isinstance(inp.get(k), str) and inp[k]):
        problem = policy.write_problem(path, cwd) or policy.read_problem(path, cwd)
        if problem:
            return _deny(problem)
    text = _patch_text(inp)
    if text and parse_apply_patch(text):
        return _decide_patch(inp, cwd, policy)
    return ALLOW


# --------------------------------------------------------------------------- workspaces


_PATH_WORD = re.compile(r"""(?<![\w$.])((?:/|~/|\.{1,2}/|[\w.-]+/)[^\s'"`;|&<>()$]*)""")


def payload_workspaces(payload: dict) -> list[str]:
    """The workspaces a tool call may touch: around its cwd, CLAUDE_PROJECT_DIR, and any absolute
    path it names. All of them are checked (a loopwright.toml planted in a subdirectory only adds
    protection; it never replaces the outer workspace's)."""
    inp = tool_input(payload)
    cwd = payload_cwd(payload, inp)
    starts = [cwd, os.environ.get("CLAUDE_PROJECT_DIR") or ""]
    for key in PATH_KEYS_IN_INPUT:
        if isinstance(inp.get(key), str):
            starts.append(os.path.join(cwd, inp[key]))
    home = os.path.expanduser("~")
    for value in inp.values():
        if isinstance(value, list):
            value = " ".join(map(str, value))
        if isinstance(value, str):
            value = value[:100_000].replace("${HOME}", home).replace("$HOME", home)
            starts.extend(os.path.join(cwd, m.group(1)) for m in _PATH_WORD.finditer(value))
            starts.extend(os.path.join(cwd, target) for _, target in parse_apply_patch(value))
    roots: list[str] = []
    for start in dict.fromkeys(s for s in starts[:200] if s):
        for candidate in {start, os.path.realpath(os.path.expanduser(start))}:
            for root in find_workspace_roots(candidate):
                if root not in roots:
                    roots.append(root)
    return roots


def decide_for_payload(payload: dict) -> Decision:
    """The PreToolUse decision across every workspace the call may touch (none: allow)."""
    if not isinstance(payload, dict):
        raise ValueError("hook payload is not a JSON object")
    for root in payload_workspaces(payload):
        decision = decide_pre_tool_use(payload, load_policy(root))
        if not decision.allow:
            return decision
    return ALLOW


# --------------------------------------------------------------------------- Stop

def emit_pre_tool_use(decision: Decision, exit_code_format: bool = False) -> int:
    """Allow: exit 0, no output. Deny: the reason on stderr, and either exit 0 with the
    hookSpecificOutput JSON on stdout (default; both clients) or exit 2 (exit_code_format)."""
    if decision.allow:
        return 0
    sys.stderr.write(decision.reason + "\n")
    if exit_code_format:
        return 2
    sys.stdout.write(json.dumps({"hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "deny",
        "permissionDecisionReason": decision.reason,
    }}) + "\n")
    return 0


def main_pre_tool_use(raw: str, exit_code_format: bool) -> int:
    try:
        decision = decide_for_payload(json.loads(raw))
    except Exception as e:
        # fail closed: exit 2 blocks in both clients even when nothing else works
        sys.stderr.write(f"loopwright guard could not check this action ({type(e).__name__}: {e}), so it "
                         f"is blocked (the guard fails closed). Edit train.py with the edit tool and use "
                         f"the loopwright MCP tools; if this repeats, report it.\n")
        return 2
    return emit_pre_tool_use(decision, exit_code_format)

