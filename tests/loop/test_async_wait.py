"""wait() semantics and the driver's reconcile, on an instant executor (no training: each run's val_bpb is a
function of its source and seed), so the engine's bookkeeping is what is tested: `wait()` without ids returns
every decision the caller has not been given yet (also those decided inside submit_experiment or state_read),
and returns at once when nothing is in flight and nothing is undelivered."""
from __future__ import annotations

import time
from typing import Iterable, Optional

import pytest
from test_executors import STEPS

from mcp_server.executors.base import RunOutcome, RunSpec
from mcp_server.loop import asyncrun
from mcp_server.loop.engine import Engine
from mcp_server.loop.errors import LoopError

from conftest import hobbled_bench, make_workspace, set_constant


class InstantExecutor:
    """Finishes every run the moment it is submitted: val_bpb 2.0 (+ a per-seed wobble), 0.1 lower when the
    source has the normal learning rate."""
    kind = "local"

    def __init__(self, capacity: int = 4):
        self.capacity = capacity
        self._done: dict[int, RunOutcome] = {}

    def submit(self, spec: RunSpec) -> int:
        val = 2.0 + (spec.seed % 7) * 0.001 - (0.1 if "LR = 0.004" in spec.sources["train.py"] else 0.0)
        self._done[spec.run_id] = RunOutcome(spec.run_id, "ok", val_bpb=val, test_bpb=val, eval_seconds=0.1,
                                             summary={"num_steps": 1}, sandbox="bwrap", worker="local:test:1")
        return spec.run_id

    def wait(self, handles: Optional[Iterable[int]] = None, timeout: Optional[float] = None) -> list[RunOutcome]:
        out, self._done = list(self._done.values()), {}
        if not out and timeout:
            time.sleep(min(timeout, 0.05))
        return out

    def cancel(self, handle: int) -> None:
        self._done.pop(handle, None)

    def in_flight(self) -> list[int]:
        return list(self._done)

    def close(self) -> None:
        self._done = {}


@pytest.fixture
def instant(monkeypatch):
    monkeypatch.setattr(asyncrun, "make_executor", lambda *a, **k: InstantExecutor())


def _settled(eng: Engine, sub_id: int) -> None:
    deadline = time.monotonic() + 30
    while eng.ledger.submission(sub_id)["decided_at"] is None:
        assert time.monotonic() < deadline, "never decided"
        eng.state("summary")          # state_read polls: records and decides
        time.sleep(0.05)


def test_wait_any_returns_decisions_made_elsewhere_and_never_blocks_on_nothing(tmp_path, small_corpus, instant):
    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench"), **STEPS)
    eng = Engine(ws.root)
    try:
        base = eng.submit_experiment("baseline")
        res = eng.wait([base.experiment_id], timeout=30)
        assert [r.experiment_id for r in res.results] == [base.experiment_id] and not res.timed_out
        # decided inside state_read, before any wait(): wait() for "any" must still hand it over
        set_constant(ws.root / "train.py", "LR", "0.004")
        good = eng.submit_experiment("normal learning rate")
        _settled(eng, good.experiment_id)
        t0 = time.monotonic()
        res = eng.wait(None, timeout=20)
        assert [r.experiment_id for r in res.results] == [good.experiment_id], res
        assert res.results[0].state == "decided" and not res.timed_out
        assert time.monotonic() - t0 < 5
        # given once: nothing in flight and nothing undelivered -> at once, saying so (never a 20 s block)
        t0 = time.monotonic()
        res = eng.wait(None, timeout=20)
        assert res.results == [] and res.in_flight == [] and not res.timed_out
        assert "nothing in flight" in res.next_step.lower(), res.next_step
        assert time.monotonic() - t0 < 5
        # decided inside submit_experiment (it settles first): the next wait() returns it
        set_constant(ws.root / "train.py", "DEPTH", "3")      # the bench has 2: both differ from the best,
        one = eng.submit_experiment("one block more")         # whether or not `one` is kept
        set_constant(ws.root / "train.py", "DEPTH", "4")
        two = eng.submit_experiment("two blocks more")        # settles `one` before it queues
        got: list[int] = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            got += [r.experiment_id for r in eng.wait(None, timeout=10).results]
        assert sorted(got) == [one.experiment_id, two.experiment_id], got
        # wait(ids) delivers too: asking for "any" afterwards does not repeat it
        res = eng.wait([one.experiment_id], timeout=0)
        assert [r.experiment_id for r in res.results] == [one.experiment_id]
        assert eng.wait(None, timeout=5).results == []
    finally:
        asyncrun.close_driver(eng)
        eng.close()


_CRASHING_DRIVER = r'''
import sys, time
from mcp_server.loop import asyncrun
from mcp_server.loop.engine import Engine
from mcp_server.loop.errors import LoopError

class Hang:
    """Takes runs and never finishes them (the driver is killed with -9 meanwhile)."""
    kind, capacity = "local", 4
    def __init__(self): self.h = []
    def submit(self, spec): self.h.append(spec.run_id); return spec.run_id
    def wait(self, handles=None, timeout=None): time.sleep(timeout or 0.1); return []
    def cancel(self, handle): pass
    def in_flight(self): return list(self.h)
    def close(self): pass

asyncrun.make_executor = lambda *a, **k: Hang()
eng = Engine(sys.argv[1])
sub = eng.submit_experiment("baseline")
print("submitted", sub.experiment_id, flush=True)
time.sleep(600)
'''


