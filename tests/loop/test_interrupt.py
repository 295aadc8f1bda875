"""Ctrl-C, SIGTERM/SIGHUP and kills while the loop trains: runs end interrupted (never a crash of the change),
an interrupted candidate is closed instead of waiting forever for a score, and no edit of train.py is lost."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcp_server.common import procs
from mcp_server.loop import gitops, runner
from mcp_server.loop.engine import Engine
from mcp_server.loop.status import loop_status, session_summary

from conftest import make_workspace, record_baseline, set_constant


@pytest.fixture()
def ws(tmp_path, small_corpus):
    return make_workspace(tmp_path / "ws", small_corpus)


def _fake_runs(monkeypatch, plan):
    """train.py and the evaluator replaced: each run takes the next step of `plan` (a value: ok with that
    val_bpb; an exception: raised; a TrainResult: returned; a callable: called, then ok 2.0)."""
    steps = list(plan)

    def train(ws, run_dir, seed, on_progress=None, **kw):
        run_dir.mkdir(parents=True, exist_ok=True)
        step = steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, runner.TrainResult):
            return step
        if callable(step):
            step(ws)
            step = 2.0
        model = run_dir / "model.pt2"
        model.write_text(str(step))
        return runner.TrainResult("ok", 0, "", 0.1, {"num_steps": 5.0, "training_seconds": 0.1}, "", model)

    def evaluate(ws, pinned, run_dir, model_path, **kw):
        val = float(model_path.read_text())
        return runner.EvalResult(True, "", val, val + 0.01, 0.01, {}, 0.01)

    monkeypatch.setattr(runner, "run_training", train)
    monkeypatch.setattr(runner, "run_evaluation", evaluate)


def test_ctrl_c_in_a_later_seed_run_closes_the_candidate(ws, monkeypatch):
    """Bug: the candidate stayed ok/unscored, pending_score named it, and score() said it was superseded."""
    eng = Engine(ws.root)
    record_baseline(eng)
    train = ws.root / "train.py"
    set_constant(train, "LR", "0.005")
    edit = train.read_text()
    _fake_runs(monkeypatch, [1.9, KeyboardInterrupt()])
    with pytest.raises(KeyboardInterrupt):
        eng.run_experiment("LR 0.005")
    cand = [r for r in eng.ledger.experiments(eng.campaign["id"]) if r["role"] == "candidate"][0]
    pair = eng.ledger.confirm_runs(cand["id"])[0]
    assert pair["status"] == "interrupted" and "interrupted" in pair["reason"]
    assert cand["status"] == "ok" and cand["val_bpb"] == 1.9          # what was recorded stays
    assert cand["verdict"] == "discard" and cand["verdict_reason"].startswith("interrupted: ")
    assert eng.summary().pending_score == []
    assert "not scored yet" not in loop_status(ws.root)["next_step"]
    assert "Pending: score" not in session_summary(ws.root)
    assert gitops.head_sha(ws.root) == eng.campaign["best_commit"]
    assert not eng.ledger.events(eng.campaign["id"], kind="crash")
    assert eng.budget().experiments_used == 3     # two baseline runs and the candidate's finished run
    # the campaign goes on: the same change may run again (it was never measured in full) and be scored
    train.write_text(edit)
    _fake_runs(monkeypatch, [1.9, 1.91])
    res = eng.run_experiment("LR 0.005 again")
    assert res.status == "ok"
    assert eng.score(res.experiment_id).verdict == "keep"


def test_a_campaign_stuck_by_an_older_version_recovers_on_open(ws):
    """Rows as older versions left them: candidate ok and unscored, its pair interrupted, branch at the best."""
    eng = Engine(ws.root)
    record_baseline(eng)
    c = eng.campaign
    set_constant(ws.root / "train.py", "LR", "0.005")
    sha, _ = gitops.commit_editable(ws.root, ["train.py"], ".loopwright", "candidate")
    cand = eng.ledger.start_experiment(c["id"], "LR 0.005", commit_sha=sha, parent_commit=c["best_commit"],
                                       role="candidate")
    eng.ledger.update_experiment(cand, status="ok", val_bpb=1.9, finished_at=time.time())
    pair = eng.ledger.start_experiment(c["id"], "LR 0.005 [seed 2]", commit_sha=sha, parent_commit=c["best_commit"],
                                       confirm_of=cand, role="pair")
    eng.ledger.update_experiment(pair, status="interrupted", reason="loop error: KeyboardInterrupt: ",
                                 finished_at=time.time())
    gitops.reset_to(ws.root, c["best_commit"])
    eng.close()
    # the Stop hook and SessionStart open the workspace without recovery: they must not ask for an impossible score
    assert "not scored yet" not in loop_status(ws.root)["next_step"]
    assert "Pending: score" not in session_summary(ws.root)
    with Engine(ws.root) as eng:                            # reading changes nothing
        assert eng.ledger.experiment(cand)["verdict"] is None
    with Engine.open_for_writing(ws.root) as eng:           # the next writer closes it
        row = eng.ledger.experiment(cand)
        assert row["verdict"] == "discard" and row["verdict_reason"].startswith("interrupted: ")
        assert row["val_bpb"] == 1.9
        assert eng.summary().pending_score == []


def test_opening_to_read_changes_nothing_and_the_next_writer_recovers(ws):
    """A run orphaned by a killed server (its training still alive, the branch at its candidate commit, an edit
    kept aside): the hooks, the report and status views open the workspace and must not kill, reset or rewrite."""
    eng = Engine(ws.root)
    record_baseline(eng)
    c = eng.campaign
    train = ws.root / "train.py"
    set_constant(train, "LR", "0.005")
    sha, _ = gitops.commit_editable(ws.root, ["train.py"], ".loopwright", "candidate")
    eid = eng.ledger.start_experiment(c["id"], "LR 0.005", commit_sha=sha, parent_commit=c["best_commit"],
                                      role="candidate")
    eng._keep_edit({"train.py": train.read_bytes()})      # as a run does before it places another version
    eng.close()
    ws.run_dir(eid).mkdir(parents=True)
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    (ws.run_dir(eid) / "train.pid").write_text(str(child.pid))
    tree = train.read_bytes()
    try:
        for _ in range(2):
            with Engine(ws.root) as eng:
                eng.summary(), eng.budget(), eng.state("history")
                assert eng.ledger.experiment(eid)["status"] == "running" and not eng.notices
            loop_status(ws.root), session_summary(ws.root)
            assert child.poll() is None                                    # not killed
            assert gitops.head_sha(ws.root) == sha and train.read_bytes() == tree   # no reset, no rewrite
            assert (ws.state_dir / "kept-edit").is_dir()
        with Engine.open_for_writing(ws.root) as eng:
            child.wait(timeout=10)                                         # killed
            row = eng.ledger.experiment(eid)
            assert row["status"] == "interrupted" and "stopped during" in row["reason"]
            assert gitops.head_sha(ws.root) == c["best_commit"]            # the branch back at the best
            assert not (ws.state_dir / "kept-edit").exists()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)


def test_an_edit_made_while_the_baseline_runs_is_kept_as_a_backup(ws, monkeypatch):
    train = ws.root / "train.py"
    set_constant(train, "LR", "0.005")
    edit = train.read_text()

    def user_edits(w):
        (w.root / "train.py").write_text(edit + "\n# edited while the baseline ran\n")

    _fake_runs(monkeypatch, [user_edits, 2.0, 1.9, 1.9])
    eng = Engine(ws.root)
    eng.run_experiment("LR 0.005")
    assert train.read_text() == edit                       # the edit the description is about was measured
    assert any("edited while the loop ran" in n for n in eng.notices)
    backups = list((ws.state_dir / "backups").rglob("train.py"))
    assert [b.read_text() for b in backups] == [edit + "\n# edited while the baseline ran\n"]
    assert not (ws.state_dir / "kept-edit").exists()


_FAKE_CLI = r"""
import os, signal, sys, time
from pathlib import Path
from mcp_server.loop import runner
mode, marker = sys.argv[1], Path(sys.argv[2])
def train(ws, run_dir, seed, on_progress=None, **kw):
    run_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(seed))
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
runner.run_training = train
from mcp_server.cli.main import main
sys.exit(main(sys.argv[3:]))
"""


def _default_signals():
    """A user's terminal: the suite may run under nohup or as a background job, whose children inherit
    SIGHUP / SIGINT ignored (and the CLI rightly leaves an ignored signal ignored)."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _cli(tmp_path, mode, *args):
    marker = tmp_path / "started"
    marker.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", _FAKE_CLI, mode, str(marker), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()
    return proc


