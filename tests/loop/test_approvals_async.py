"""Autonomy approve-keeps on the asynchronous path (submit_experiment / wait, the path the local-parallel and
Ray executors take): a keep verdict waits for a person exactly as score() makes it wait, and an approved keep
is applied at the next submission as run_experiment applies it. Runs finish at once (test_async_wait's
InstantExecutor); the ledger, git and the approval branch are real."""
from __future__ import annotations

import pytest
from test_async_wait import InstantExecutor
from test_executors import STEPS

from mcp_server.loop import asyncrun, decisions, gitops
from mcp_server.loop import settings as setmod
from mcp_server.loop.engine import Engine
from mcp_server.loop.errors import LoopError
from mcp_server.loop.workspace import Workspace

from conftest import hobbled_bench, make_workspace, set_constant


def _autonomy(root, mode: str) -> None:
    ws = Workspace.open(root)
    setmod.save(ws.settings_path, setmod.set_value(ws.settings(), "campaign.autonomy", mode))


@pytest.fixture
def ws(tmp_path, small_corpus, monkeypatch):
    monkeypatch.setattr(asyncrun, "make_executor", lambda *a, **k: InstantExecutor())
    w = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench"), **STEPS)
    _autonomy(w.root, "approve-keeps")
    return w


def test_an_async_keep_waits_for_a_person_and_applies_at_the_next_submission(ws):
    eng = Engine(ws.root)
    try:
        base = eng.submit_experiment("baseline")
        eng.wait([base.experiment_id], timeout=30)
        best_before = eng.campaign["best_commit"]
        set_constant(ws.root / "train.py", "LR", "0.004")       # the known fix: a clear gain
        good = eng.submit_experiment("normal learning rate")
        set_constant(ws.root / "train.py", "DEPTH", "3")        # the agent edits on while it runs
        edit = (ws.root / "train.py").read_bytes()
        [r] = eng.wait([good.experiment_id], timeout=30).results
        # held: the verdict waits for a person, the best does not move, the agent's tree is left alone
        assert r.state == "decided" and r.verdict == "pending_approval", r
        assert "waits for a person (approval #1)" in (r.reason or "")
        cand = eng.ledger.experiment(r.current_id)
        c = eng.campaign
        assert c["best_commit"] == best_before and c["best_experiment_id"] is None
        assert gitops.head_sha(ws.root) == best_before
        assert (ws.root / "train.py").read_bytes() == edit
        [a] = eng.ledger.approvals(c["id"])
        assert (a["status"], a["kind"], a["experiment_id"]) == ("pending", "keep", cand["id"])
        assert a["base_commit"] == best_before and a["source_sha"] == cand["source_sha"]
        assert gitops.repo(ws.root).commit(a["branch"]).hexsha == cand["commit_sha"]
        assert eng.ledger.events(c["id"], kind="keep") == []
        [req] = eng.ledger.events(c["id"], kind="approval_requested")
        assert req["payload"]["approval_id"] == a["id"] and req["payload"]["experiment_id"] == cand["id"]
        # a person approves; the next submission applies it first (run_experiment's before_run does the same)
        decisions.decide(ws.root, a["id"], True, "ana", "cli")
        assert eng.campaign["best_commit"] == best_before          # approved, not applied yet
        nxt = eng.submit_experiment("one block more")
        c = eng.campaign
        kept = eng.ledger.experiment(cand["id"])
        assert c["best_commit"] == cand["commit_sha"] and c["best_experiment_id"] == cand["id"]
        assert kept["verdict"] == "keep" and kept["verdict_reason"] == "approved by ana via cli (#1)"
        assert eng.ledger.approval(a["id"])["status"] == "applied"
        [ev] = eng.ledger.events(c["id"], kind="keep")
        assert ev["payload"]["approved_by"] == "ana" and ev["payload"]["experiment_id"] == cand["id"]
        # the agent's edit was carried onto the approved best, and the new candidate is built on it
        assert gitops.head_sha(ws.root) == cand["commit_sha"]
        assert b"LR = 0.004" in edit and (ws.root / "train.py").read_bytes() == edit
        assert eng.ledger.experiment(nxt.experiment_id)["parent_commit"] == cand["commit_sha"]
        [r2] = eng.wait([nxt.experiment_id], timeout=30).results
        assert r2.state == "decided"
    finally:
        asyncrun.close_driver(eng)
        eng.close()


def test_approve_runs_is_refused_on_the_async_path(ws):
    _autonomy(ws.root, "approve-runs")
    with Engine(ws.root) as eng, pytest.raises(LoopError, match="approve-runs"):
        eng.submit_experiment("baseline")
