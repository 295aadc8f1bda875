"""Facts the server, the client configs and the launcher must agree on.

A test checks each copy that cannot import this module: hooks/hooks.json's PreToolUse matcher,
and the tools mcp/server.py registers.
"""
from __future__ import annotations

MCP_SERVER = "loopwright"   # the server's name in every client config (tools are mcp__loopwright__<tool>)
MCP_TOOLS = ("run_experiment", "score", "revert", "budget_check", "state_read", "note", "suggest_next",
             "submit_experiment", "wait")

# Every tool through which an agent can write or read files, in either client (Claude Code, Codex).
HOOK_MATCHER = ("Edit|Write|MultiEdit|NotebookEdit|Bash|Read|Grep|Glob|EnterWorktree|apply_patch|shell|"
                "exec_command|local_shell|write_stdin")
