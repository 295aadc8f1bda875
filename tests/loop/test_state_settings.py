"""The loop's state outside the workspace, settings that stick, migration, and the small fixes
of issue 10 item 8 (no training runs here: these are the fast checks)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib

from mcp_server.loop import gitops, integrity
from mcp_server.loop import settings as setmod
from mcp_server.loop.engine import Engine, LoopError
from mcp_server.loop.setup import init_workspace
from mcp_server.loop.workspace import ID_NAME, StateDirError, Workspace, WorkspaceError, state_home

from conftest import alive, make_workspace


def cli(*args, cwd=None, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "mcp_server.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.fixture(scope="module")
def ws_factory(tmp_path_factory, small_corpus):
    def make(name="ws", **over):
        return make_workspace(tmp_path_factory.mktemp(name) / "w", small_corpus, **over)
    return make


@pytest.fixture(scope="module")
def ws(ws_factory):
    return ws_factory()


def test_state_lives_outside_the_workspace_private_and_cross_referenced(ws):
    st = ws.state_dir
    assert st.is_dir() and not str(st.resolve()).startswith(str(ws.root.resolve()) + os.sep)
    assert str(st).startswith(str(state_home()))
    assert stat.S_IMODE(st.stat().st_mode) == 0o700
    for name in ("state.db", "settings.toml", "workspace.json", "data/val.bin", "data/test.bin"):
        assert (st / name).is_file(), name
    # nothing the evaluator scores on is in the workspace
    local = ws.root / ".loopwright"
    assert not (local / "state.db").exists()
    assert not (local / "data" / "test.bin").exists()
    assert (local / "data" / "val.bin").read_bytes() != (st / "data" / "val.bin").read_bytes()
    wid = (local / ID_NAME).read_text().strip()
    assert json.loads((ws.root / "loopwright.lock").read_text())["workspace_id"] == wid
    rec = json.loads((st / "workspace.json").read_text())
    with ws.ledger() as led:
        assert rec["pinned_commit"] == led.campaign()["pinned_commit"]
    assert rec["root"] == str(ws.root)


def test_train_view_is_training_data_only(ws):
    view = ws.sync_train_view()
    train = (ws.data_dir / "train.bin").read_bytes()
    assert (view / "train.bin").read_bytes() + (view / "val.bin").read_bytes() == train
    assert not (view / "test.bin").exists()
    assert (view / "val.bin").stat().st_size > 0


def test_loopwright_toml_holds_only_frozen_sections_and_accepts_a_schedule_table(ws):
    text = (ws.root / "loopwright.toml").read_text()
    data = tomllib.loads(text)
    assert set(data) == {"benchmark", "paths", "noise"}
    assert "schedule = []" not in text
    # issue 15 item 2: appending [[schedule]] as the docs once said keeps the file valid TOML
    tomllib.loads(text + '\n[[schedule]]\ncron = "0 1 * * *"\n')


def test_settings_round_trip_and_clear_errors(ws):
    s = setmod.Settings()
    s = setmod.set_value(s, "budget.max_experiments", "4")
    assert s.budget.max_experiments == 4
    s = setmod.set_value(s, "schedule.0.cron", "0 1 * * *")
    s = setmod.set_value(s, "schedule.1.cron", "30 2 * * 1")
    s = setmod.set_value(s, "slack.channel", "123")          # a number where a string belongs
    assert s.slack.channel == "123" and len(s.schedule) == 2
    text = setmod.to_text(s)
    assert "schedule = []" not in text and setmod.parse(text) == s
    with pytest.raises(setmod.SettingsError, match="valid integer"):
        setmod.set_value(s, "budget.max_experiments", "lots")
    with pytest.raises(setmod.SettingsError, match="unknown key"):
        setmod.set_value(s, "nope.x", "1")
    with pytest.raises(setmod.SettingsError, match="config show"):
        setmod.set_value(s, "budget.max_experimentz", "3")
    with pytest.raises(setmod.SettingsError, match="cron"):
        setmod.set_value(s, "schedule.2.cron", "every day")
    with pytest.raises(setmod.SettingsError, match="out of range"):
        setmod.set_value(s, "schedule.7.cron", "0 1 * * *")
    assert setmod.unset(s, "slack").slack is None
    assert setmod.unset(setmod.Settings(), "slack").slack is None     # unsetting the unset is a no-op


def test_config_cli_change_sticks_through_discard_and_revert(ws_factory):
    ws = ws_factory("sticks")
    r = cli("config", "-w", str(ws.root), "set", "budget.max_experiments", "4")
    assert r.returncode == 0, r.stderr
    r = cli("config", "-w", str(ws.root), "set", "slack.base_url", "http://127.0.0.1:9/api/")
    assert r.returncode == 0, r.stderr
    bad = cli("config", "-w", str(ws.root), "set", "budget.max_experiments", "-3")
    assert bad.returncode == 2 and "budget.max_experiments" in bad.stderr and "greater than or equal" in bad.stderr
    with Engine(ws.root) as eng:
        assert eng.budget().experiments_left == 4
        best = eng.campaign["best_commit"]
        # what a discard, a crash and a revert do to the tree: the settings are not in it
        (ws.root / "train.py").write_text((ws.root / "train.py").read_text() + "\n# edit\n")
        gitops.reset_to(ws.root, best)
        eng.revert()
        assert eng.budget().experiments_left == 4
        assert eng.ws.cfg.slack.base_url == "http://127.0.0.1:9/api/"
        # a change takes effect at the next check, in the same process
        assert cli("config", "-w", str(ws.root), "set", "budget.max_experiments", "7").returncode == 0
        assert eng.budget().experiments_left == 7
    got = cli("config", "-w", str(ws.root), "get", "budget.max_experiments")
    assert got.stdout.strip() == "7"


def test_operational_edits_of_loopwright_toml_are_ignored_with_a_warning(ws_factory):
    ws = ws_factory("ignored")
    toml = ws.root / "loopwright.toml"
    toml.write_text(toml.read_text() + '\n[budget]\nmax_experiments = 1000\n\n[slack]\nchannel = "#x"\n'
                    'base_url = "http://evil.example/api/"\ntoken_env = "AWS_SECRET_ACCESS_KEY"\n')
    again = Workspace.open(ws.root)
    assert again.cfg.budget.max_experiments == 100 and again.cfg.slack is None
    assert any("loopwright config set" in w and "budget" in w and "slack" in w for w in again.warnings)
    r = cli("status", "-w", str(ws.root))
    assert "loopwright config set" in r.stderr


def test_refuses_an_unsafe_or_foreign_state_dir(ws_factory, tmp_path):
    ws = ws_factory("refuse")
    st = ws.state_dir
    os.chmod(st, 0o770)
    try:
        with pytest.raises(StateDirError, match="group- or world-writable"):
            Workspace.open(ws.root)
    finally:
        os.chmod(st, 0o700)
    id_file = ws.root / ".loopwright" / ID_NAME
    good = id_file.read_text()
    try:
        id_file.write_text("../../etc")
        with pytest.raises(StateDirError, match="malformed|loopwright.lock"):
            Workspace.open(ws.root)
        other = ws_factory("other")          # a real state dir, but another workspace's
        id_file.write_text((other.root / ".loopwright" / ID_NAME).read_text())
        with pytest.raises(StateDirError, match="loopwright.lock"):
            Workspace.open(ws.root)
    finally:
        id_file.write_text(good)
    Workspace.open(ws.root)
    # a copy of the workspace elsewhere cannot adopt its state
    copy = tmp_path / "copy"
    shutil.copytree(ws.root, copy, symlinks=True)
    with pytest.raises(StateDirError, match="belongs to workspace"):
        Workspace.open(copy)


def test_init_refuses_a_state_home_inside_the_workspace(tmp_path, small_corpus, monkeypatch):
    root = tmp_path / "w"
    monkeypatch.setenv("LOOPWRIGHT_HOME", str(root / "state"))
    with pytest.raises(StateDirError, match="inside the workspace"):
        make_workspace(root, small_corpus)
    assert not (root / "state").exists() or not any((root / "state").rglob("state.db"))


def test_init_refuses_a_corpus_inside_the_workspace(tmp_path, small_corpus):
    """The agent reads and edits the workspace: a corpus there is held-out text in its hands."""
    root = tmp_path / "w"
    inside = root / "texts"
    inside.mkdir(parents=True)
    for f in Path(small_corpus).iterdir():
        (inside / f.name).write_bytes(f.read_bytes())
    with pytest.raises(WorkspaceError, match="inside the workspace"):
        init_workspace(root, corpus=str(inside), force=True)
    assert not (root / "loopwright.toml").exists()


def test_old_layout_gives_the_command_then_migrates_every_row(ws_factory):
    ws = ws_factory("old")
    with Engine(ws.root) as eng:
        cid = eng.campaign["id"]
        eng.note("a lesson from before the migration")
        eid = eng.ledger.start_experiment(cid, "an old row", commit_sha=eng.campaign["best_commit"])
        eng.ledger.update_experiment(eid, status="crash", reason="old")
        before = [dict(r) for r in eng.ledger.experiments(cid)]
        notes_before = eng.ledger.notes(cid)
    # Make it look like a workspace from before: state inside .loopwright/, no id file, and the
    # operational settings in loopwright.toml.
    local = ws.root / ".loopwright"
    shutil.rmtree(local / "data")
    for entry in ws.state_dir.iterdir():
        if entry.name in ("state.db", "data", "runs"):
            shutil.move(str(entry), str(local / entry.name))
    shutil.rmtree(ws.state_dir)
    (local / ID_NAME).unlink()
    toml = ws.root / "loopwright.toml"
    toml.write_text(toml.read_text() + "\n[budget]\nmax_experiments = 12\n")
    with pytest.raises(WorkspaceError, match="loopwright migrate --workspace"):
        Workspace.open(ws.root)
    r = cli("migrate", "-w", str(ws.root))
    assert r.returncode == 0, r.stderr
    assert not (local / "state.db").exists() and not (local / "data" / "test.bin").exists()
    with Engine(ws.root) as eng:
        assert [dict(r) for r in eng.ledger.experiments(cid)] == before
        assert eng.ledger.notes(cid) == notes_before
        assert eng.ws.cfg.budget.max_experiments == 12       # imported once from loopwright.toml
        assert integrity.check(eng.ws, eng.campaign["pinned_commit"]) == []
    assert cli("migrate", "-w", str(ws.root)).returncode == 2    # twice: nothing to do, says so


def test_a_moved_workspace_relinks_keeping_every_row_and_doctor_names_the_stale_client_files(ws_factory):
    """New-user trial: after `mv` + `migrate --relink`, doctor said "all good" while .mcp.json and the
    Claude sandbox still named the old folder."""
    ws = ws_factory("moved")
    with Engine(ws.root) as eng:
        eng.note("kept across the move")
        before = [dict(r) for r in eng.ledger.experiments(eng.campaign["id"])]
    new = ws.root.parent / "moved-here"
    shutil.move(str(ws.root), str(new))
    r = cli("migrate", "--relink", "-w", str(new))
    assert r.returncode == 0, r.stderr
    assert f"still name {ws.root}" in r.stdout
    with Engine(new) as eng:
        assert [dict(r) for r in eng.ledger.experiments(eng.campaign["id"])] == before
        assert "kept across the move" in str(eng.ledger.notes(eng.campaign["id"]))
    r = cli("doctor", "--skip-server", "-w", str(new))
    assert r.returncode == 1 and f"✘ the client files name {ws.root}, not this workspace" in r.stdout


def test_rewritten_pinned_object_is_repaired_and_the_message_says_so(ws_factory):
    ws = ws_factory("objects")
    with Engine(ws.root) as eng:
        c = eng.campaign
        blob = gitops.repo(ws.root).commit(c["pinned_commit"]).tree / "prepare.py"
        path = ws.root / ".git" / "objects" / blob.hexsha[:2] / blob.hexsha[2:]
        import zlib
        evil = b"print('forged evaluator')\n"
        os.chmod(path, 0o644)
        path.write_bytes(zlib.compress(b"blob %d\0" % len(evil) + evil))
        with pytest.raises(LoopError, match="rewrote 1 pinned git object") as e:
            eng.run_experiment("anything")
        assert "could NOT" not in str(e.value)
        assert eng.ledger.events(c["id"], kind="tamper")
        assert integrity.check(eng.ws, c["pinned_commit"]) == []
        # without the state directory's copy the loop says the truth instead of "restored"
        shutil.rmtree(ws.state_dir / "pinned")
        path.write_bytes(zlib.compress(b"blob %d\0" % len(evil) + evil))
        with pytest.raises(LoopError, match="could NOT be repaired") as e:
            eng.run_experiment("anything")
        assert "Restored" not in str(e.value)


def test_a_moved_pinned_commit_in_the_ledger_is_refused(ws_factory):
    ws = ws_factory("pin")
    (ws.root / "prepare.py").write_text("# forged\n")
    r = gitops.repo(ws.root)
    r.git.add("prepare.py")
    forged = r.index.commit("forged pin").hexsha
    gitops.reset_to(ws.root, forged)
    db = sqlite3.connect(ws.db_path)        # what the agent can no longer do: the ledger is out of reach
    db.execute("UPDATE campaigns SET pinned_commit=?, best_commit=?", (forged, forged))
    db.commit()
    db.close()
    with pytest.raises(LoopError, match="pinned commit .* tampered"):
        Engine(ws.root)
    from mcp_server.ledger.store import Ledger
    with Ledger(ws.db_path) as led:
        opened = [e for e in led.events(kind="tamper") if e["payload"].get("when") == "on open"]
    assert len(opened) == 1 and "recorded at init" in opened[0]["payload"]["detail"]
    with pytest.raises(LoopError):
        Engine(ws.root)                      # still refused; reported once, not on every open
    with Ledger(ws.db_path) as led:
        assert len([e for e in led.events(kind="tamper") if e["payload"].get("when") == "on open"]) == 1


def test_out_of_range_ids_are_clear_errors(ws):
    with Engine(ws.root) as eng:
        for call in (lambda: eng.score(experiment_id=10 ** 30), lambda: eng.revert(to=10 ** 30),
                     lambda: eng.note("x", experiment_id=10 ** 30), lambda: eng.score(experiment_id=-1),
                     lambda: eng.score(experiment_id="abc")):
            with pytest.raises(LoopError, match="not an experiment id"):
                call()


def test_status_shows_agent_text_cleaned_and_escaped(ws):
    with Engine(ws.root) as eng:
        c = eng.campaign
        # a row stored raw (as before the fix, or by an old version)
        eid = eng.ledger.start_experiment(c["id"], "[bold red]FAKE KEEP[/] \x1b[2J\x1b]0;pwned\x07\x00 tail",
                                          commit_sha=c["best_commit"])
        eng.ledger.update_experiment(eid, status="crash", reason="x", finished_at=time.time())
    r = cli("status", "-w", str(ws.root), env={"COLUMNS": "200", "TERM": "xterm"})
    assert r.returncode == 0, r.stderr
    assert "\x1b]0;" not in r.stdout and "\x1b[2J" not in r.stdout and "\x00" not in r.stdout
    assert "[bold red]FAKE KEEP[/]" in r.stdout


def test_kill_9_orphan_is_left_by_reading_commands_and_recovered_by_the_next_writing_one(ws_factory):
    ws = ws_factory("orphan")
    with Engine(ws.root) as eng:
        c = eng.campaign
        eid = eng.ledger.start_experiment(c["id"], "orphaned", commit_sha=c["best_commit"])
    run_dir = ws.run_dir(eid)
    run_dir.mkdir(parents=True)
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)   # the train.py a killed CLI left
    (run_dir / "train.pid").write_text(str(child.pid))
    train = ws.root / "train.py"
    tree = train.read_text() + "\n# the tree as the killed run left it\n"
    train.write_text(tree)
    try:
        for reading in (["budget"], ["status"], ["export-tsv"]):   # no kill, no git reset, no row changed
            r = cli(*reading, "-w", str(ws.root))
            assert r.returncode == 0, r.stderr
            assert alive(child.pid) and train.read_text() == tree
            with Engine(ws.root) as eng:
                assert eng.ledger.experiment(eid)["status"] == "running"
        r = cli("stop", "--clear", "-w", str(ws.root))   # a writing command recovers first
        assert r.returncode == 0, r.stderr
        child.wait(timeout=10)
        assert not alive(child.pid)
        assert train.read_text() != tree and not gitops.is_dirty(ws.root)
        with Engine(ws.root) as eng:
            assert eng.ledger.experiment(eid)["status"] == "interrupted"
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)


def test_guard_refuses_the_state_home_with_a_reason(tmp_path, monkeypatch):
    """The guard (friendly first layer) names the external state home too: reads and writes refused."""
    import test_guard as tg

    from mcp_server.loop.config import LoopwrightConfig, dump_config

    home = tmp_path / "lwhome"
    monkeypatch.setenv("LOOPWRIGHT_HOME", str(home))
    val = home / "workspaces" / "w-1" / "data" / "val.bin"
    val.parent.mkdir(parents=True)
    val.write_bytes(b"\x00\x01")
    root = tmp_path / "ws"
    root.mkdir()
    (root / "loopwright.toml").write_text(dump_config(LoopwrightConfig()))
    (root / "train.py").write_text("LR = 1\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for tool, inp in (("Read", {"file_path": str(val)}),
                      ("Bash", {"command": f"cat {val}"}),
                      ("Bash", {"command": f"echo '[budget]' >> {home}/workspaces/w-1/settings.toml"}),
                      ("Write", {"file_path": str(home / "workspaces" / "w-1" / "settings.toml"), "content": "x"})):
        d = tg.decide(tg.payload("claude", root, tool, inp))
        assert not d.allow, (tool, inp)
        assert "outside the workspace" in d.reason and "loopwright config" in d.reason
    assert tg.decide(tg.payload("claude", root, "Read", {"file_path": str(root / "train.py")})).allow


def test_init_and_runs_refuse_a_python_installed_inside_the_workspace(tmp_path, small_corpus, monkeypatch):
    """Red team round 5: a venv inside the workspace is re-exposed to train.py's sandbox and the agent can
    write it (a sitecustomize.py would run in every experiment and in the evaluator)."""
    from mcp_server.loop import sandbox

    root = tmp_path / "w"
    venv = root / ".venv"
    venv.mkdir(parents=True)
    real = sandbox.python_paths
    monkeypatch.setattr(sandbox, "python_paths", lambda: real() + [str(venv.resolve())])
    with pytest.raises(WorkspaceError, match="lives inside the workspace"):
        init_workspace(root, corpus=str(small_corpus), force=True)
    monkeypatch.setattr(sandbox, "python_paths", real)
    ws = make_workspace(tmp_path / "w2", small_corpus)
    monkeypatch.setattr(sandbox, "python_paths", lambda: real() + [str(ws.root.resolve() / ".venv")])
    with pytest.raises(sandbox.SandboxUnavailable, match="lives inside the workspace"):
        sandbox.training_command(ws, ["python", "train.py"], view=ws.sync_train_view(), scratch=tmp_path / "s",
                                 env={})
