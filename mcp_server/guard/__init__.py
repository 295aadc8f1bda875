"""The guard: one program behind both clients' hooks (Claude Code and Codex).

    python -m mcp_server.guard pre-tool-use   < payload.json
    python -m mcp_server.guard stop           < payload.json
    python -m mcp_server.guard session-start  < payload.json

PreToolUse     denies writes to the frozen verifier (prepare.py, loopwright.toml, ...), the
               loop's state directory and .git, git commands that move the loop's refs, and
               reads of the hidden test split; everything else passes.
Stop           blocks the agent from stopping while the campaign budget remains.
SessionStart   tells a new, resumed or compacted session where the loop stands.

Hooks are the first line of defence, not the only one: a hook sees a command's text
before it runs, never what a program computes at run time. The frozen-manifest check
(mcp_server/loop/integrity.py) catches the rest before every run and score.

A hook runs on every tool call, so the hot path imports only the standard library;
mcp_server.loop.config (pydantic) is imported only when loopwright.toml's [paths] table is
incomplete or invalid. Output formats: see `emit_pre_tool_use` and `main`.

Decisions worth knowing:
- The file-edit tools (Edit, Write, MultiEdit, NotebookEdit, apply_patch) may change only
  the editable files. The shell may also write other, unlisted files (logs, scratch), but
  never the frozen files, the state dir or .git.
- Reads: only the hidden split and the state dir's private records (state.db*,
  runs/*/eval.json, reports/**: they carry the hidden test score) are refused. Listing the
  state dir (ls) and reading a run's train.log are fine; the agent uses state_read.
- Scripts (python -c, heredocs, files run by an interpreter) are refused when they name
  the state dir or the hidden split at all, or name another protected file and contain a
  way to write (open(..., 'w'), unlink, shutil, ...). train.py itself is not inspected.
- loopwright's own code is the person's: the loopwright CLI other than status/budget/doctor
  (by any path, or a run-time command name given approve/reject/config/...), python -m
  mcp_server... (and runpy of it), and scripts naming mcp_server, a person's loopwright
  command, or the state home (LOOPWRIGHT_HOME, XDG_DATA_HOME, its path) are refused.
- git: read-only subcommands pass; anything that moves refs, changes the index or the
  config is refused (the loop owns git); `git checkout/restore -- train.py` is allowed.
- Stop: blocks while loop_status says budget remains. `stop_hook_active` alone does not
  release the agent; LOOPWRIGHT_STOP_MAX_IDLE_BLOCKS (default 20) consecutive blocks
  without progress do. Claude Code ends a turn after 8 consecutive Stop blocks unless
  CLAUDE_CODE_STOP_HOOK_BLOCK_CAP=0, which headless launchers set.
- Fail closed: a crash, bad payload or unusable interpreter blocks the tool call (exit 2);
  Stop blocks when the loop cannot be imported (the idle-block cap still applies) and lets the
  agent stop when the status itself raises (a broken ledger must not trap the agent);
  SessionStart fails open.

Layout: entry.py (the command line) -> pretooluse.py / stop.py / session_start.py, each
reading its payload through payload.py and the workspace's rules through policy.py; the
shell/ package analyses shell commands (lexer, walker, commands, wrappers, git).
"""
from mcp_server.guard.entry import main

__all__ = ["main"]