def test_a_baseline_killed_with_sigkill_loses_no_edit(ws, tmp_path):
    train = ws.root / "train.py"
    set_constant(train, "LR", "0.005")
    edit = train.read_text()
    proc = _cli(tmp_path, "kill", "run-experiment", "LR 0.005", "--workspace", str(ws.root))
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert train.read_text() != edit                       # the baseline had reset it to the pinned version
    with Engine(ws.root) as eng:                           # reading leaves everything as the kill left it
        assert train.read_text() != edit and (ws.state_dir / "kept-edit").is_dir()
        assert eng.ledger.experiment(1)["status"] == "running" and not eng.notices
    with Engine.open_for_writing(ws.root) as eng:          # the next writer puts it back, and says so
        assert train.read_text() == edit
        assert any("put back" in n for n in eng.notices)
        assert eng.ledger.experiment(1)["status"] == "interrupted"
        assert eng.budget().experiments_used == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_run_experiment_is_an_interruption_with_a_message(ws, tmp_path, sig):
    """Bug: SIGTERM killed the command (the run was left 'running', or recorded as a crash: exit code -15);
    Ctrl-C printed nothing."""
    train = ws.root / "train.py"
    set_constant(train, "LR", "0.005")
    edit = train.read_text()
    proc = _cli(tmp_path, "sleep", "run-experiment", "LR 0.005", "--workspace", str(ws.root))
    time.sleep(0.5)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert "interrupted: the baseline measurement stopped" in err, err
    assert "nothing was scored" in err and "does not count against the experiment budget" in err, err
    assert train.read_text() == edit, "the edit must be put back"
    with Engine(ws.root) as eng:
        row = eng.ledger.experiment(1)
        assert row["status"] == "interrupted" and "crash" not in (row["reason"] or "")
        assert not eng.ledger.events(eng.campaign["id"], kind="crash")
        assert eng.budget().experiments_used == 0
        assert not (ws.state_dir / "kept-edit").exists()


