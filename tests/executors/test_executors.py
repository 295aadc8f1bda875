"""Executors and asynchronous experiments on this machine: the interface's checks, and a real campaign
(submit_experiment / wait) on the local executor with two runs in flight."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from mcp_server.executors import workcopy
from mcp_server.executors.base import ExecutorError, RunOutcome, RunSpec
from mcp_server.ledger.store import Ledger
from mcp_server.loop import gitops
from mcp_server.loop import settings as setmod
from mcp_server.loop.config import ExecutorConfig
from mcp_server.loop.engine import Engine, LoopError

from conftest import hobbled_bench, make_workspace, set_constant

# The steps clock: a run is a fixed number of training tokens, so its result does not depend on the machine's load.
STEPS = {"benchmark": {"clock": "steps", "budget_tokens": 24 * 8 * 256, "eval_tokens": 8192}}


def _spec(**kw):
    base = dict(run_id=1, seed=1001, sources={"train.py": "print(1)"},
                evaluator={"prepare.py": b"", "loopwright.toml": b""}, data={"train.bin": "0" * 64})
    return RunSpec(**{**base, **kw})


def test_run_spec_refuses_what_cannot_run():
    with pytest.raises(ExecutorError, match="relative"):
        _spec(sources={"../x.py": ""})
    with pytest.raises(ExecutorError, match="frozen evaluator"):
        _spec(sources={"prepare.py": ""})
    with pytest.raises(ExecutorError, match="loopwright.toml"):
        _spec(evaluator={"prepare.py": b""})
    with pytest.raises(ExecutorError, match="train.bin"):
        _spec(data={"val.bin": "0" * 64})
    out = RunOutcome(3, "lost", "gone", worker="ray:abc")
    assert out.lost and RunOutcome.from_json(out.to_json()) == out


def test_data_is_verified_against_the_manifest(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.bin").write_bytes(b"tokens")
    good = hashlib.sha256(b"tokens").hexdigest()
    workcopy.stage_data({"train.bin": good}, workcopy.dir_source(src), tmp_path / "a")
    assert (tmp_path / "a" / "train.bin").read_bytes() == b"tokens"
    (src / "train.bin").write_bytes(b"tampered")
    with pytest.raises(ExecutorError, match="train.bin .* hashes to"):
        workcopy.stage_data({"train.bin": good}, workcopy.dir_source(src), tmp_path / "b")
    with pytest.raises(ExecutorError, match="missing"):
        workcopy.stage_data({"val.bin": good}, workcopy.dir_source(src), tmp_path / "c")


def test_executor_settings_are_checked_with_actionable_errors():
    assert ExecutorConfig(kind="ray", address="ray://head:10001").address == "ray://head:10001"
    assert ExecutorConfig(address="10.0.0.5:6379").address == "10.0.0.5:6379"
    with pytest.raises(ValueError, match="not a Ray address"):
        ExecutorConfig(address="http://head")
    with pytest.raises(setmod.SettingsError, match="parallel"):
        setmod.set_value(setmod.Settings(), "executor.parallel", "0")
    assert "executor.num_gpus" in setmod.keys()


def test_missing_ray_package_is_a_clear_error(monkeypatch):
    from mcp_server.executors import ray as rayexec

    monkeypatch.setitem(sys.modules, "ray", None)     # what `import ray` sees without the package
    with pytest.raises(ExecutorError, match=r"pip install 'loopwright\[ray\]'"):
        rayexec.connect("auto")


def test_a_driver_not_connected_to_ray_never_starts_a_cluster_of_its_own(tmp_path):
    """Ray's auto-init would start a private local cluster on the first call of an unconnected process (and
    write ~/.ray/auth_token): once loopwright's executor has imported ray, such a call fails instead."""
    pytest.importorskip("ray")
    import subprocess

    code = ("from mcp_server.executors.ray import _import_ray\n"
            "ray = _import_ray()\n"
            "try:\n    ray.put(1)\nexcept Exception as e:\n    print('refused', type(e).__name__)\n"
            "else:\n    print('started', ray.is_initialized())\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.stdout.startswith("refused"), (p.stdout, p.stderr[-2000:])
    assert not (tmp_path / ".ray").exists()


def test_lost_is_a_status_the_ledger_accepts(tmp_path):
    with Ledger(tmp_path / "state.db") as led:
        cid = led.create_campaign("t", "loopwright/t", "0" * 40)
        eid = led.start_experiment(cid, "x")
        led.update_experiment(eid, status="lost", finished_at=1.0)
        assert led.experiment(eid)["status"] == "lost"
        assert led.usage(cid)[0] == 0          # a lost run is not counted: its re-queued run is


def configure(ws_root, **values):
    path = Engine(ws_root).ws.settings_path
    s = setmod.load(path)
    for k, v in values.items():
        s = setmod.set_value(s, k, v)
    setmod.save(path, s)


def check_consistent(eng: Engine):
    """Ledger and git agree: nothing running or in flight, every submission decided, the branch at the best,
    every kept experiment's commit on the branch's history, the best's runs ok."""
    c = eng.campaign
    assert eng.ledger.running_experiments() == []
    assert eng.ledger.inflight() == []
    assert all(s["decided_at"] for s in eng.ledger.submissions(c["id"]))
    assert gitops.head_sha(eng.ws.root) == c["best_commit"]
    r = gitops.repo(eng.ws.root)
    for e in eng.ledger.kept_candidates(c["id"]):
        assert r.is_ancestor(e["commit_sha"], c["best_commit"])
    used, _ = eng.ledger.usage(c["id"])
    assert used == sum(x["status"] not in ("running", "lost") for x in eng.ledger.experiments(c["id"]))


def run_async_campaign(ws_root, good_lr="0.004"):
    """baseline, then two candidates in flight at once: a real gain (the normal LR) and, submitted while it
    runs, another change measured against the baseline -- stale once the first is kept, so it is rebased onto
    the new best and re-measured. Returns (engine, results by name)."""
    train = ws_root / "train.py"
    eng = Engine(ws_root)
    base = eng.submit_experiment("baseline")
    assert base.kind == "baseline" and len(base.runs) == 2
    set_constant(train, "LR", good_lr)
    good = eng.submit_experiment("normal learning rate", "LR 2e-4 is far too low")
    assert good.kind == "candidate" and good.seeds == base.seeds
    # train.py is free at once: the next edit while the first is in flight
    assert gitops.current_branch(ws_root) == eng.campaign["branch"] and gitops.head_sha(ws_root) == eng.campaign["best_commit"]
    set_constant(train, "LR", "0.0002")
    set_constant(train, "DEPTH", "3")
    other = eng.submit_experiment("one block fewer")
    view = eng.state("summary")
    assert set(view.pending) >= {good.experiment_id, other.experiment_id}
    assert view.in_flight, "queued or running runs are shown"
    res = eng.wait([base.experiment_id, good.experiment_id, other.experiment_id], timeout=900)
    assert not res.timed_out, res
    return eng, {"base": res.results[0], "good": res.results[1], "other": res.results[2]}


@pytest.mark.slow
def test_local_async_campaign_two_in_flight(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench", tiny=True), **STEPS)
    configure(ws.root, **{"executor.parallel": "2"})
    eng, r = run_async_campaign(ws.root)
    assert r["base"].state == "decided" and r["base"].status == "ok"
    assert r["good"].verdict == "keep", r["good"]
    # the other change was measured against the baseline, but the best moved: rebased and re-measured
    other = r["other"]
    assert other.rebased_from and other.current_id != other.experiment_id, other
    old = eng.ledger.experiment(other.rebased_from[0])
    assert old["verdict"] == "discard" and "stale" in old["verdict_reason"]
    new = eng.ledger.experiment(other.current_id)
    assert new["parent_commit"] == eng.ledger.experiment(r["good"].current_id)["commit_sha"] or new["verdict"] == "keep"
    assert all(p.reference_run in {x["id"] for x in eng.ledger.runs_of_commit(eng.campaign["id"], new["parent_commit"])}
               for p in other.pairs)
    src = gitops.blob_bytes(ws.root, new["commit_sha"], "train.py").decode()
    assert "LR = 0.004" in src and "DEPTH = 3" in src       # the 3-way merge kept both changes
    check_consistent(eng)
    # the agent's pending edit stayed in the tree (the branch moved under it); the synchronous path shares the
    # history: the same source is an exact repeat
    with pytest.raises(LoopError, match=f"exact repeat of experiment #{other.experiment_id}"):
        eng.run_experiment("again")
    eng.close()


def test_a_cancelled_local_run_kills_its_sandbox_and_leaves_no_outcome(tmp_path, small_corpus):
    """Cancelling a running local run stops train.py at once (not at the hard limit), evaluates nothing and
    saves no outcome.json, so a later driver treats the run as unfinished (interrupted, re-queued)."""
    import os
    import time

    from mcp_server.executors.local import LocalExecutor
    from mcp_server.loop import asyncrun

    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench", tiny=True))
    eng = Engine(ws.root)
    evaluator = {n: (ws.root / n).read_bytes() for n in ("prepare.py", "loopwright.toml")}
    spec = RunSpec(run_id=7, seed=1001, evaluator=evaluator, data=asyncrun.data_manifest(eng, eng.campaign),
                   sources={"train.py": "import os, time\nopen(os.environ['LOOPWRIGHT_RUN_DIR'] + '/started', 'w').close()\n"
                                        "time.sleep(600)\n"})
    work = tmp_path / "work"
    ex = LocalExecutor(eng.ws.data_dir, work, eng.ws.run_dir)

    def sandbox_pids(top: str) -> list[int]:   # processes whose command line names the run's working copy
        pids = []
        for d in os.listdir("/proc"):
            try:
                if d.isdigit() and top in (Path("/proc") / d / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(d))
            except OSError:
                pass
        return pids

    ex.submit(spec)
    deadline = time.monotonic() + 120
    started: list = []
    while time.monotonic() < deadline and not started:
        time.sleep(0.2)
        started = list(work.glob("loopwright-run-*/run/scratch/started"))
    assert started, "train.py never started"
    top = str(started[0].parents[2])
    assert sandbox_pids(top), "the sandboxed train.py is running"
    t0 = time.monotonic()
    ex.cancel(7)
    assert ex.in_flight() == [] and ex.wait(timeout=1) == []
    while time.monotonic() - t0 < 20 and (os.path.exists(top) or sandbox_pids(top)):
        time.sleep(0.1)
    assert not sandbox_pids(top), "the sandbox outlived the cancel"
    assert not os.path.exists(top), "the working copy is removed once the run ends"
    assert time.monotonic() - t0 < 20          # not the 600 s sleep, nor the hard limit
    assert not (eng.ws.run_dir(7) / "outcome.json").exists()
    ex.close()
    eng.close()
