"""`loopwright dashboard`: the live browser view (mcp_server/dashboard/). A person's command: the guard
refuses it to the agent, since whoever starts it holds the token that approves changes."""
from __future__ import annotations

import getpass
import os
import sys

DEFAULT_PORT = 8377


def dashboard_args(sp) -> None:
    sp.add_argument("--all", action="store_true", help="every workspace under this user's state home "
                                                      "(instead of --workspace)")
    sp.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default: {DEFAULT_PORT}")
    sp.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1 (loopback; anything else needs "
                                                        "--allow-remote and a login)")
    sp.add_argument("--allow-remote", action="store_true",
                    help="allow a non-loopback --host; needs $LOOPWRIGHT_DASHBOARD_PASSWORD (HTTP Basic login)")
    sp.add_argument("--read-only", action="store_true", help="show everything, change nothing (no Approve/Reject)")
    sp.add_argument("--by", default=None, help="who decides, recorded with each decision "
                                               "(default: $LOOPWRIGHT_USER or your login name)")


def dashboard(args) -> int:
    from mcp_server.dashboard import app, auth, data
    from mcp_server.loop.workspace import Workspace, WorkspaceError

    if args.all and args.workspace:
        print("loopwright dashboard: give --workspace DIR or --all, not both", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"loopwright dashboard: --port {args.port} is not a TCP port (1-65535)", file=sys.stderr)
        return 2
    try:
        roots = data.discover() if args.all else [Workspace.find(args.workspace).root]
    except WorkspaceError as e:
        print(f"loopwright dashboard: {e}", file=sys.stderr)
        return 2
    who = args.by or os.environ.get("LOOPWRIGHT_USER") or getpass.getuser()

    def started(url: str) -> None:
        mode = " (read-only)" if args.read_only else ""
        print(f"loopwright dashboard{mode}: {len(roots)} workspace(s). Open this URL (it carries the token that "
              f"lets this browser approve and reject; keep it to yourself):\n    {url}", flush=True)

    try:
        app.serve(roots, args.host, args.port, args.allow_remote, args.read_only, who, on_start=started)
    except (auth.AuthError, data.DashboardError) as e:
        print(f"loopwright dashboard: {e}", file=sys.stderr)
        return 2
    return 0
