"""The Ray executor against a REAL local Ray cluster this module starts: `ray start --head` plus a second
worker node, on this machine, with their own ports and temp dir (bench/perf/raycluster.py: torn down by
process group, never `ray stop`, which would end other people's clusters too).

One cluster for the module. A campaign with two experiments in flight ends with the ledger and git
consistent and its runs identical, on the `steps` clock, to the local executor's on the same seeds; a
Ray worker killed mid-experiment gives a `lost` run, re-queued and recorded; an unreachable head is a
clear error naming the address, with nothing recorded.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import socket
import time

import pytest

ray = pytest.importorskip("ray", reason="the ray package is not installed (pip install 'loopwright[ray]')")

from test_executors import STEPS, check_consistent, configure, run_async_campaign  # noqa: E402

from mcp_server.executors import workcopy  # noqa: E402
from mcp_server.loop import asyncrun, gitops  # noqa: E402
from mcp_server.loop.engine import Engine, LoopError  # noqa: E402

from conftest import REPO, hobbled_bench, make_workspace, set_constant  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _load_cluster_helper():
    spec = importlib.util.spec_from_file_location("raycluster", REPO / "bench" / "perf" / "raycluster.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cluster():
    helper = _load_cluster_helper()
    # head with one task slot + one worker node with one: two runs in flight, on two nodes
    c = helper.LocalRayCluster(worker_nodes=1, cpus_per_node=1, head_cpus=1,
                               env={"LOOPWRIGHT_TEST_SECRET": "must-not-reach-train.py"})
    c.start()
    try:
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.stop()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from conftest import make_small_corpus
    return make_small_corpus(tmp_path_factory.mktemp("raycorpus"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_head_is_a_clear_error_and_records_nothing(tmp_path, corpus):
    ws = make_workspace(tmp_path / "ws", corpus, bench_dir=hobbled_bench(tmp_path / "bench"), **STEPS)
    address = f"127.0.0.1:{_free_port()}"        # nothing listens there
    configure(ws.root, **{"executor.kind": '"ray"', "executor.address": f'"{address}"'})
    eng = Engine(ws.root)
    rows_before = eng.ledger.count_experiments(eng.campaign["id"])
    t0 = time.monotonic()
    with pytest.raises(LoopError, match=f"Ray cluster at {address} is unreachable") as err:
        eng.submit_experiment("baseline")
    assert "executor.address" in str(err.value) and time.monotonic() - t0 < 30
    assert eng.ledger.count_experiments(eng.campaign["id"]) == rows_before
    assert eng.ledger.submissions(eng.campaign["id"]) == [] and eng.ledger.inflight() == []
    assert gitops.head_sha(ws.root) == eng.campaign["best_commit"]
    eng.close()


def _busy_ray_workers(pgids: list[int]) -> list[int]:
    """Ray worker processes of OUR cluster running a loopwright run right now: a `ray::_run_remote` process
    whose parent (the raylet) is in one of our cluster's process groups, and that has a child (the sandbox).
    Ray puts each worker in its own process group, so the parent is what ties it to this cluster."""
    info: dict[int, tuple[int, int, str]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fields = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
            cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        info[int(d)] = (int(fields[1]), int(fields[2]), cmd)
    parents = {ppid for ppid, _, _ in info.values()}
    return [pid for pid, (ppid, _, cmd) in info.items()
            if "_run_remote" in cmd and ppid in info and info[ppid][1] in pgids and pid in parents]


def test_campaign_on_ray_two_in_flight_then_a_worker_dies(tmp_path, corpus, cluster):
    ws = make_workspace(tmp_path / "ws", corpus, bench_dir=hobbled_bench(tmp_path / "bench"), **STEPS)
    configure(ws.root, **{"executor.kind": '"ray"', "executor.address": f'"{cluster.address}"',
                          "executor.parallel": "2"})
    eng, r = run_async_campaign(ws.root)
    assert r["base"].status == "ok" and r["good"].verdict == "keep", r
    assert r["other"].rebased_from, r["other"]
    check_consistent(eng)
    c = eng.campaign
    rows = eng.ledger.experiments(c["id"], where="status='ok'")
    import json
    workers = {json.loads(x["metrics_json"])["worker"].split(":")[1] for x in rows}
    assert len(workers) == 2, f"both nodes ran experiments: {workers}"
    logs = [(eng.ws.run_dir(x["id"]) / "train.log").read_text() for x in rows]
    assert all("must-not-reach-train.py" not in t for t in logs)

    # the steps clock: the same spec on the local executor gives the identical result
    base_row = eng.ledger.experiment(r["base"].current_id)
    spec = asyncrun.spec_for(eng, c, base_row)
    local = workcopy.run(spec, workcopy.dir_source(eng.ws.data_dir), tmp_path / "local")
    assert local.status == "ok" and local.val_bpb == base_row["val_bpb"], (local.val_bpb, base_row["val_bpb"])

    # a Ray worker killed mid-experiment: the run is lost, re-queued once, and both are recorded
    set_constant(ws.root / "train.py", "DEPTH", "2")
    sub = eng.submit_experiment("two blocks")
    deadline, victim = time.monotonic() + 120, None
    while victim is None and time.monotonic() < deadline:
        busy = _busy_ray_workers(cluster.pgids)
        victim = busy[0] if busy else None
        time.sleep(0.5)
    assert victim, "no Ray worker was seen running the experiment"
    time.sleep(2)
    os.kill(victim, signal.SIGKILL)
    res = eng.wait([sub.experiment_id], timeout=900)
    out = res.results[0]
    assert out.state == "decided" and out.lost_runs, out
    lost = eng.ledger.experiment(out.lost_runs[0])
    assert lost["status"] == "lost" and "re-queued as #" in lost["reason"], lost
    again = eng.ledger.experiment(int(lost["reason"].rsplit("#", 1)[1]))
    assert again["status"] == "ok" and again["seed"] == lost["seed"] and again["commit_sha"] == lost["commit_sha"]
    assert [e["payload"]["experiment_id"] for e in eng.ledger.events(c["id"], kind="run_lost")] == [lost["id"]]
    assert out.verdict in ("keep", "discard", "retest") or out.status == "ok"
    check_consistent(eng)
    asyncrun.close_driver(eng)
    eng.close()
