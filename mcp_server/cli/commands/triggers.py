"""What starts sessions and what tells people: `loopwright cron`, `webhook`, `notify`."""
from __future__ import annotations

import sys


def cron_args(sp) -> None:
    mode = sp.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one tick, for system cron (every minute)")
    mode.add_argument("--install", action="store_true",
                      help="install a crontab entry that ticks every minute (this shell's PATH and state home, "
                           "no secrets; LOOPWRIGHT_CRONTAB=FILE writes that file instead) and print it with a "
                           "systemd unit/timer")
    mode.add_argument("--print", action="store_true", help="only print the crontab line and the systemd unit/timer")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 naming what would make a tick's session fail in this environment "
                           "(`loopwright doctor --as-cron` runs it under the installed entry's environment)")


def cron(args) -> int:
    from mcp_server.loop.workspace import Workspace
    from mcp_server.triggers import cron as cron_mod
    from mcp_server.triggers import crontab

    root = Workspace.find(args.workspace).root
    if args.install or args.print:
        lines = cron_mod.install_lines(root, sys.executable)
        for name, text in lines.items():
            print(f"# --- {name} ---\n{text.rstrip()}\n")
        if args.print:
            return 0
        try:
            where = crontab.write(crontab.with_entry(crontab.read(), root, lines["crontab"]))
        except crontab.CrontabError as e:
            print(f"loopwright cron --install: not installed: {e}", file=sys.stderr)
            return 0 if "not installed" in str(e) else 1
        print(f"installed the crontab entry into {where}. It carries no token: give the job the connector "
              "tokens and the client's API key yourself (a run without a configured connector's token fails "
              "and says so in `loopwright status`). Check it with `loopwright doctor --as-cron`.")
        return 0
    if args.check:
        problems = cron_mod.check(root)
        for p in problems:
            print(f"✘ {p}")
        print("cron check: ok" if not problems else f"cron check: {len(problems)} problem(s)")
        return 1 if problems else 0
    if args.once:
        results = cron_mod.tick(root)
        for result in results:
            print(result)
        if not results:
            print("nothing due")
        failed = [r for r in results if r.outcome == "failed"]
        if failed:
            print(f"loopwright cron --once: {len(failed)} session(s) could not start (see above; "
                  "`loopwright status` shows it too)", file=sys.stderr)
        return 1 if failed else 0
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
