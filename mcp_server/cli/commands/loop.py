"""The loop by hand: `loopwright serve` (the MCP server agents use), `run-experiment`, `score`,
`revert`, `budget`, `stop`."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp_server.cli.common import deliver_events, open_engine


def serve_args(sp) -> None:
    sp.add_argument("--http", action="store_true", help="streamable HTTP on --host/--port instead of stdio")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8765)
    sp.add_argument("--level", choices=["inner", "outer"], default="inner",
                    help="inner: the research loop's tools (default); outer: the mechanism tools of an outer session")


def serve(args) -> int:
    from mcp_server.loop.workspace import Workspace, WorkspaceError
    from mcp_server.mcp.server import serve as serve_mcp

    start = args.workspace or os.environ.get("LOOPWRIGHT_WORKSPACE") or os.getcwd()
    try:
        root = Workspace.find(start).root
    except WorkspaceError as e:
        # Start anyway: a plugin's server must come up so the agent can read why nothing works.
        print(f"loopwright: {e}; serving anyway, every tool will say so", file=sys.stderr)
        root = Path(start).expanduser().resolve()
    serve_mcp(root, http=args.http, host=args.host, port=args.port, level=args.level)
    return 0


def run_experiment_args(sp) -> None:
    sp.add_argument("description")
    sp.add_argument("--hypothesis")
    sp.add_argument("--confirm-of", type=int)


def run_experiment(args) -> int:
    def progress(step, loss, elapsed, remaining):
        print(f"step {step} loss {loss:.4f} {remaining:.0f}s left", file=sys.stderr)

    from mcp_server.common import procs
    from mcp_server.loop.errors import LoopError

    with open_engine(args, write=True) as eng:
        try:
            last = eng.recent_experiments(limit=1)
        except LoopError:
            last = []
        try:
            res = eng.run_experiment(args.description, args.hypothesis, args.confirm_of, on_progress=progress)
        except KeyboardInterrupt:   # Ctrl-C, SIGTERM, SIGHUP (cli/main.py): say what was stopped and where things are
            print(f"interrupted: {eng.interruption_summary(last[0]['id'] if last else 0)}", file=sys.stderr)
            return procs.stop_exit_code()
        print(res.model_dump_json(indent=2))
    deliver_events(eng.ws.root)
    return 0


def score_args(sp) -> None:
    sp.add_argument("experiment_id", nargs="?", type=int)


def score(args) -> int:
    with open_engine(args, write=True) as eng:
        print(eng.score(args.experiment_id).model_dump_json(indent=2))
    deliver_events(eng.ws.root)
    return 0


def revert_args(sp) -> None:
    sp.add_argument("--to", type=int)


def revert(args) -> int:
    with open_engine(args, write=True) as eng:
        res = eng.revert(args.to)
        print(res.model_dump_json(indent=2))
        if res.backup:
            print(f"loopwright: your uncommitted edit was saved to {res.backup} before the revert", file=sys.stderr)
    return 0


def budget(args) -> int:
    with open_engine(args) as eng:
        print(eng.budget().model_dump_json(indent=2))
    return 0


def stop_args(sp) -> None:
    sp.add_argument("--reason", default="requested by the user")
    sp.add_argument("--clear", action="store_true")


def stop(args) -> int:
    with open_engine(args, write=True) as eng:
        if args.clear:
            eng.clear_stop_request()
            print("stop request cleared")
            return 0
        ended = eng.request_stop(args.reason)
        print(f"stop requested: {args.reason} (clear with `loopwright stop --clear`)")
        print("the campaign ended: budget_spent and campaign_end recorded for Slack/Jira" if ended else
              "a run is in flight: the campaign ends when its result is recorded")
    deliver_events(eng.ws.root)   # the end reaches Slack/Jira before the command exits (the outbox retries)
    return 0
