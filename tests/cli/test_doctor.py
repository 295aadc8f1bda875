"""`loopwright doctor`, init and the plugin/config writers: hooks that never ran, double wiring,
the stdlib corpus warning, plugins that cannot start from this PATH."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import make_workspace


# -- item 5: a session whose hooks never fired is noticed -----------------------------------------
def _stand_in_client(path, runs_hooks: bool):
    """A stand-in `codex` for the launcher: like a Codex whose hooks are untrusted, it does its work without
    running them; or, like a trusted one, it runs the guard's SessionStart hook first."""
    hook = (f"printf '%s' '{{\"hook_event_name\": \"SessionStart\", \"session_id\": \"s-1\", \"cwd\": \"'\"$PWD\"'\"}}' "
            f"| {sys.executable} -m mcp_server.guard session-start >/dev/null\n") if runs_hooks else ""
    path.write_text("#!/bin/sh\n" + hook + 'echo \'{"type":"turn.completed","usage":{}}\'\n')
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("runs_hooks", [False, True])
def test_launcher_reports_a_session_whose_hooks_never_ran(tmp_path, small_corpus, monkeypatch, capsys, runs_hooks):
    import json

    from mcp_server.agents import clients
    from mcp_server.agents.launch import launch_session

    ws = make_workspace(tmp_path / "ws", small_corpus)
    monkeypatch.setenv("LOOPWRIGHT_CODEX_BIN", str(_stand_in_client(tmp_path / "codex", runs_hooks)))
    sid = launch_session(ws.root, "codex", max_session_minutes=2)
    with ws.ledger() as ledger:
        detail = json.loads(ledger.session(sid)["detail"])
    err = capsys.readouterr().err
    if runs_hooks:
        assert "hooks_never_ran" not in detail and "never ran" not in err
        assert clients.last_hook_heartbeat(ws.root) is not None
    else:
        assert detail["hooks_never_ran"] is True
        assert "hooks never ran" in err and "/hooks" in err


