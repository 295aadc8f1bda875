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
