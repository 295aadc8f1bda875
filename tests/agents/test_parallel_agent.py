"""The built-in agent with several candidates in flight (`loopwright run --parallel N`, `demo --parallel N`),
and what `loopwright status` and the report show of the executor: runs in flight, workers, lost runs.

The session test drives the real MCP server over stdio, the local executor with two runs at once, real
training on the steps clock (a fixed number of tokens: the outcome does not depend on the machine's load).
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time

import pytest

from mcp_server.agents.builtin import EXPERT_FIRST, Attempt, Planner, session_mode
from mcp_server.loop.config import ExecutorConfig
from mcp_server.mechanisms.source import tunable_constants

from conftest import BENCH, REPO, hobbled_bench, make_workspace

TRAIN = (BENCH / "train.py").read_text()


def wide() -> dict:
    """The environment (LOOPWRIGHT_HOME: the tests' private state home) with room for rich's plain output,
    which wraps at 80 columns otherwise."""
    return {**os.environ, "COLUMNS": "200"}
STEPS = {"benchmark": {"clock": "steps", "budget_tokens": 24 * 8 * 256, "eval_tokens": 8192}}


def test_one_at_a_time_stays_the_default_on_this_machine():
    """--parallel 1 (or nothing, with default settings) on the local executor: run_experiment + score as
    before; more in flight, or a Ray executor, goes through submit_experiment / wait."""
    assert session_mode(ExecutorConfig()) == (1, False)
    assert session_mode(ExecutorConfig(), 1) == (1, False)
    assert session_mode(ExecutorConfig(parallel=4)) == (4, True)          # the workspace's setting
    assert session_mode(ExecutorConfig(parallel=4), 1) == (1, False)      # the flag wins
    assert session_mode(ExecutorConfig(kind="ray"), 1) == (1, True)       # runs belong on the cluster
    with pytest.raises(ValueError, match="at least 1"):
        session_mode(ExecutorConfig(), 0)


def test_busy_constants_are_left_alone():
    """Candidates in flight at once change different constants; with all of them busy there is no proposal."""
    p = Planner(0)
    names = [c.name for c in tunable_constants(TRAIN)]
    busy: set[str] = set()
    for _ in range(6):
        e = p.propose(TRAIN, busy=busy)
        assert e is not None and e.name not in busy
        busy.add(e.name)
    assert p.propose(TRAIN, busy=names) is None
    # an expert-first move skipped while its constant was busy is still proposed later
    q = Planner(0)
    opening = EXPERT_FIRST[0][0]
    first = q.propose(TRAIN, busy={opening})
    assert first is not None and first.name != opening
    assert q.propose(TRAIN).name == opening


def test_cli_refuses_a_bad_parallel(tmp_path):
    for argv in (["run", "--parallel", "0", "-w", str(tmp_path)], ["demo", "--parallel", "-2", str(tmp_path / "d")]):
        p = subprocess.run([sys.executable, "-m", "mcp_server.cli", *argv], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode != 0 and "--parallel must be at least 1" in p.stderr, p.stderr
    assert not (tmp_path / "d").exists()


def test_demo_parallel_sets_the_executor():
    from mcp_server.cli.demo import demo_overrides

    assert "executor" not in demo_overrides(8)                       # the default demo is unchanged
    assert demo_overrides(8, parallel=3)["executor"] == {"parallel": 3}


def test_progress_display_with_several_in_flight():
    from rich.console import Console

    from mcp_server.cli.demo import Display, ProgressState

    st = ProgressState("run", n=3)
    out = io.StringIO()
    with Display(st, Console(file=out, width=120), live=False) as display:
        display("experiment_start", {"number": 1, "description": "LR 0.004 -> 0.006", "category": "optimizer",
                                     "in_flight": 1})
        display("experiment_start", {"number": 2, "description": "DEPTH 4 -> 5", "category": "architecture",
                                     "in_flight": 2})
        assert st.phase == "2 in flight" and "#1 LR" in st.current and "#2 DEPTH" in st.current
        display("verdict", {"score": {"verdict": "keep", "gain": 0.05, "threshold": None, "best_val_bpb": 1.9}})
        display("experiment_end", {"attempt": Attempt(2, 7, "DEPTH 4 -> 5", "ok", "keep", 1.9, 30.0),
                                   "result": {"delta_vs_best": -0.05, "in_flight": 1}})
    assert st.phase == "1 in flight" and "#2" not in st.current and st.kept == 1 and st.best == 1.9
    row = next(r for r in st.rows if r.number == 2)
    assert row.verdict == "keep" and row.delta == -0.05
    assert next(r for r in st.rows if r.number == 1).verdict == "running"
    assert "score: keep (gain +0.0500)" in out.getvalue()


@pytest.mark.slow
def test_parallel_session_status_and_report(tmp_path, small_corpus):
    """`loopwright run --parallel 2 -n 2` on the local executor with 2 runs at once: the baseline, then two
    candidates in flight together; both decided, nothing left in flight; `loopwright status` and the report
    show the executor, its workers and (a recorded) lost run."""
    from mcp_server.loop.engine import Engine
    from mcp_server.loop.status import executor_view

    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench", tiny=True),
                        executor={"parallel": 2}, noise={"baseline_seeds": 1}, **STEPS)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mcp_server.cli", "run", "--agent", "builtin", "-n", "2",
                           "--parallel", "2", "--seed", "1", "-w", str(ws.root)], cwd=REPO, capture_output=True,
                          text=True, timeout=900, env=wide())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 experiment(s)" in proc.stdout and "up to 2 candidate(s) in flight" in proc.stdout, proc.stdout[-2000:]
    # two in flight at once: the second was submitted before the first was decided
    in_flight = [int(n) for n in re.findall(r"submitted experiment \d+: .*\((\d+) in flight\)", proc.stdout)]
    assert in_flight == [1, 2], proc.stdout[-2000:]
    with Engine(ws.root) as eng:
        c = eng.campaign
        subs = eng.ledger.submissions(c["id"])
        cands = [eng.ledger.experiment(s["current_id"]) for s in subs if s["id"] != subs[0]["id"]]
        assert len(subs) == 3 and all(s["decided_at"] for s in subs)      # baseline + 2 candidates
        assert all(r["verdict"] in ("keep", "discard") for r in cands), cands
        assert eng.ledger.inflight() == [] and eng.ledger.running_experiments() == []
        # the two submitted together changed different constants
        first_two = sorted(subs[1:], key=lambda s: s["id"])[:2]
        names = {eng.ledger.experiment(s["id"])["description"].split()[0] for s in first_two}
        assert len(names) == 2
        view = executor_view(eng)
        ran = sum(r["status"] == "ok" for r in eng.ledger.experiments(c["id"]))
        assert view["executor"]["kind"] == "local" and view["executor"]["parallel"] == 2
        assert view["in_flight"] == [] and view["open"] == [] and not view["driver_alive"]
        assert sum(w["runs"] for w in view["workers"]) == ran and all(w["worker"].startswith("local:")
                                                                       for w in view["workers"])
        # a lost run, as the Ray executor records one (its node died; re-queued once)
        lost = eng.ledger.start_experiment(c["id"], "lost run", role="pair", seed=4242)
        eng.ledger.update_experiment(lost, status="lost", finished_at=time.time(), reason="node died; re-queued as #99",
                                     metrics_json=json.dumps({"worker": "ray:abc123:gpu7", "attempt": 1}))
    out = subprocess.run([sys.executable, "-m", "mcp_server.cli", "status", "-w", str(ws.root)], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env=wide())
    assert out.returncode == 0, out.stderr
    assert "executor local (this machine), 2 run(s) at once" in out.stdout, out.stdout
    assert "in flight 0 run(s)" in out.stdout and "workers (recent runs)" in out.stdout
    assert "ray:abc123:gpu7" in out.stdout and "lost run #" in out.stdout and "re-queued as #99" in out.stdout
    js = json.loads(subprocess.run([sys.executable, "-m", "mcp_server.cli", "status", "--json", "-w", str(ws.root)],
                                   cwd=REPO, capture_output=True, text=True, timeout=120).stdout)
    assert js["executor"]["lost"][0]["worker"] == "ray:abc123:gpu7"
    from mcp_server.report.writer import write_report

    md = write_report(ws.root).markdown.read_text()
    assert "## Executor and workers" in md and "Lost runs (a worker or node died): 1; re-queued once: 1" in md
    assert "`ray:abc123:gpu7`" in md
    assert time.monotonic() - t0 < 600
