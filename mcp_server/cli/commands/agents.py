"""Agents: `loopwright run` (the built-in agent), `demo`, `launch` (a headless claude / codex /
builtin session recorded in the ledger)."""
from __future__ import annotations

import sys

from mcp_server.cli.common import usage_error


def run_args(sp) -> None:
    sp.add_argument("--agent", choices=["builtin"], default="builtin",
                    help="builtin: the non-LLM proposer over MCP stdio (Claude Code / Codex sessions: see launch)")
    sp.add_argument("-n", type=int, default=None, help="experiments to run in this session "
                                                      "(default: until budget_check says stop)")
    sp.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="wall-clock seconds for this session: no experiment starts that would not finish in time "
                         "(the per-experiment training budget is fixed by the workspace)")
    sp.add_argument("--no-mechanisms", action="store_true", help="plain hill climb: do not consult suggest_next")
    sp.add_argument("--seed", type=int, default=0, help="seed of the agent's own choices (reproducible runs)")
    sp.add_argument("--parallel", type=int, default=None, metavar="N",
                    help="candidates in flight at once, through submit_experiment / wait on the workspace's executor "
                         "(default: its [executor] parallel setting, 1 unless set; 1 on the local executor = one "
                         "experiment at a time with run_experiment / score)")


def run(args) -> int:
    from rich.console import Console

    from mcp_server.agents.builtin import AgentError, run_builtin
    from mcp_server.cli.demo import Display, ProgressState, plan_line
    from mcp_server.loop.targets import metric_label, shown
    from mcp_server.loop.workspace import Workspace

    if args.n is not None and args.n < 0:
        return usage_error("run", "-n must be >= 0")
    if args.time_budget is not None and args.time_budget <= 0:
        return usage_error("run", "--time-budget must be a positive number of seconds")
    if args.parallel is not None and args.parallel < 1:
        return usage_error("run", "--parallel must be at least 1 (1 = one experiment at a time)")
    ws = Workspace.find(args.workspace)
    console = Console()
    ex = ws.cfg.executor
    parallel = ex.parallel if args.parallel is None else args.parallel
    if parallel > ex.parallel:
        console.print(f"note: {parallel} candidates in flight but the {ex.kind} executor runs {ex.parallel} run(s) at "
                      f"once (each candidate is {ws.cfg.noise.baseline_seeds} paired runs); the rest queue. "
                      f"`loopwright config set executor.parallel {parallel}` runs more at once.")
    state = ProgressState(f"loopwright run · {ws.root.name} · built-in agent, seed {args.seed}"
                          + (f", {parallel} in parallel on {ex.kind}" if parallel > 1 or ex.kind != "local" else ""),
                          n=args.n, metric=metric_label(ws.cfg),
                          sign=1.0 if ws.cfg.target is None else ws.cfg.target.sign())
    if args.time_budget:
        state.deadline = state.started + args.time_budget
    with ws.ledger() as ledger:
        c = ledger.campaign()
        measured = bool(c and ledger.baseline_samples(c["id"]))
    console.print(plan_line(ws.cfg, args.n, baseline=not measured), highlight=False)
    try:
        with Display(state, console) as display:
            res = run_builtin(ws.root, n=args.n, wall_seconds=args.time_budget,
                              mechanisms=not args.no_mechanisms, seed=args.seed, observer=display, parallel=parallel)
    except AgentError as e:
        print(f"loopwright run: {e}", file=sys.stderr)
        return 1
    best = "—" if res.best is None else f"{shown(ws.cfg, res.best):.4f}"
    base = "—" if res.baseline is None else f"{shown(ws.cfg, res.baseline):.4f}"
    console.print(f"{len(res.attempts)} experiment(s), {res.kept} kept in {res.seconds:.0f} s; best {best} "
                  f"(baseline {base}). Stopped: {res.stopped_because}. `loopwright report` writes the report.")
    return 0


def demo_args(sp) -> None:
    sp.add_argument("dir", nargs="?", default=None, help="workspace directory (default: a new temporary one)")
    sp.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="training seconds per experiment for the new workspace (default 30)")
    sp.add_argument("-n", type=int, default=None, help="experiments after the baseline (default 4; each is "
                                                      "one training run per seed, 2 seeds)")
    sp.add_argument("--minutes", type=float, default=None,
                    help="optional wall-clock cap: after the first 4 experiments, none starts that would end after "
                         "it (default: none; the demo is capped by its work)")
    sp.add_argument("--seed", type=int, default=0,
                    help="seed of the agent's choices and of the campaign's training seeds (1001 + 1000 x SEED on)")
    sp.add_argument("--no-mechanisms", action="store_true")
    sp.add_argument("--parallel", type=int, default=1, metavar="N",
                    help="candidates in flight at once, N runs at once on this machine (default 1: one at a time)")


def demo(args) -> int:
    from mcp_server.cli import demo as demo_mod

    if args.time_budget is not None and args.time_budget <= 0:
        return usage_error("demo", "--time-budget must be a positive number of seconds")
    if args.n is not None and args.n < 1:
        return usage_error("demo", "-n must be at least 1")
    if args.minutes is not None and args.minutes <= 0:
        return usage_error("demo", "--minutes must be positive")
    if args.parallel < 1:
        return usage_error("demo", "--parallel must be at least 1 (1 = one experiment at a time)")
    demo_mod.run_demo(args.dir, time_budget=args.time_budget or demo_mod.DEMO_TIME_BUDGET,
                      n=args.n or demo_mod.DEMO_EXPERIMENTS, seed=args.seed,
                      minutes=args.minutes, mechanisms=not args.no_mechanisms,
                      parallel=args.parallel)
    return 0


def launch_args(sp) -> None:
    sp.add_argument("--agent", required=True, choices=["claude", "codex", "builtin"])
    sp.add_argument("--max-minutes", type=float, default=None,
                    help="wall-clock limit; the session's process group is killed after it (default 120)")
    sp.add_argument("--prompt", default=None, help="instead of the default unattended-loop prompt")
    sp.add_argument("--level", choices=["inner", "outer"], default="inner",
                    help="inner: the research loop (default); outer: a session that reads the trace and proposes, "
                         "activates and reverts search mechanisms (builtin: one step of the built-in outer loop)")


def launch(args) -> int:
    import signal

    from mcp_server.agents.launch import LaunchError, launch_session, session_report
    from mcp_server.loop.workspace import Workspace
    from mcp_server.triggers.common import SESSION_LOCK, SessionLock

    ws = Workspace.find(args.workspace)
    held = SessionLock(ws.state_dir / SESSION_LOCK).try_acquire()
    if held is None:
        return usage_error("launch", f"another session is running in {ws.root} (cron, webhook or launch holds "
                                     f"{ws.state_dir / SESSION_LOCK}); try again when it ends")

    def on_term(*_):   # the session is killed and recorded, then the launcher exits
        raise SystemExit(143)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        with held:
            sid = launch_session(ws.root, agent=args.agent, trigger="manual", max_session_minutes=args.max_minutes,
                                 prompt=args.prompt, level=args.level)
    except LaunchError as e:
        return usage_error("launch", str(e))
    finally:
        signal.signal(signal.SIGTERM, previous)
    line, exit_code = session_report(ws.root, sid)
    print(line)
    return 0 if exit_code == 0 else 1
