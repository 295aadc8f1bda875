"""The CLI's messages: the state home travels to cron and the doctor's probe, a broken settings file
is repaired through the CLI, file errors and small things are sentences, never raw exceptions."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_server.loop import settings as setmod
from mcp_server.notify.events import redact
from mcp_server.triggers.cron import TickResult, install_lines

from conftest import make_workspace


def cli(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "mcp_server.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)




# -- C: the state home travels --------------------------------------------------------------------

def test_install_lines_carry_the_state_home():
    out = install_lines("/srv/ws", "/opt/venv/bin/python", env={"LOOPWRIGHT_HOME": "/data/lw", "XDG_DATA_HOME": "/x"})
    assert "cd /srv/ws && LOOPWRIGHT_HOME=/data/lw XDG_DATA_HOME=/x /opt/venv/bin/python -m mcp_server.cli cron" \
        in out["crontab"]
    assert 'Environment="LOOPWRIGHT_HOME=/data/lw"\n' in out["service"]
    assert 'Environment="XDG_DATA_HOME=/x"\n' in out["service"]
    bare = install_lines("/srv/ws", "/opt/venv/bin/python", env={})
    assert "LOOPWRIGHT_HOME" not in bare["crontab"] + bare["service"]


def test_cron_install_prints_this_shells_state_home(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus)
    r = cli("cron", "--install", "-w", str(ws.root))
    assert r.returncode == 0, r.stderr
    home = os.environ["LOOPWRIGHT_HOME"]            # set by conftest, as a user's shell would
    assert f"LOOPWRIGHT_HOME={home}" in r.stdout and f'Environment="LOOPWRIGHT_HOME={home}"' in r.stdout


def test_missing_state_dir_names_the_variable_in_effect(tmp_path, small_corpus, monkeypatch):
    from mcp_server.loop.workspace import StateDirError, Workspace

    ws = make_workspace(tmp_path / "ws", small_corpus)
    monkeypatch.setenv("LOOPWRIGHT_HOME", str(tmp_path / "elsewhere"))
    with pytest.raises(StateDirError, match="LOOPWRIGHT_HOME is set"):
        Workspace.open(ws.root)
    monkeypatch.delenv("LOOPWRIGHT_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    with pytest.raises(StateDirError, match="XDG_DATA_HOME is"):
        Workspace.open(ws.root)


def test_doctor_server_probe_uses_the_environment_and_fails_on_a_broken_workspace(tmp_path, small_corpus,
                                                                                   monkeypatch):
    from mcp_server.cli.doctor import _server_check

    ws = make_workspace(tmp_path / "ws", small_corpus)
    [ok] = _server_check(ws.root)          # needs LOOPWRIGHT_HOME passed on: the state is under it
    assert ok.ok and "answers" in ok.what, ok
    monkeypatch.setenv("LOOPWRIGHT_HOME", str(tmp_path / "elsewhere"))
    [bad] = _server_check(ws.root)
    assert not bad.ok and "does not exist" in bad.what, bad


# -- A, B, E: the settings file, broken and repaired ----------------------------------------------

@pytest.fixture
def broken_ws(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus)
    good = ws.settings_path.read_text()
    ws.settings_path.write_text(good + "\n[budget\nmax_experiments = 3\n")
    return ws, good


def test_config_set_on_a_broken_file_says_how_to_fix_it(broken_ws):
    ws, _ = broken_ws
    r = cli("config", "-w", str(ws.root), "set", "budget.max_experiments", "4")
    assert r.returncode == 2 and str(ws.settings_path) in r.stderr and "loopwright config edit" in r.stderr


def test_config_edit_opens_a_broken_file_and_saves_the_repair(broken_ws, tmp_path):
    ws, good = broken_ws
    editor = tmp_path / "fix-editor"
    # an "editor" that repairs the file: the broken table header becomes a valid key under [budget]
    editor.write_text(f"#!{sys.executable}\nimport sys, pathlib\np = pathlib.Path(sys.argv[1])\n"
                      "t = p.read_text()\nassert '[budget\\n' in t, t\n"
                      "p.write_text(t.replace('\\n[budget\\nmax_experiments = 3\\n', '\\n'))\n")
    editor.chmod(0o755)
    r = cli("config", "-w", str(ws.root), "edit", env={"EDITOR": str(editor), "VISUAL": ""})
    assert r.returncode == 0, r.stderr
    assert "broken" in r.stderr and "saved" in r.stdout
    assert setmod.load(ws.settings_path).budget.max_experiments == 100


def test_config_edit_with_a_missing_editor_says_so(broken_ws):
    ws, _ = broken_ws
    r = cli("config", "-w", str(ws.root), "edit", env={"EDITOR": "nonexistent-editor-xyz", "VISUAL": ""})
    assert r.returncode == 2 and "nonexistent-editor-xyz" in r.stderr and "EDITOR" in r.stderr
    assert "Traceback" not in r.stderr


def test_doctor_on_a_broken_settings_file_says_what_is_wrong(broken_ws, capsys):
    from mcp_server.cli.doctor import run_doctor

    ws, _ = broken_ws
    run_doctor(str(ws.root), skip_server=True)
    out = capsys.readouterr().out
    assert "not valid TOML" in out and "loopwright config edit" in out
    assert "check out the campaign branch" not in out


# -- E: file errors ---------------------------------------------------------------------------------

def test_export_tsv_and_codex_config_report_file_errors(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus)
    r = cli("export-tsv", "-w", str(ws.root), "-o", str(tmp_path / "nonexistent" / "dir" / "x.tsv"))
    assert r.returncode == 2 and "cannot write" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[x\n")
    r = cli("codex-config", "-w", str(ws.root), "--write", "--config", str(bad), env={"CODEX_HOME": str(tmp_path)})
    assert r.returncode == 2 and str(bad) in r.stderr and "not valid TOML" in r.stderr, r.stderr
    assert bad.read_text() == "[x\n"


# -- F: small things ----------------------------------------------------------------------------------

def test_short_secret_values_do_not_mangle_text():
    assert redact("Max retries exceeded", ["x"]) == "Max retries exceeded"
    assert redact("token abcdefgh123 leaked", ["abcdefgh123"]) == "token *** leaked"


def test_tick_results_print_as_a_sentence():
    from datetime import datetime, timezone

    line = str(TickResult("0 1 * * * UTC", "started", datetime(2026, 1, 2, 1, 0, tzinfo=timezone.utc), "claude"))
    assert line == "schedule '0 1 * * * UTC': started (fire time 2026-01-02 01:00 UTC): claude"


def test_notify_exits_non_zero_when_every_delivery_failed(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus)
    s = setmod.load(ws.settings_path)
    for key, value in (("slack.channel", "C0RESEARCH"), ("slack.base_url", "http://127.0.0.1:9/api/")):
        s = setmod.set_value(s, key, value)
    setmod.save(ws.settings_path, s)
    with ws.ledger() as led:
        led.add_event(led.campaign()["id"], "campaign_end", {"best": 0.9, "baseline": 0.93}, sinks=["slack"])
    r = cli("notify", "-w", str(ws.root), env={"SLACK_BOT_TOKEN": "xoxb-test-token-1234"})
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "every delivery failed" in r.stderr


def test_report_without_experiments_warns_nothing(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus)
    r = cli("report", "-w", str(ws.root), env={"PYTHONWARNINGS": "default"})
    assert r.returncode == 0, r.stderr
    assert "No artists with labels" not in r.stderr


def test_help_texts():
    r = cli("config", "--help")
    assert "path" in r.stdout
    r = cli("init", "--help")
    assert "CPU time without a GPU" in " ".join(r.stdout.split())
    r = cli("cron", "--help")
    assert "loopwright.toml" not in r.stdout


def test_approve_apply_with_nothing_to_apply_says_so(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus)
    r = cli("approve", "-w", str(ws.root), "--apply")
    assert r.returncode == 0, r.stderr
    assert "nothing to apply" in r.stdout and "No artists" not in r.stderr
    assert Path(ws.root).is_dir()


@pytest.mark.unit
def test_the_plan_line_counts_a_steps_clock_run_in_tokens_not_the_time_budget():
    """The demo trains a fixed number of tokens per run; its plan said "30 s of training" (the time budget, only
    a cap on that clock)."""
    from mcp_server.cli.demo import DEMO_BUDGET_TOKENS, demo_overrides, plan_line
    from mcp_server.loop.config import LoopwrightConfig

    cfg = LoopwrightConfig.model_validate(demo_overrides(4))
    line = plan_line(cfg, 4, baseline=True)
    assert f"s to train {DEMO_BUDGET_TOKENS:,} tokens" in line and "30 s of training" not in line
    # 2 baseline runs + 4 x 2; at most, every experiment retested max_confirms times (a pair each), plus a re-measure
    assert f"~10 runs, ~2 min (up to {2 + 4 * (2 + 2 * cfg.noise.max_confirms) + 2} runs, " in line
    overrides = demo_overrides(4)
    overrides["noise"] = {**overrides["noise"], "spread_alpha": 0.015}
    strict = LoopwrightConfig.model_validate(overrides)
    assert f"(up to {2 + 4 * (2 + 2 * (strict.noise.max_confirms + 1)) + 2} runs, " in plan_line(
        strict, 4, baseline=True)      # the own-spread test allows one retest more
    cpu = LoopwrightConfig.model_validate({"benchmark": {"clock": "cpu", "time_budget": 45}})
    assert "45 s of training" in plan_line(cpu, 2, baseline=False)
