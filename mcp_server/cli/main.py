"""`loopwright` command line: the global options, the commands from the registry, and the one
place that turns the loop's errors into a message and an exit status."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Optional

from mcp_server import __version__
from mcp_server.cli.registry import COMMANDS, add_workspace_arg, chosen_command

# Errors whose message is for the user (no traceback): (module, class). Looked up only in modules
# the command already imported, so a command that never touched the engine does not import it here.
_USER_ERRORS = (("mcp_server.loop.engine", "LoopError"), ("mcp_server.loop.config", "ConfigError"),
                ("mcp_server.loop.workspace", "WorkspaceError"), ("mcp_server.loop.sandbox", "SandboxUnavailable"))


# Commands that run experiments (directly or through an agent's MCP server) take --unsafe-no-sandbox.
UNSAFE_COMMANDS = ("serve", "run-experiment", "run", "demo")


def build_parser(argv: Optional[list[str]] = None, full: bool = False) -> argparse.ArgumentParser:
    """Every command is listed; only the one named in argv (or all, with full=True) gets its own
    arguments, which imports its module."""
    p = argparse.ArgumentParser(prog="loopwright", description="A closed research loop for coding agents.")
    p.add_argument("--version", action="version", version=f"loopwright {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, metavar="<command>")
    chosen = chosen_command(list(argv or []))
    for cmd in COMMANDS.values():
        sp = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if cmd.workspace:
            add_workspace_arg(sp)
        if cmd.name in UNSAFE_COMMANDS:
            sp.add_argument("--unsafe-no-sandbox", action="store_true",
                            help="DANGEROUS: run train.py and the evaluator without an OS sandbox when none can "
                                 "be made (agent-written code could then forge results); warned and recorded")
        if full or cmd.name == chosen:
            builder = cmd.args_builder()
            if builder is not None:
                builder(sp)
    return p


def _user_errors() -> tuple[type[BaseException], ...]:
    return tuple(getattr(sys.modules[mod], name) for mod, name in _USER_ERRORS if mod in sys.modules)


_STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def _stop_on_signals() -> dict[int, object]:
    """SIGTERM and SIGHUP take the path of Ctrl-C (KeyboardInterrupt): a command that is training records the
    run as interrupted, never as a crash of the change, and puts the tree back. Each also tells the process
    it is ending (common/procs.py), so a run it loses meanwhile is not held against the change. A signal
    the caller set to be ignored (nohup) stays ignored. Returns the handlers replaced."""
    from mcp_server.common import procs

    def on_signal(signum, _frame):
        procs.note_stopping(signum)
        raise KeyboardInterrupt

    replaced: dict[int, object] = {}
    if threading.current_thread() is not threading.main_thread():
        return replaced   # main() called from a thread (a test): signals are the main thread's business
    for name in _STOP_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        current = signal.getsignal(sig)
        if current in (signal.SIG_DFL, signal.default_int_handler):
            replaced[sig] = signal.signal(sig, on_signal)
    return replaced


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    if getattr(args, "unsafe_no_sandbox", False):
        from mcp_server.loop import sandbox  # sets LOOPWRIGHT_UNSAFE_NO_SANDBOX for this process and its children
        sandbox.allow_unsafe()
    replaced = _stop_on_signals()
    try:
        return COMMANDS[args.command].handler()(args) or 0
    except KeyboardInterrupt:
        # a command that trains says itself what was interrupted (cli/commands/loop.py); the rest get a line
        from mcp_server.common import procs

        print(f"loopwright {args.command}: interrupted", file=sys.stderr)
        return procs.stop_exit_code()
    except Exception as e:  # noqa: BLE001 - a message, not a traceback, unless asked for
        if isinstance(e, _user_errors()):
            print(f"loopwright: {e}", file=sys.stderr)
            return 2
        if args.debug:
            raise
        print(f"loopwright: {type(e).__name__}: {e}\n(run with --debug for the traceback)", file=sys.stderr)
        return 1
    finally:
        for sig, previous in replaced.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
