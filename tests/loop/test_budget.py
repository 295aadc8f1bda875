"""Budgets (mcp_server/loop/budget.py) and results.tsv (mcp_server/report/tsv.py)."""
import time

from mcp_server.ledger.store import Ledger
from mcp_server.loop import budget
from mcp_server.loop.config import (
    BudgetConfig,
)
from mcp_server.report.tsv import COLUMNS, export_tsv

# -- budget -------------------------------------------------------------------

def test_budget_counts_experiments_cost_and_target(tmp_path):
    led = Ledger(tmp_path / "s.db")
    cid = led.create_campaign("t", "b", "abc")
    cfg = BudgetConfig(max_experiments=2, max_hours=1.0, max_cost_usd=1.0, target_metric=1.5)
    st = budget.check(led, cid, cfg, best_metric=2.0)
    assert not st.should_stop and st.experiments_left == 2
    for _ in range(2):
        e = led.start_experiment(cid, "x")
        led.update_experiment(e, status="ok", finished_at=time.time())
    st = budget.check(led, cid, cfg, best_metric=2.0)
    assert st.should_stop and "experiment budget spent" in st.reasons[0]
    sid = led.start_session(cid, "cron", "claude")
    led.end_session(sid, 0, turns=3, cost_usd=1.25)
    st = budget.check(led, cid, BudgetConfig(max_experiments=None, max_cost_usd=1.0), best_metric=2.0)
    assert st.should_stop and "cost budget spent" in st.reasons[0] and st.cost_used_usd == 1.25
    st = budget.check(led, cid, BudgetConfig(max_experiments=None, max_cost_usd=None, target_metric=2.5),
                      best_metric=2.0)
    assert st.should_stop and "target reached" in st.reasons[0]


def test_results_tsv_keeps_autoresearch_columns_first(tmp_path):
    led = Ledger(tmp_path / "s.db")
    cid = led.create_campaign("t", "b", "abc")
    e = led.start_experiment(cid, "baseline\twith tab", is_baseline=1, commit_sha="abcdef1234")
    led.update_experiment(e, status="ok", val_bpb=1.234567, verdict="baseline", memory_gb=0.5)
    e = led.start_experiment(cid, "bigger lr", commit_sha="1234567890")
    led.update_experiment(e, status="crash", reason="exit 1")
    lines = export_tsv(led, cid).splitlines()
    assert lines[0].split("\t")[:5] == ["commit", "val_bpb", "memory_gb", "status", "description"]
    assert len(lines[0].split("\t")) == len(COLUMNS)
    assert lines[1].split("\t")[:5] == ["abcdef1", "1.234567", "0.500000", "keep", "baseline with tab"]
    assert lines[2].split("\t")[3] == "crash"


def test_results_tsv_shows_a_finished_reference_run_of_the_best_as_kept_not_pending(tmp_path):
    # a confirm's reference run re-measures the kept best on a fresh seed; it has no verdict of its own
    led = Ledger(tmp_path / "s.db")
    cid = led.create_campaign("t", "b", "abc")
    e = led.start_experiment(cid, "reference: best #3 on seed 6003 (confirm of #5)", commit_sha="4ba8c1a",
                             role="reference", seed=6003)
    led.update_experiment(e, status="ok", val_bpb=2.989)
    e = led.start_experiment(cid, "still running", commit_sha="5ca1ab1", role="candidate")
    cells = [ln.split("\t") for ln in export_tsv(led, cid).splitlines()[1:]]
    assert cells[0][3] == "keep" and cells[0][COLUMNS.index("verdict")] == "reference"
    assert cells[1][3] == "pending"
