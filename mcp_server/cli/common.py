"""Helpers the command modules share."""
from __future__ import annotations

import argparse
import sys


def open_engine(args: argparse.Namespace, write: bool = False):
    """The engine on the command's workspace. A reading command changes nothing (it must not disturb a
    running loop); a writing one (write=True: it runs, scores, reverts or stops) first recovers what a
    killed run left."""
    from mcp_server.loop.engine import Engine

    root = getattr(args, "workspace", None)
    return Engine.open_for_writing(root) if write else Engine(root)


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
