"""The clients' side: `loopwright doctor` (is everything wired?), `codex-config`, and `guard`
(the hook entry point Claude Code and Codex run)."""
from __future__ import annotations

import os
import sys
from pathlib import Path


def guard_args(sp) -> None:
    sp.add_argument("event", choices=["pre-tool-use", "stop", "session-start"])


def guard(args) -> int:
    from mcp_server.guard import main as guard_main

    return guard_main([args.event])


def doctor_args(sp) -> None:
    sp.add_argument("--skip-server", action="store_true", help="do not start the MCP server")
    sp.add_argument("--as-cron", action="store_true",
                    help="check the installed crontab entry under cron's environment (env -i with only what cron "
                         "and the crontab set): the clients, the state home, the connector tokens")


def doctor(args) -> int:
    from mcp_server.cli.doctor import run_cron_doctor, run_doctor

    if args.as_cron:
        return run_cron_doctor(args.workspace)
    return run_doctor(args.workspace, skip_server=args.skip_server)


def codex_config_args(sp) -> None:
    sp.add_argument("--write", action="store_true", help="add them to $CODEX_HOME/config.toml (managed block)")
    sp.add_argument("--config", default=None, help="config.toml to write (default: $CODEX_HOME/config.toml)")


def codex_config(args) -> int:
    from mcp_server.agents.clients import installed_plugin
    from mcp_server.cli.doctor import codex_block, write_codex_config
    from mcp_server.loop.workspace import Workspace

    root = Workspace.find(args.workspace).root
    plugin = installed_plugin("codex")
    if plugin and args.write:   # a second copy would run every hook twice and replace the plugin's server
        print(f"loopwright codex-config: the loopwright plugin is installed for Codex ({plugin}); it already "
              "brings the MCP server and hooks, so nothing was written. Run `loopwright doctor` to check.",
              file=sys.stderr)
        return 2
    if not args.write:
        sys.stdout.write(codex_block(root))
        return 0
    path = Path(args.config or Path(os.environ.get("CODEX_HOME", Path.home() / ".codex")) / "config.toml")
    try:
        written = write_codex_config(root, path)
    except (RuntimeError, OSError) as e:
        print(f"loopwright codex-config: {e}", file=sys.stderr)
        return 2
    print(f"wrote loopwright's MCP server and hooks to {written}")
    print("Codex runs hooks only once they are trusted: open Codex and review them with /hooks, or pass "
          "--dangerously-bypass-hook-trust to `codex exec` (hooks that are not trusted silently do not run).")
    return 0


def wiring(args) -> int:
    """How each client reaches loopwright in this workspace (one wiring per client, chosen at init), and
    whether that is still true: a plugin installed since, a user-level Codex block, the sandboxes."""
    from mcp_server.agents import clients
    from mcp_server.loop.workspace import Workspace

    ws = Workspace.find(args.workspace)
    chosen = clients.recorded_wiring(ws.root)
    if chosen:
        print("chosen at init: " + ", ".join(f"{c}: {w}" for c, w in chosen.items()))
    bad = 0
    for f in clients.check_wiring(ws.root, ws.state_dir):
        print(f"{'✔' if f.ok else '✘'} {f.what}" + (f"\n    fix: {f.fix}" if not f.ok and f.fix else ""))
        bad += not f.ok
    return 1 if bad else 0