def test_codex_config_write_refuses_to_double_wire_a_plugin_user(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus)
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text('[plugins."loopwright@loopwright"]\nenabled = true\n')
    env = {**os.environ, "CODEX_HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "mcp_server.cli", "codex-config", "--write", "-w", str(ws.root)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "plugin is installed for Codex" in r.stderr
    assert "mcp_servers" not in (home / "config.toml").read_text()


# -- items 4-5 and issue 10 item 5 through the CLI: doctor is green for one wiring, red for two ------
def test_doctor_green_for_one_wiring_and_red_for_a_double(tmp_path, small_corpus):
    import json

    ws = make_workspace(tmp_path / "ws", small_corpus)          # wired by its own files (no plugin)
    env = {**os.environ, "CLAUDE_CONFIG_DIR": str(tmp_path / "cc"), "CODEX_HOME": str(tmp_path / "cx")}
    doctor = [sys.executable, "-m", "mcp_server.cli", "doctor", "--skip-server", "-w", str(ws.root)]
    r = subprocess.run(doctor, capture_output=True, text=True, env=env, timeout=300)
    assert "✔ Claude Code: wired by the workspace's own files" in r.stdout
    assert "✔ Claude Code sandbox on" in r.stdout and "✔ Codex permission profile 'loopwright'" in r.stdout
    assert "wired twice" not in r.stdout
    assert f"✔ corpus {small_corpus}: held-out text out of train.py's reach" in r.stdout
    # the README's old double wiring: the plugin installed on top of the workspace's files
    (tmp_path / "cc" / "plugins").mkdir(parents=True)
    (tmp_path / "cc" / "plugins" / "installed_plugins.json").write_text(json.dumps(
        {"version": 2, "plugins": {"loopwright@loopwright": [{"scope": "user"}]}}))
    r = subprocess.run(doctor, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1 and "✘ Claude Code: wired twice" in r.stdout
    assert "claude plugin disable loopwright@loopwright" in r.stdout
    shown = subprocess.run([sys.executable, "-m", "mcp_server.cli", "wiring", "-w", str(ws.root)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 1 and "wired twice" in shown.stdout
    # a workspace made with the plugin installed (auto) carries no copy: green
    ws2 = tmp_path / "ws2"
    made = subprocess.run([sys.executable, "-m", "mcp_server.cli", "init", str(ws2), "--corpus", str(small_corpus)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert made.returncode == 0 and "Claude Code via its plugin" in made.stdout and not made.stderr, made.stderr
    assert not (ws2 / ".mcp.json").exists()
    r = subprocess.run(doctor[:-1] + [str(ws2)], capture_output=True, text=True, env=env, timeout=300)
    assert "✔ Claude Code: loopwright plugin installed" in r.stdout and "wired twice" not in r.stdout
    assert "✔ Claude Code sandbox on" in r.stdout


def test_init_and_doctor_say_the_stdlib_corpus_cannot_stop_a_memorising_train_py(tmp_path):
    """Red team, 2026-12-01: val/test of the stdlib corpus were rebuilt inside the sandbox from the
    interpreter's own sources and memorised (a forged keep). No sandbox that runs Python hides them; a
    user must hear it where the corpus is chosen, and again from doctor."""
    cli = [sys.executable, "-m", "mcp_server.cli"]
    r = subprocess.run([*cli, "init", str(tmp_path / "ws"), "--corpus", "stdlib"], capture_output=True, text=True,
                       timeout=300)   # an option now; the default, stdlib-hidden, hides its val/test modules
    assert r.returncode == 0, r.stderr
    assert "note: the stdlib corpus is for trying loopwright" in r.stdout and "--corpus PATH" in r.stdout
    r = subprocess.run([*cli, "doctor", "--skip-server", "-w", str(tmp_path / "ws")], capture_output=True,
                       text=True, timeout=300)
    assert "corpus stdlib: held-out text readable on this machine" in r.stdout
    assert "memorise them" in r.stdout


def test_init_again_says_a_new_campaign_started_and_plugin_wiring_without_the_plugin_warns(tmp_path, small_corpus):
    """New-user trial: a second `init` silently switched campaigns; `--wiring plugin` with no plugin
    installed printed "via the installed plugin"."""
    cli = [sys.executable, "-m", "mcp_server.cli"]
    env = {**os.environ, "CLAUDE_CONFIG_DIR": str(tmp_path / "cc"), "CODEX_HOME": str(tmp_path / "cx")}
    ws = tmp_path / "ws"
    r = subprocess.run([*cli, "init", str(ws), "--tag", "nov29", "--corpus", str(small_corpus), "--wiring", "plugin"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "the loopwright plugin is not installed for Claude Code" in r.stderr
    assert "the loopwright plugin is not installed for Codex" in r.stderr
    assert "installed plugin" not in r.stdout
    r = subprocess.run([*cli, "init", str(ws), "--tag", "dec01"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "new campaign 'dec01' on branch loopwright/dec01" in r.stdout and "git checkout loopwright/nov29" in r.stdout


# -- issue 24 item 9: doctor flags a plugin whose MCP server cannot start from this PATH ------------
def _install_in_claude(config, root):
    """What `claude plugin install` records (Claude Code 2.1.x: installed_plugins.json, version 2)."""
    import json

    (config / "plugins").mkdir(parents=True)
    (config / "plugins" / "installed_plugins.json").write_text(json.dumps({"version": 2, "plugins": {
        "loopwright@loopwright": [{"scope": "user", "installPath": str(root), "version": "0.1.0"}]}}))


def _bare_path(tmp_path):
    import shutil

    bare = tmp_path / "bare-bin"
    bare.mkdir()
    (bare / "sh").symlink_to(shutil.which("sh"))
    return str(bare)


@pytest.mark.unit
def test_doctor_flags_the_checkout_plugin_when_loopwright_is_not_on_path(tmp_path, monkeypatch, capsys):
    import shutil
    from pathlib import Path

    from mcp_server.cli.doctor import run_doctor

    repo = Path(__file__).resolve().parents[2]
    cached = tmp_path / "cache" / "loopwright"          # Claude Code's copy of the checkout's plugin
    shutil.copytree(repo / "bin", cached / "bin")
    shutil.copy2(repo / ".mcp.json", cached / ".mcp.json")
    _install_in_claude(tmp_path / "claude", cached)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "claude"))
    monkeypatch.setenv("PATH", _bare_path(tmp_path))
    monkeypatch.delenv("LOOPWRIGHT_PYTHON", raising=False)
    monkeypatch.chdir(tmp_path)
    assert run_doctor(None, skip_server=True) == 1
    out = capsys.readouterr().out
    assert "✘ Claude Code: the loopwright plugin's MCP server launcher finds no loopwright" in out, out
    assert "loopwright plugin install" in out
    # no git on that PATH either: one line that says so, not GitPython's ImportError (it passed only where
    # another test had imported gitops first)
    assert "✘ git is not on PATH" in out and "install git" in out, out


@pytest.mark.unit
def test_doctor_passes_a_plugin_written_by_plugin_install_and_flags_a_vanished_interpreter(tmp_path):
    import json
    import sys

    from mcp_server.agents.plugin import plugin_checks, write_plugin

    write_plugin(tmp_path / "plugin", sys.executable)
    _install_in_claude(tmp_path / "claude", tmp_path / "plugin")
    env = {"CLAUDE_CONFIG_DIR": str(tmp_path / "claude"), "PATH": _bare_path(tmp_path), "HOME": str(tmp_path)}
    (finding,) = plugin_checks(env)
    assert finding.ok and "resolves" in finding.what, finding
    mcp = tmp_path / "plugin" / ".mcp.json"
    data = json.loads(mcp.read_text())
    data["mcpServers"]["loopwright"]["command"] = str(tmp_path / "old-venv" / "bin" / "python")
    mcp.write_text(json.dumps(data))
    (finding,) = plugin_checks(env)
    assert not finding.ok and "not found" in finding.what and "loopwright plugin install" in finding.fix


@pytest.mark.unit
def test_plugin_install_refuses_a_folder_that_is_not_its_own(tmp_path):
    import sys

    from mcp_server.agents.plugin import PluginError, write_plugin

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(PluginError, match="not empty"):
        write_plugin(tmp_path, sys.executable)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    write_plugin(tmp_path / "p", sys.executable)
    write_plugin(tmp_path / "p", sys.executable)          # its own: replaced
    assert (tmp_path / "p" / ".mcp.json").is_file()


@pytest.mark.unit
def test_doctor_checks_the_codex_plugin_copy_too(tmp_path):
    import shutil
    import sys
    from pathlib import Path

    from mcp_server.agents.plugin import plugin_checks, write_plugin

    repo = Path(__file__).resolve().parents[2]
    home = tmp_path / "codex"
    (home).mkdir()
    (home / "config.toml").write_text('[plugins."loopwright@loopwright"]\nenabled = true\n')
    cached = home / "plugins" / "cache" / "loopwright" / "loopwright" / "0.1.0"   # what `codex plugin add` copies
    shutil.copytree(repo / "bin", cached / "bin")
    shutil.copytree(repo / ".codex-plugin", cached / ".codex-plugin")
    env = {"CODEX_HOME": str(home), "CLAUDE_CONFIG_DIR": str(tmp_path / "none"), "PATH": _bare_path(tmp_path),
           "HOME": str(tmp_path)}
    (finding,) = plugin_checks(env)
    assert not finding.ok and finding.what.startswith("Codex:") and "finds no loopwright" in finding.what, finding
    shutil.rmtree(cached)
    write_plugin(cached, sys.executable)
    (finding,) = plugin_checks(env)
    assert finding.ok and sys.executable in finding.what, finding


@pytest.mark.unit
def test_the_written_plugin_guard_blocks_when_its_python_is_gone(tmp_path):
    import json

    from mcp_server.agents.plugin import plugin_files

    hooks = json.loads(plugin_files(str(tmp_path / "gone" / "bin" / "python"))["hooks/hooks.json"])["hooks"]
    r = subprocess.run(["/bin/sh", "-c", hooks["PreToolUse"][0]["hooks"][0]["command"]], input="{}",
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)      # blocks in Claude Code and Codex alike
