"""Helpers the command modules share."""
from __future__ import annotations

import argparse
import sys


def open_engine(args: argparse.Namespace):
    """The engine on the command's workspace (no crash recovery: a command must not disturb a running loop)."""
    from mcp_server.loop.engine import Engine

    return Engine(getattr(args, "workspace", None), recover=False)


def deliver_events(root, wait_s: float = 60.0) -> None:
    """The engine records events; a short-lived command sends them before it exits (the outbox
    retries whatever does not go out now)."""
    from mcp_server.notify.outbox import deliver_in_background

    thread = deliver_in_background(root)
    if thread is not None:
        thread.join(wait_s)


def usage_error(command: str, message: str) -> int:
    print(f"loopwright {command}: {message}", file=sys.stderr)
    return 2
