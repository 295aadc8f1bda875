"""What starts sessions and what tells people: `loopwright cron`, `webhook`, `notify`."""
from __future__ import annotations

import sys


def cron_args(sp) -> None:
    mode = sp.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one tick, for system cron (every minute)")
    mode.add_argument("--install", action="store_true", help="print a crontab line and a systemd unit/timer")


def cron(args) -> int:
    from mcp_server.loop.workspace import Workspace
    from mcp_server.triggers import cron as cron_mod

    root = Workspace.find(args.workspace).root
    if args.install:
        for name, text in cron_mod.install_lines(root, sys.executable).items():
            print(f"# --- {name} ---\n{text.rstrip()}\n")
        return 0
    if args.once:
        results = cron_mod.tick(root)
        for result in results:
            print(result)
        if not results:
            print("nothing due")
        return 0
    return cron_mod.serve_forever(root)


def webhook_args(sp) -> None:
    sp.add_argument("--host", default=None, help="default: [webhook] host (127.0.0.1)")
    sp.add_argument("--port", type=int, default=None, help="default: [webhook] port")


def webhook(args) -> int:
    from mcp_server.loop.workspace import Workspace
    from mcp_server.triggers import webhook as webhook_mod

    webhook_mod.serve(Workspace.find(args.workspace).root, host=args.host, port=args.port)
    return 0


def notify(args) -> int:
    from mcp_server.loop.workspace import Workspace
    from mcp_server.notify.outbox import notify_workspace

    report = notify_workspace(Workspace.find(args.workspace).root)
    print(report)
    if report.failed and not report.delivered:
        print("loopwright notify: every delivery failed (see the errors above); they are retried later",
              file=sys.stderr)
        return 1
    return 0
