"""Sub-commands contributed by the other modules (kept apart so cli.py stays readable)."""
from __future__ import annotations

import sys


def register(sub, ws_arg, command) -> None:
    sp = sub.add_parser("guard", help="hook entry point used by Claude Code and Codex (reads stdin)")
    sp.add_argument("event", choices=["pre-tool-use", "stop", "session-start"])

    @command("guard")
    def cmd_guard(args) -> int:
        from mcp_server.guard import main as guard_main

        return guard_main([args.event])

    sp = ws_arg(sub.add_parser("doctor", help="check the workspace, server, hooks and agent CLIs; say what to fix"))
    sp.add_argument("--skip-server", action="store_true", help="do not start the MCP server")

    @command("doctor")
    def cmd_doctor(args) -> int:
        from mcp_server.cli.doctor import run_doctor

        return run_doctor(args.workspace, skip_server=args.skip_server)

    sp = ws_arg(sub.add_parser("codex-config", help="print (or --write) Codex config.toml entries for this workspace"))
    sp.add_argument("--write", action="store_true", help="add them to $CODEX_HOME/config.toml (managed block)")
    sp.add_argument("--config", default=None, help="config.toml to write (default: $CODEX_HOME/config.toml)")

    @command("codex-config")
    def cmd_codex_config(args) -> int:
        import os
        from pathlib import Path

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

    sp = ws_arg(sub.add_parser("cron", help="start agent sessions on the [[schedule]] entries of loopwright.toml"))
    mode = sp.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one tick, for system cron (every minute)")
    mode.add_argument("--install", action="store_true", help="print a crontab line and a systemd unit/timer")

    @command("cron")
    def cmd_cron(args) -> int:
        from mcp_server.triggers import cron
        from mcp_server.loop.workspace import Workspace

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

        from mcp_server.agents.launch import LaunchError, launch_session, session_report
        from mcp_server.triggers.common import SESSION_LOCK, SessionLock
        from mcp_server.loop.workspace import Workspace

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
        from mcp_server.triggers import webhook
        from mcp_server.loop.workspace import Workspace

        webhook.serve(Workspace.find(args.workspace).root, host=args.host, port=args.port)
        return 0

    ws_arg(sub.add_parser("notify", help="deliver pending Slack / Jira messages now"))

    @command("notify")
    def cmd_notify(args) -> int:
        from mcp_server.notify.outbox import notify_workspace
        from mcp_server.loop.workspace import Workspace

        print(notify_workspace(Workspace.find(args.workspace).root))
        return 0

    # -- the built-in agent, the demo and the report (proposer.py, demo.py, report.py) --------------
    sp = ws_arg(sub.add_parser("run", help="run an agent session on the workspace (the built-in agent needs no "
                                           "API key or network)"))
    sp.add_argument("--agent", choices=["builtin"], default="builtin",
                    help="builtin: the non-LLM proposer over MCP stdio (Claude Code / Codex sessions: see launch)")
    sp.add_argument("-n", type=int, default=None, help="experiments to run in this session "
                                                      "(default: until budget_check says stop)")
    sp.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="wall-clock seconds for this session: no experiment starts that would not finish in time "
                         "(the per-experiment training budget is fixed by the workspace)")
    sp.add_argument("--no-mechanisms", action="store_true", help="plain hill climb: do not consult suggest_next")
    sp.add_argument("--seed", type=int, default=0, help="seed of the agent's own choices (reproducible runs)")

    @command("run")
    def cmd_run(args) -> int:
        from rich.console import Console

        from mcp_server.cli.demo import Display, ProgressState
        from mcp_server.agents.builtin import AgentError, run_builtin
        from mcp_server.loop.workspace import Workspace

        if args.n is not None and args.n < 0:
            print("loopwright run: -n must be >= 0", file=sys.stderr)
            return 2
        if args.time_budget is not None and args.time_budget <= 0:
            print("loopwright run: --time-budget must be a positive number of seconds", file=sys.stderr)
            return 2
        ws = Workspace.find(args.workspace)
        console = Console()
        state = ProgressState(f"loopwright run · {ws.root.name} · built-in agent, seed {args.seed}", n=args.n)
        if args.time_budget:
            state.deadline = state.started + args.time_budget
        try:
            with Display(state, console) as display:
                res = run_builtin(ws.root, n=args.n, wall_seconds=args.time_budget,
                                  mechanisms=not args.no_mechanisms, seed=args.seed, observer=display)
        except AgentError as e:
            print(f"loopwright run: {e}", file=sys.stderr)
            return 1
        best = "—" if res.best is None else f"{res.best:.4f}"
        base = "—" if res.baseline is None else f"{res.baseline:.4f}"
        console.print(f"{len(res.attempts)} experiment(s), {res.kept} kept in {res.seconds:.0f} s; best {best} "
                      f"(baseline {base}). Stopped: {res.stopped_because}. `loopwright report` writes the report.")
        return 0

    sp = sub.add_parser("demo", help="the main job in one command: a fresh workspace, a short built-in-agent "
                                     "campaign shown live, and the report (no agent, API key or network needed)")
    sp.add_argument("dir", nargs="?", default=None, help="workspace directory (default: a new temporary one)")
    sp.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="training seconds per experiment for the new workspace (default 30)")
    sp.add_argument("-n", type=int, default=None, help="experiments after the baseline (default 8)")
    sp.add_argument("--minutes", type=float, default=None,
                    help="wall-clock cap: no experiment starts that would end after it (default 6)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--no-mechanisms", action="store_true")

    @command("demo")
    def cmd_demo(args) -> int:
        from mcp_server.cli import demo

        if args.time_budget is not None and args.time_budget <= 0:
            print("loopwright demo: --time-budget must be a positive number of seconds", file=sys.stderr)
            return 2
        if args.n is not None and args.n < 1:
            print("loopwright demo: -n must be at least 1", file=sys.stderr)
            return 2
        if args.minutes is not None and args.minutes <= 0:
            print("loopwright demo: --minutes must be positive", file=sys.stderr)
            return 2
        demo.run_demo(args.dir, time_budget=args.time_budget or demo.DEMO_TIME_BUDGET,
                      n=args.n or demo.DEMO_EXPERIMENTS, seed=args.seed, minutes=args.minutes or demo.DEMO_MINUTES,
                      mechanisms=not args.no_mechanisms)
        return 0

    ws_arg(sub.add_parser("report", help="write progress.png, report.md and results.tsv to .loopwright/reports/"))

    @command("report")
    def cmd_report(args) -> int:
        from mcp_server.report.writer import write_report

        files = write_report(args.workspace)
        print(f"{files.data.title}")
        for p in (files.markdown, files.plot.path, files.tsv):
            print(p)
        return 0