def test_a_dead_drivers_runs_are_left_to_the_next_driver_not_read_only_opens(tmp_path, small_corpus, instant):
    """kill -9 of a driver with runs in flight: `loopwright status` (a read-only open) shows them in flight and
    changes nothing; the next driver re-queues them and decides."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import REPO

    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench"), **STEPS)
    script = tmp_path / "driver.py"
    script.write_text(_CRASHING_DRIVER)
    proc = subprocess.Popen([sys.executable, str(script), str(ws.root)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("submitted"), line
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with Engine(ws.root) as eng:      # an open (as every read-only command does) reconciles nothing
        c = eng.campaign
        runs = [r["run_id"] for r in eng.ledger.inflight(c["id"])]
        assert len(runs) == 2 and all(eng.ledger.experiment(i)["status"] == "running" for i in runs)
    out = subprocess.run([sys.executable, "-m", "mcp_server.cli", "status", "-w", str(ws.root)], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "in flight 2 run(s)" in out.stdout and "no driver running" in out.stdout, out.stdout
    eng = Engine(ws.root)
    try:
        c = eng.campaign
        assert [r["run_id"] for r in eng.ledger.inflight(c["id"])] == runs
        assert all(eng.ledger.experiment(i)["status"] == "running" for i in runs)
        assert eng.ledger.submissions(c["id"], open_only=True)
        # the next driver: unfinished runs re-queued (once), then recorded and decided
        res = eng.wait(None, timeout=30)
        assert [r.experiment_id for r in res.results] == [runs[0]] and res.results[0].state == "decided", res
        for i in runs:
            old = eng.ledger.experiment(i)
            assert old["status"] == "interrupted" and "re-queued as #" in old["reason"], old
            new = eng.ledger.experiment(int(old["reason"].rsplit("#", 1)[1]))
            assert new["status"] == "ok" and new["seed"] == old["seed"]
        assert res.results[0].status == "ok" and eng.ledger.inflight() == []
    finally:
        asyncrun.close_driver(eng)
        eng.close()


def test_submit_records_the_structured_change_and_refuses_one_train_py_does_not_show(tmp_path, small_corpus,
                                                                                     instant):
    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench"), **STEPS)
    eng = Engine(ws.root)
    try:
        base = eng.submit_experiment("baseline")
        eng.wait([base.experiment_id], timeout=30)
        set_constant(ws.root / "train.py", "LR", "0.004")            # the hobbled bench has 0.0002
        n = eng.ledger.count_experiments(eng.campaign["id"])
        with pytest.raises(LoopError, match="change says LR 0.0002 -> 0.008"):
            eng.submit_experiment("normal learning rate", change={"name": "LR", "old": 0.0002, "new": 0.008})
        assert eng.ledger.count_experiments(eng.campaign["id"]) == n     # nothing queued
        good = eng.submit_experiment("normal learning rate", change={"name": "LR", "old": 0.0002, "new": 0.004})
        eng.wait([good.experiment_id], timeout=30)
        cand = eng.ledger.experiment(good.experiment_id)
        assert cand["change"] == {"name": "LR", "old": 0.0002, "new": 0.004}
        assert all(r["change"] is None for r in eng.ledger.confirm_runs(cand["id"]))   # the pair runs: the candidate's
    finally:
        asyncrun.close_driver(eng)
        eng.close()


class _Hang(InstantExecutor):
    """Takes runs and never finishes them (the driver is stopped meanwhile)."""

    def submit(self, spec: RunSpec) -> int:
        self._done[spec.run_id] = None   # type: ignore[assignment]
        return spec.run_id

    def wait(self, handles: Optional[Iterable[int]] = None, timeout: Optional[float] = None) -> list[RunOutcome]:
        time.sleep(min(timeout or 0.05, 0.05))
        return []


def test_an_interrupted_candidate_is_re_queued_and_judged_on_its_new_runs(tmp_path, small_corpus, monkeypatch):
    """A driver stops while a candidate's runs are in flight: the next driver re-queues them, and the verdict is
    on the new runs (the interrupted rows hang under the new candidate and must not count as its failure)."""
    monkeypatch.setattr(asyncrun, "make_executor", lambda *a, **k: InstantExecutor())
    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench"), **STEPS)
    eng = Engine(ws.root)
    try:
        base = eng.submit_experiment("baseline")
        eng.wait([base.experiment_id], timeout=30)
        asyncrun.close_driver(eng)
        monkeypatch.setattr(asyncrun, "make_executor", lambda *a, **k: _Hang())
        set_constant(ws.root / "train.py", "LR", "0.004")
        sub = eng.submit_experiment("normal learning rate")
        assert eng.ledger.inflight(eng.campaign["id"]), "the candidate's runs are in flight"
        asyncrun.close_driver(eng)                       # the driver stops; its runs stay in flight
        monkeypatch.setattr(asyncrun, "make_executor", lambda *a, **k: InstantExecutor())
        res = eng.wait(None, timeout=30)
        assert res.results and all(r.state == "decided" for r in res.results), res
        old = eng.ledger.experiment(sub.experiment_id)
        assert old["status"] == "interrupted" and "re-queued as #" in old["reason"], old
        new = eng.ledger.experiment(int(old["reason"].rsplit("#", 1)[1]))
        assert new["status"] == "ok", new
        assert new["verdict"] == "keep", (new["verdict"], new["verdict_reason"])
        assert eng.campaign["best_commit"] == new["commit_sha"]
    finally:
        asyncrun.close_driver(eng)
        eng.close()