def test_a_run_killed_while_the_loop_is_stopping_is_not_a_crash(ws, monkeypatch):
    """The MCP server ending (its client got SIGTERM) kills the run: exit -15 is the loop's doing."""
    eng = Engine(ws.root)
    record_baseline(eng)
    set_constant(ws.root / "train.py", "LR", "0.005")
    monkeypatch.setattr(procs, "_STOPPING", procs.threading.Event())
    killed = runner.TrainResult("crash", -15, "train.py exited with code -15", 1.0, {}, "")

    _fake_runs(monkeypatch, [killed])
    procs.note_stopping()
    with pytest.raises(Exception, match="stopped"):
        eng.run_experiment("LR 0.005")
    row = [r for r in eng.ledger.experiments(eng.campaign["id"]) if r["role"] == "candidate"][0]
    assert row["status"] == "interrupted" and row["verdict"] is None
    assert not eng.ledger.events(eng.campaign["id"], kind="crash")
    assert eng.summary().pending_score == [] and eng.summary().crashed == 0


def test_revert_keeps_an_uncommitted_edit(ws):
    train = ws.root / "train.py"
    set_constant(train, "LR", "0.005")
    edit = train.read_text()
    with Engine(ws.root) as eng:
        res = eng.revert()
    assert train.read_text() != edit
    assert res.backup and (ws.state_dir / "backups") in Path(res.backup).parents
    assert (Path(res.backup) / "train.py").read_text() == edit
    assert res.backup in res.message
    with Engine(ws.root) as eng:                            # nothing to keep: no new backup
        assert eng.revert().backup is None
    assert os.listdir(ws.state_dir / "backups") == [os.path.basename(res.backup)]
