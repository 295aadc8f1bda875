"""The training budget is enforced by the runner's own meter, never by train.py's clock.

prepare.py's TrainingBudget runs inside the untrusted train.py process, so a train.py can rewrite it
(prepare.cpu_seconds, prepare.TIME_BUDGET) or ignore it. Each test here runs a real train.py in the
real bubblewrap sandbox of a real workspace, with a small budget: a run that trains past the budget
is killed over budget and never kept, an honest one is not, and the figures on record are the
runner's measurement.
"""
from __future__ import annotations

import json

import pytest

from mcp_server.loop import runner, sandbox
from mcp_server.loop.engine import Engine

from conftest import make_workspace, record_baseline

INFO = sandbox.detect()
pytestmark = pytest.mark.skipif(INFO.kind != "bwrap", reason=f"no usable bubblewrap here: {INFO.detail}")

# A tiny model and a loop that burns CPU in steps of about 0.05 s, ended by the budget's should_stop.
HEADER = '''
import time
import torch
import torch.nn as nn
import prepare

class Bigram(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(prepare.VOCAB_SIZE, prepare.VOCAB_SIZE))
    def forward(self, idx):
        return self.table[idx]

def burn(seconds=0.05):
    t = time.process_time()
    while time.process_time() - t < seconds:
        pass
'''
LOOP = '''
model = Bigram()
budget = prepare.start_budget(model)
while True:
    burn()
    if budget.step(1.0):
        break
prepare.export_model(model)
budget.summary()
'''
CPU = {"time_budget": 6.0, "clock": "cpu", "grace_seconds": 20.0}


def _ws(tmp_path, corpus, **bench):
    return make_workspace(tmp_path / "ws", corpus, benchmark=bench)


def _allowed(ws) -> float:
    b = ws.cfg.benchmark
    return b.time_budget * runner.BUDGET_TOLERANCE + runner.START_SECONDS


def test_a_slowed_cpu_clock_is_killed_over_budget_and_never_kept(tmp_path, small_corpus):
    """The red team's attack: prepare.cpu_seconds charged a third. Before, the run trained three
    budgets and was scored; now the runner kills it at its own allowance."""
    ws = _ws(tmp_path, small_corpus, **CPU)
    eng = Engine(ws.root)
    record_baseline(eng, (7.9, 7.91))
    (ws.root / "train.py").write_text(HEADER + "_real = prepare.cpu_seconds\n"
                                      "prepare.cpu_seconds = lambda: _real() / 3\n" + LOOP)
    res = eng.run_experiment("charge a third of the CPU")
    row = eng.ledger.experiment(res.experiment_id)
    assert res.status == "timeout" and res.reason.startswith("over budget"), (res.status, res.reason)
    assert "metered by the runner from outside train.py" in res.reason and "CPU seconds" in res.reason
    assert row["val_bpb"] is None and row["verdict"] == "discard"
    metrics = json.loads(row["metrics_json"])
    # killed within one meter reading of the allowance, far from the three budgets it asked for
    assert _allowed(ws) < metrics["measured_cpu_seconds"] < _allowed(ws) + 1.5, metrics
    assert "budget_used" not in metrics          # killed before its (forged) summary
    eng.close()


def test_raising_time_budget_inside_train_py_buys_nothing(tmp_path, small_corpus):
    ws = _ws(tmp_path, small_corpus, **CPU)
    (ws.root / "train.py").write_text(HEADER + "prepare.TIME_BUDGET = 1000.0\n" + LOOP)
    tr = runner.run_training(ws, ws.run_dir(1), seed=1)
    assert tr.status == "timeout" and tr.over_budget and tr.model_path is None, (tr.status, tr.reason)
    assert tr.cpu_seconds is not None and _allowed(ws) < tr.cpu_seconds < _allowed(ws) + 1.5
    # killed by the meter (over_budget, its reason), before the hard wall-clock limit (4 budgets + grace): the
    # wall time the CPU seconds took is the machine's load (39 s for 6 CPU s beside a second test worker and
    # other jobs at load 8), so it is bounded by the hard limit, not by a margin below it
    assert "hard limit" not in tr.reason and tr.wall_seconds < ws.cfg.benchmark.hard_limit_seconds(), tr


def test_ignoring_the_wall_clock_is_killed_at_the_allowance(tmp_path, small_corpus):
    """Wall clock: a run that sleeps past its budget is killed at budget x tolerance + start-up, not
    at budget + grace."""
    ws = _ws(tmp_path, small_corpus, time_budget=4.0, clock="wall", grace_seconds=30.0)
    (ws.root / "train.py").write_text(HEADER + "time.sleep(60)\nprepare.export_model(Bigram())\n")
    tr = runner.run_training(ws, ws.run_dir(1), seed=1)
    assert tr.status == "timeout" and tr.over_budget and "wall clock" in tr.reason, (tr.status, tr.reason)
    allowed = 4.0 * runner.BUDGET_TOLERANCE + runner.START_SECONDS + runner.WALL_START_EXTRA
    assert allowed < tr.wall_seconds < allowed + 5, tr.wall_seconds


def test_an_honest_run_passes_and_the_figures_on_record_are_the_runners(tmp_path, small_corpus):
    ws = _ws(tmp_path, small_corpus, **CPU)
    # train.py also prints the runner's keys: its own values must not be what is recorded
    # torch.export's first call imports most of torch (2.5 CPU s on a slow machine): an honest toy pays it
    # before its budget starts, as the budget predicts a one-tensor model's export from its size
    warm = "torch.export.export(Bigram(), (torch.zeros(1, 1, dtype=torch.long),))\n"
    (ws.root / "train.py").write_text(HEADER + warm + LOOP + "print('measured_cpu_seconds: 0.0')\n"
                                      "print('measured_wall_seconds: 0.0')\n")
    tr = runner.run_training(ws, ws.run_dir(1), seed=1)
    assert tr.status == "ok" and not tr.over_budget, (tr.status, tr.reason, tr.log_tail)
    s = tr.summary
    assert s["measured_cpu_seconds"] == pytest.approx(tr.cpu_seconds, abs=1e-3) and tr.cpu_seconds > 1.0
    assert s["measured_wall_seconds"] == pytest.approx(tr.wall_seconds, abs=1e-3)
    # the outside meter sees at least what train.py counted (plus the sandbox and the teardown)
    assert s["cpu_seconds"] - 0.2 <= tr.cpu_seconds <= _allowed(ws), s
    assert s["total_seconds"] - 0.2 <= tr.wall_seconds, s


def test_a_summary_that_understates_the_measured_cpu_is_rejected(tmp_path, small_corpus):
    """Within the budget, but the summary claims far less CPU than was used: a rewritten clock."""
    ws = _ws(tmp_path, small_corpus, time_budget=20.0, clock="cpu", grace_seconds=20.0)
    (ws.root / "train.py").write_text(HEADER + "burn(8.0)\nprepare.export_model(Bigram())\n"
                                      "print('---')\nprint('cpu_seconds: 0.5')\nprint('total_seconds: 0.5')\n")
    tr = runner.run_training(ws, ws.run_dir(1), seed=1)
    assert tr.status == "rejected" and tr.over_budget, (tr.status, tr.reason)
    assert "cpu_seconds 0.5" in tr.reason and "measured" in tr.reason
