"""The `loopwright` command line: one lazy registry, every command reachable, errors as messages."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mcp_server.cli import main as cli_main
from mcp_server.cli.main import build_parser
from mcp_server.cli.registry import COMMANDS, Command, register

from conftest import make_workspace

EXPECTED = {"init", "status", "export-tsv", "report", "serve", "run-experiment", "score", "revert", "budget",
            "stop", "replay", "run", "demo", "launch", "cron", "webhook", "notify", "doctor", "codex-config", "guard",
            "dashboard"}


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mcp_server.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_help_lists_every_command_without_importing_the_loop():
    code = textwrap.dedent("""
        import sys
        from mcp_server.cli.main import main
        try:
            main(["--help"])
        except SystemExit:
            pass
        heavy = sorted(m for m in ("mcp_server.loop.engine", "torch", "mcp", "pydantic") if m in sys.modules)
        print("HEAVY=" + ",".join(heavy), file=sys.stderr)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    listed = {line.split()[0] for line in r.stdout.splitlines() if line.startswith("    ") and line.split()}
    assert EXPECTED <= listed, EXPECTED - listed
    assert set(COMMANDS) <= listed
    assert "HEAVY=\n" in r.stderr, r.stderr


def test_every_registered_command_loads_and_builds_its_arguments():
    parser = build_parser(full=True)            # imports every command module
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)
    for cmd in COMMANDS.values():
        assert callable(cmd.handler()), cmd
        has_ws = any("--workspace" in a.option_strings for a in sub.choices[cmd.name]._actions)
        assert has_ws == cmd.workspace, cmd.name


def test_a_command_gets_its_own_arguments_only_when_named():
    args = build_parser(["stop", "--reason", "r"]).parse_args(["stop", "--reason", "r"])
    assert (args.command, args.reason, args.clear) == ("stop", "r", False)
    with pytest.raises(SystemExit):
        build_parser(["status"]).parse_args(["score", "3"])    # score's arguments were not built


def test_registry_refuses_duplicates_and_bad_targets():
    with pytest.raises(ValueError, match="declared twice"):
        register(Command("stop", "loop:stop", "again"))
    with pytest.raises(ValueError, match="module:function"):
        register(Command("x-new", "loop.stop", "no colon"))


def test_a_registered_command_runs_through_main(monkeypatch, capsys):
    import types
    mod = types.ModuleType("lw_test_cmds")
    mod.hello_args = lambda sp: sp.add_argument("--who", default="world")
    mod.hello = lambda args: print(f"hello {args.who}") or 3
    monkeypatch.setitem(sys.modules, "lw_test_cmds", mod)
    monkeypatch.setitem(COMMANDS, "hello", Command("hello", "lw_test_cmds.x:hello", "say hello", workspace=False))
    monkeypatch.setitem(sys.modules, "lw_test_cmds.x", mod)
    assert cli_main(["hello", "--who", "loop"]) == 3
    assert capsys.readouterr().out == "hello loop\n"


def test_loop_errors_are_a_message_and_exit_2(tmp_path):
    r = _cli("status", "--workspace", str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("loopwright: ") and "Traceback" not in r.stderr


def test_unknown_command_is_a_usage_error():
    r = _cli("no-such-command")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_stop_and_clear_through_the_engine(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus)
    assert cli_main(["stop", "--reason", "lunch", "-w", str(ws.root)]) == 0
    from mcp_server.loop.engine import Engine
    with Engine(ws.root) as eng:
        b = eng.budget()
        assert b.should_stop and b.stop_requested == "lunch" and "stop requested: lunch" in b.reasons
    assert cli_main(["stop", "--clear", "-w", str(ws.root)]) == 0
    with Engine(ws.root) as eng:
        assert eng.budget().stop_requested is None
