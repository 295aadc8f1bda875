"""The clients' side: `loopwright doctor` (is everything wired?), `codex-config`, and `guard`
(the hook entry point Claude Code and Codex run)."""
from __future__ import annotations

import os
import sys
from pathlib import Path


def guard_args(sp) -> None:
    sp.add_argument("event", choices=["pre-tool-use", "stop", "session-start"])


def guard(args) -> int:
    from mcp_server.guard import main as guard_main

    return guard_main([args.event])


def doctor_args(sp) -> None:
    sp.add_argument("--skip-server", action="store_true", help="do not start the MCP server")


def doctor(args) -> int:
    from mcp_server.cli.doctor import run_doctor

    return run_doctor(args.workspace, skip_server=args.skip_server)


def codex_config_args(sp) -> None:
    sp.add_argument("--write", action="store_true", help="add them to $CODEX_HOME/config.toml (managed block)")
    sp.add_argument("--config", default=None, help="config.toml to write (default: $CODEX_HOME/config.toml)")


def codex_config(args) -> int:
    from mcp_server.cli.doctor import codex_block, write_codex_config
    from mcp_server.loop.workspace import Workspace

    root = Workspace.find(args.workspace).root
    if not args.write:
        sys.stdout.write(codex_block(root))
        return 0
    path = Path(args.config or Path(os.environ.get("CODEX_HOME", Path.home() / ".codex")) / "config.toml")
    print(f"wrote loopwright's MCP server and hooks to {write_codex_config(root, path)}")
    print("Codex runs hooks only once they are trusted: open Codex and review them with /hooks, or pass "
          "--dangerously-bypass-hook-trust to `codex exec` (hooks that are not trusted silently do not run).")
    return 0
