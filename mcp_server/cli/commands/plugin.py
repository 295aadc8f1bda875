"""`loopwright plugin install`: the Claude Code / Codex plugin, written from this installed package."""
from __future__ import annotations

import sys


def plugin_args(sp) -> None:
    sp.add_argument("action", choices=["install"], help="install: write the plugin and its local marketplace")
    sp.add_argument("--dest", default=None,
                    help="folder to write (default: $XDG_DATA_HOME/loopwright-plugin, or ~/.local/share/...)")


def plugin(args) -> int:
    import os

    from mcp_server.agents.plugin import PluginError, can_import, default_dest, write_plugin

    if not can_import(sys.executable, os.environ):
        # e.g. a checkout run through PYTHONPATH: the client starts the server without it
        print(f"loopwright plugin install: {sys.executable} cannot import loopwright and the mcp SDK without "
              "PYTHONPATH, so the client could not start the server. Install loopwright into that Python first "
              '(pip install -e ".[dev]" or pip install loopwright), then run this again.', file=sys.stderr)
        return 2
    dest = args.dest or default_dest()
    try:
        write_plugin(dest, sys.executable)      # sys.executable as is: a venv's python, not what it links to
    except (PluginError, OSError) as e:
        print(f"loopwright plugin install: {e}", file=sys.stderr)
        return 2
    print(f"wrote the loopwright plugin and a local marketplace to {dest}\n"
          f"  its MCP server and hooks run {sys.executable} (whatever PATH the client starts with)\n"
          "Install it in the client, then make workspaces (`loopwright init DIR` wires each client once):\n"
          f"  Claude Code:  claude plugin marketplace add {dest} && claude plugin install loopwright@loopwright\n"
          f"  Codex:        codex plugin marketplace add {dest} && codex plugin add loopwright@loopwright\n"
          "After upgrading loopwright or moving its venv, run this again, then `claude plugin marketplace update "
          "loopwright && claude plugin update loopwright@loopwright`.\n"
          "Check with: loopwright doctor -w DIR")
    return 0
