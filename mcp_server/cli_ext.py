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

    sp = ws_arg(sub.add_parser("cron", help="start agent sessions on the [[schedule]] entries of loopwright.toml"))
    mode = sp.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one tick, for system cron (every minute)")
    mode.add_argument("--install", action="store_true", help="print a crontab line and a systemd unit/timer")

    @command("cron")
    def cmd_cron(args) -> int:
        from .triggers import cron
        from .workspace import Workspace

        root = Workspace.find(args.workspace).root
        if args.install:
            for name, text in cron.install_lines(root, sys.executable).items():
                print(f"# --- {name} ---\n{text.rstrip()}\n")
            return 0
        if args.once:
            for result in cron.tick(root):
                print(result)
            return 0
        return cron.serve_forever(root)

    sp = ws_arg(sub.add_parser("launch", help="run one headless claude / codex / builtin session, recorded in the "
                                              "ledger (budget caps, wall-clock limit)"))
    sp.add_argument("--agent", required=True, choices=["claude", "codex", "builtin"])
    sp.add_argument("--max-minutes", type=float, default=None,
                    help="wall-clock limit; the session's process group is killed after it (default 120)")
    sp.add_argument("--prompt", default=None, help="instead of the default unattended-loop prompt")

    @command("launch")
    def cmd_launch(args) -> int:
        import signal

        from .launch import LaunchError, launch_session, session_report
        from .triggers.common import SESSION_LOCK, SessionLock
        from .workspace import Workspace

        ws = Workspace.find(args.workspace)
        held = SessionLock(ws.state_dir / SESSION_LOCK).try_acquire()
        if held is None:
            print(f"loopwright launch: another session is running in {ws.root} (cron, webhook or launch holds "
                  f"{ws.state_dir / SESSION_LOCK}); try again when it ends", file=sys.stderr)
            return 2

        def on_term(*_):   # the session is killed and recorded, then the launcher exits
            raise SystemExit(143)

        previous = signal.signal(signal.SIGTERM, on_term)
        try:
            with held:
                sid = launch_session(ws.root, agent=args.agent, trigger="manual", max_session_minutes=args.max_minutes,
                                     prompt=args.prompt)
        except LaunchError as e:
            print(f"loopwright launch: {e}", file=sys.stderr)
            return 2
        finally:
            signal.signal(signal.SIGTERM, previous)
        line, exit_code = session_report(ws.root, sid)
        print(line)
        return 0 if exit_code == 0 else 1

    sp = ws_arg(sub.add_parser("webhook", help="receive GitHub / Slack / Jira / signed webhooks that start sessions"))
    sp.add_argument("--host", default=None, help="default: [webhook] host (127.0.0.1)")
    sp.add_argument("--port", type=int, default=None, help="default: [webhook] port")

    @command("webhook")
    def cmd_webhook(args) -> int:
        from .triggers import webhook
        from .workspace import Workspace

        webhook.serve(Workspace.find(args.workspace).root, host=args.host, port=args.port)
        return 0

    ws_arg(sub.add_parser("notify", help="deliver pending Slack / Jira messages now"))

    @command("notify")
    def cmd_notify(args) -> int:
        from .notify.outbox import notify_workspace
        from .workspace import Workspace

        print(notify_workspace(Workspace.find(args.workspace).root))
        return 0
