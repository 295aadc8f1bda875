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

# Files Claude Code's sandbox (bubblewrap) leaves in the workspace while a sandboxed command runs: it
# mounts /dev/null over each write-denied path that does not exist (so the command cannot create it),
# bwrap creates the mount point as an EMPTY file on the host, and Claude Code removes them once no
# sandboxed command is running -- so they sit there while one runs in the background. Workspace-relative;
# from Claude Code 2.1.x (its sandbox runtime's mandatory denies, and its own per-project settings paths).
CLIENT_SANDBOX_PLACEHOLDERS = frozenset({
    ".gitconfig", ".gitmodules", ".bashrc", ".bash_profile", ".zshrc", ".zprofile", ".profile", ".ripgreprc",
    ".mcp.json", ".vscode", ".idea", ".claude/commands", ".claude/agents", ".claude/skills", ".claude/hooks",
    ".claude/settings.json", ".claude/settings.local.json", ".claude/launch.json", ".claude/workflows",
    ".claude/routines", ".claude/scheduled_tasks.json",
})
