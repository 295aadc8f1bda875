"""`loopwright` command line."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Optional

from mcp_server import __version__

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def command(name: str):
    def wrap(fn):
        COMMANDS[name] = fn
        return fn
    return wrap


def _engine(args):
    from mcp_server.loop.engine import Engine

    return Engine(getattr(args, "workspace", None), recover=False)


@command("init")
def cmd_init(args) -> int:
    from mcp_server.loop.workspace import init_workspace

    from mcp_server.loop.budget import check_time_budget

    try:
        check_time_budget(args.time_budget)
    except ValueError as e:
        print(f"loopwright init: {e}", file=sys.stderr)
        return 2
    ws = init_workspace(args.dir, tag=args.tag, corpus=args.corpus, time_budget=args.time_budget, force=args.force)
    print(f"workspace ready: {ws.root} (campaign '{args.tag}', branch loopwright/{args.tag})")
    print(f"next: `loopwright serve --workspace {ws.root}` for an agent, or "
          f"`loopwright run --agent builtin --workspace {ws.root}`")
    return 0


@command("serve")
def cmd_serve(args) -> int:
    import os

    from mcp_server.mcp.server import serve
    from mcp_server.loop.workspace import Workspace, WorkspaceError

    start = args.workspace or os.environ.get("LOOPWRIGHT_WORKSPACE") or os.getcwd()
    try:
        root = Workspace.find(start).root
    except WorkspaceError as e:
        # Start anyway: a plugin's server must come up so the agent can read why nothing works.
        print(f"loopwright: {e}; serving anyway, every tool will say so", file=sys.stderr)
        root = Path(start).expanduser().resolve()
    serve(root, http=args.http, host=args.host, port=args.port)
    return 0


@command("status")
def cmd_status(args) -> int:
    from rich.console import Console
    from rich.table import Table

    with _engine(args) as eng:
        s, b = eng.summary(), eng.budget()
        rows = eng.recent_experiments(args.limit)
        if args.json:
            print(json.dumps({"summary": s.model_dump(), "budget": b.model_dump(),
                              "recent": [{k: r[k] for k in ("id", "description", "status", "verdict", "val_bpb")}
                                         for r in rows]}, indent=2))
            return 0
        con = Console()
        con.print(f"[bold]campaign[/] {s.tag}  branch {s.branch}  pinned {s.pinned_commit}")
        best = "—" if s.best_val_bpb is None else f"{s.best_val_bpb:.4f}"
        base = "—" if s.baseline_val_bpb is None else f"{s.baseline_val_bpb:.4f}"
        con.print(f"[bold]best[/] {best} (commit {s.best_commit})   baseline {base}   "
                  f"{s.experiments} experiments, [green]{s.kept} kept[/], {s.discarded} discarded, "
                  f"[red]{s.crashed} failed[/]")
        left = lambda v, unit="": "∞" if v is None else f"{v}{unit}"  # noqa: E731
        con.print(f"[bold]budget left[/] {left(b.experiments_left)} experiments, {left(b.hours_left, ' h')}, "
                  f"${left(b.cost_left_usd)}   should_stop={b.should_stop} {'; '.join(b.reasons)}")
        t = Table(title="recent experiments")
        for col in ("id", "description", "status", "verdict", "val_bpb", "commit"):
            t.add_column(col)
        for r in rows:
            colour = {"keep": "green", "discard": "grey50", "retest": "yellow"}.get(r["verdict"] or "", "")
            val = "" if r["val_bpb"] is None else f"{r['val_bpb']:.4f}"
            t.add_row(str(r["id"]), r["description"][:60], r["status"], f"[{colour}]{r['verdict'] or ''}[/]"
                      if colour else (r["verdict"] or ""), val, (r["commit_sha"] or "")[:8])
        con.print(t)
        return 0


@command("export-tsv")
def cmd_export_tsv(args) -> int:
    from mcp_server.report.tsv import export_tsv

    with _engine(args) as eng:
        text = export_tsv(eng.ledger, eng.campaign["id"])
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    return 0


@command("budget")
def cmd_budget(args) -> int:
    with _engine(args) as eng:
        print(eng.budget().model_dump_json(indent=2))
    return 0


@command("stop")
def cmd_stop(args) -> int:
    with _engine(args) as eng:
        if args.clear:
            eng.clear_stop_request()
            print("stop request cleared")
        else:
            eng.request_stop(args.reason)
            print(f"stop requested: {args.reason} (clear with `loopwright stop --clear`)")
    return 0


@command("run-experiment")
def cmd_run_experiment(args) -> int:
    with _engine(args) as eng:
        res = eng.run_experiment(args.description, args.hypothesis, args.confirm_of,
                                 on_progress=lambda s, l, e, r: print(f"step {s} loss {l:.4f} {r:.0f}s left",
                                                                      file=sys.stderr))
        print(res.model_dump_json(indent=2))
    _deliver_events(eng.ws.root)
    return 0


@command("score")
def cmd_score(args) -> int:
    with _engine(args) as eng:
        print(eng.score(args.experiment_id).model_dump_json(indent=2))
    _deliver_events(eng.ws.root)
    return 0


def _deliver_events(root, wait_s: float = 60.0) -> None:
    """The engine records events; a short-lived command sends them before it exits (the outbox
    retries whatever does not go out now)."""
    from mcp_server.notify.outbox import deliver_in_background
    thread = deliver_in_background(root)
    if thread is not None:
        thread.join(wait_s)


@command("revert")
def cmd_revert(args) -> int:
    with _engine(args) as eng:
        print(eng.revert(args.to).model_dump_json(indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="loopwright", description="A closed research loop for coding agents.")
    p.add_argument("--version", action="version", version=f"loopwright {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    def ws_arg(sp):
        sp.add_argument("--workspace", "-w", default=None,
                        help="workspace directory (default: $LOOPWRIGHT_WORKSPACE or the current directory)")
        return sp

    sp = sub.add_parser("init", help="create a workspace (or a new campaign in one)")
    sp.add_argument("dir")
    sp.add_argument("--tag", default="main", help="campaign tag; branch loopwright/<tag>")
    sp.add_argument("--corpus", default="stdlib", help="stdlib (default, offline), tinystories, climbmix or a PATH")
    sp.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="wall-clock seconds each experiment's train.py may run, start-up (imports, data loading, "
                         "compilation) included; at least 30 (default 30)")
    sp.add_argument("--force", action="store_true", help="allow a non-empty directory or an existing git repo")

    sp = ws_arg(sub.add_parser("serve", help="run the MCP server (stdio by default)"))
    sp.add_argument("--http", action="store_true", help="streamable HTTP on --host/--port instead of stdio")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8765)

    sp = ws_arg(sub.add_parser("status", help="campaign, best, budget left, recent experiments"))
    sp.add_argument("--limit", type=int, default=10)
    sp.add_argument("--json", action="store_true")

    sp = ws_arg(sub.add_parser("export-tsv", help="results.tsv in autoresearch's columns"))
    sp.add_argument("--output", "-o", default="-")

    ws_arg(sub.add_parser("budget", help="remaining budget and should_stop"))

    sp = ws_arg(sub.add_parser("stop", help="ask the loop to stop at the next budget check"))
    sp.add_argument("--reason", default="requested by the user")
    sp.add_argument("--clear", action="store_true")

    sp = ws_arg(sub.add_parser("run-experiment", help="run one experiment by hand (as an agent would)"))
    sp.add_argument("description")
    sp.add_argument("--hypothesis")
    sp.add_argument("--confirm-of", type=int)

    sp = ws_arg(sub.add_parser("score", help="score the latest (or a given) experiment"))
    sp.add_argument("experiment_id", nargs="?", type=int)

    sp = ws_arg(sub.add_parser("revert", help="reset train.py to the best (or a given) version"))
    sp.add_argument("--to", type=int)

    _add_extension_parsers(sub, ws_arg)
    return p


def _add_extension_parsers(sub, ws_arg) -> None:
    """Commands owned by other modules register here (guard, doctor, run/demo/report, launch, cron, ...)."""
    from mcp_server.cli import commands as cli_ext

    cli_ext.register(sub, ws_arg, command)
    from mcp_server.cli import replay as cli_replay   # self-contained: `loopwright replay`

    cli_replay.register(sub, ws_arg, command)


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from mcp_server.loop.config import ConfigError
    from mcp_server.loop.engine import LoopError
    from mcp_server.loop.workspace import WorkspaceError

    try:
        return COMMANDS[args.command](args) or 0
    except (LoopError, ConfigError, WorkspaceError) as e:
        print(f"loopwright: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - a message, not a traceback, unless asked for
        if args.debug:
            raise
        print(f"loopwright: {type(e).__name__}: {e}\n(run with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
