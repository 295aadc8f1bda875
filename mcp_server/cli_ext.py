"""Sub-commands contributed by the other modules (kept apart so cli.py stays readable)."""
from __future__ import annotations

import sys


def register(sub, ws_arg, command) -> None:
    sp = sub.add_parser("guard", help="hook entry point used by Claude Code and Codex (reads stdin)")
    sp.add_argument("event", choices=["pre-tool-use", "stop", "session-start"])

    @command("guard")
    def cmd_guard(args) -> int:
        from . import guard

        return guard.main([args.event])

    sp = ws_arg(sub.add_parser("doctor", help="check the workspace, server, hooks and agent CLIs; say what to fix"))
    sp.add_argument("--skip-server", action="store_true", help="do not start the MCP server")

    @command("doctor")
    def cmd_doctor(args) -> int:
        from .doctor import run_doctor

        return run_doctor(args.workspace, skip_server=args.skip_server)

    sp = ws_arg(sub.add_parser("codex-config", help="print (or --write) Codex config.toml entries for this workspace"))
    sp.add_argument("--write", action="store_true", help="add them to $CODEX_HOME/config.toml (managed block)")
    sp.add_argument("--config", default=None, help="config.toml to write (default: $CODEX_HOME/config.toml)")

    @command("codex-config")
    def cmd_codex_config(args) -> int:
        import os
        from pathlib import Path

        from .doctor import codex_block, write_codex_config
        from .workspace import Workspace

        root = Workspace.find(args.workspace).root
        if not args.write:
            sys.stdout.write(codex_block(root))
            return 0
        path = Path(args.config or Path(os.environ.get("CODEX_HOME", Path.home() / ".codex")) / "config.toml")
        print(f"wrote loopwright's MCP server and hooks to {write_codex_config(root, path)}")
        print("Codex runs hooks only once they are trusted: open Codex and review them with /hooks, or pass "
              "--dangerously-bypass-hook-trust to `codex exec` (hooks that are not trusted silently do not run).")
        return 0
