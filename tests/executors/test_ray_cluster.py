"""The Ray executor against a REAL local Ray cluster this module starts: `ray start --head` plus a second
worker node, on this machine, with their own ports and temp dir (bench/perf/raycluster.py: torn down by
process group, never `ray stop`, which would end other people's clusters too).

One cluster for the module, booted while the workspace is made; tiny runs (a few steps on the steps clock, a
small evaluation). The baseline's two runs go to both nodes at once and are identical, on the `steps` clock,
to the local executor's on the same seed; no secret of the cluster's environment reaches train.py; a Ray
worker killed mid-experiment gives a `lost` run, re-queued and recorded, and the ledger and git end
consistent; the same through Ray Client (`ray://`); a whole worker node killed mid-experiment gives the same,
the run finishing on the node left; an unreachable head is a clear error naming the address, with nothing
recorded. (Two
experiments in flight, a stale one rebased and re-measured, is the engine's logic, the same on every
executor: tests/executors/test_executors.py runs it on the local one.)
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

ray = pytest.importorskip("ray", reason="the ray package is not installed (pip install 'loopwright[ray]')")
from ray.util.client import ray as ray_client  # noqa: E402
from test_executors import check_consistent, configure  # noqa: E402

from mcp_server.executors import workcopy  # noqa: E402
from mcp_server.loop import asyncrun, gitops  # noqa: E402
from mcp_server.loop.engine import Engine, LoopError  # noqa: E402

from conftest import REPO, hobbled_bench, make_workspace, set_constant  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _load_cluster_helper():
    spec = importlib.util.spec_from_file_location("raycluster", REPO / "bench" / "perf" / "raycluster.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Tiny runs: a few training steps on the steps clock and a small evaluation (what is shown is where runs go and
# how the ledger records them, not what they learn).
TINY_STEPS = 4
TINY = {"benchmark": {"clock": "steps", "budget_tokens": TINY_STEPS * 8 * 256, "eval_tokens": 2048}}


def _unmasked_base() -> Optional[Path]:
    """A writable folder outside every default mask of the sandbox (temp dirs, homes, /run, /mnt...):
    where a cluster's node-local scratch would be. LOOPWRIGHT_TEST_UNMASKED_DIR names one; else the
    repository's folder or its parent when they qualify."""
    static = ("/tmp", "/var/tmp", "/run", "/var/run", "/home", "/root", "/mnt", "/media", os.path.expanduser("~"))
    masked = [os.path.realpath(m) for m in static if os.path.isdir(m)]
    for cand in (os.environ.get("LOOPWRIGHT_TEST_UNMASKED_DIR"), str(REPO.parent), str(REPO)):
        if cand and os.path.isdir(cand) and os.access(cand, os.W_OK):
            real = os.path.realpath(cand)
            if not any(real == m or real.startswith(m + "/") for m in masked):
                return Path(real)
    return None


@pytest.fixture(scope="module")
def unmasked():
    """The workers' TMPDIR and state home, outside every default mask (red team C1: a node-local scratch
    TMPDIR held the worker's data cache, val and test included, and other runs' working copies)."""
    base = _unmasked_base()
    if base is None:
        yield None
        return
    d = Path(tempfile.mkdtemp(prefix=".lw-ray-unmasked-", dir=base))
    (d / "tmp").mkdir()
    (d / "home").mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster_boot(unmasked):
    """The cluster starts in the background (the workspace is made meanwhile); `cluster` waits for it."""
    helper = _load_cluster_helper()
    env = {"LOOPWRIGHT_TEST_SECRET": "must-not-reach-train.py"}
    if unmasked is not None:
        env.update(TMPDIR=str(unmasked / "tmp"), LOOPWRIGHT_HOME=str(unmasked / "home"))
    # head with one task slot + one worker node with one: two runs in flight, on two nodes
    c = helper.LocalRayCluster(worker_nodes=1, cpus_per_node=1, head_cpus=1, env=env)
    errors: list[BaseException] = []

    def boot():
        try:
            c.start()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test that needs the cluster
            errors.append(e)

    t = threading.Thread(target=boot, daemon=True)
    t.start()
    try:
        yield c, t, errors
    finally:
        t.join(timeout=300)
        if ray.is_initialized():
            ray.shutdown()
        c.stop(grace=1.0)


@pytest.fixture(scope="module")
def cluster(cluster_boot):
    c, t, errors = cluster_boot
    t.join(timeout=300)
    if errors:
        raise errors[0]
    assert c.address, "the Ray cluster did not start"
    return c


@pytest.fixture(scope="module")
def ws(tmp_path_factory, small_corpus, cluster_boot):
    """One workspace for the module (the unreachable-head test records nothing in it)."""
    tmp = tmp_path_factory.mktemp("rayws")
    return make_workspace(tmp / "ws", small_corpus, bench_dir=hobbled_bench(tmp / "bench", max_steps=TINY_STEPS),
                          noise={"baseline_seeds": 2}, **TINY)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_head_is_a_clear_error_and_records_nothing(ws):
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


def test_campaign_on_ray_two_nodes_then_a_worker_dies(tmp_path, ws, cluster):
    configure(ws.root, **{"executor.kind": '"ray"', "executor.address": f'"{cluster.address}"',
                          "executor.parallel": "2"})
    eng = Engine(ws.root)
    c = eng.campaign
    # the baseline: two runs in flight at once, one on each node (each has one task slot)
    base = eng.submit_experiment("baseline")
    assert base.kind == "baseline" and len(base.runs) == 2 and base.executor == "ray"
    res = eng.wait([base.experiment_id], timeout=600)
    assert not res.timed_out and res.results[0].status == "ok", res
    rows = [r for r in eng.ledger.experiments(c["id"]) if r["status"] == "ok"]
    workers = {json.loads(x["metrics_json"])["worker"].split(":")[1] for x in rows}
    assert len(rows) == 2 and len(workers) == 2, f"both nodes ran a run: {workers}"
    logs = [(eng.ws.run_dir(x["id"]) / "train.log").read_text() for x in rows]
    assert all(t and "must-not-reach-train.py" not in t for t in logs)

    # the steps clock: the same spec on the local executor gives the identical result (run meanwhile, while the
    # killed run's re-queued twin is the only one on the cluster)
    base_row = eng.ledger.experiment(base.runs[0])
    spec = asyncrun.spec_for(eng, c, base_row)
    local: list = []
    on_local = threading.Thread(target=lambda: local.append(
        workcopy.run(spec, workcopy.dir_source(eng.ws.data_dir), tmp_path / "local")))

    # a Ray worker killed mid-experiment: the run is lost, re-queued once, and both are recorded
    set_constant(ws.root / "train.py", "LR", "0.004")
    sub = eng.submit_experiment("normal learning rate")
    deadline, victim = time.monotonic() + 120, None
    while victim is None and time.monotonic() < deadline:
        busy = _busy_ray_workers(cluster.pgids)
        victim = busy[0] if busy else None
        time.sleep(0.2)
    assert victim, "no Ray worker was seen running the experiment"
    os.kill(victim, signal.SIGKILL)
    on_local.start()
    res = eng.wait([sub.experiment_id], timeout=600)
    on_local.join(timeout=600)
    assert local and local[0].status == "ok", local
    assert local[0].val_bpb == base_row["val_bpb"], (local[0].val_bpb, base_row["val_bpb"])
    out = res.results[0]
    assert out.state == "decided" and out.lost_runs, out
    lost = eng.ledger.experiment(out.lost_runs[0])
    assert lost["status"] == "lost" and "re-queued as #" in lost["reason"], lost
    lost_on = json.loads(lost["metrics_json"])["worker"]
    print(f"lost run recorded on worker {lost_on!r}; nodes {workers}")
    again = eng.ledger.experiment(int(lost["reason"].rsplit("#", 1)[1]))
    assert again["status"] == "ok" and again["seed"] == lost["seed"] and again["commit_sha"] == lost["commit_sha"]
    assert [e["payload"]["experiment_id"] for e in eng.ledger.events(c["id"], kind="run_lost")] == [lost["id"]]
    assert out.verdict in ("keep", "discard") and out.status == "ok", out
    check_consistent(eng)
    asyncrun.close_driver(eng)
    eng.close()


def test_a_campaign_reaches_the_cluster_through_ray_client(ws, cluster):
    """`executor.address = "ray://host:port"` (Ray Client, the way a laptop drives a remote cluster): the
    candidate's runs go through the head's client server to the cluster's nodes and are recorded as usual."""
    address = f"ray://127.0.0.1:{cluster.client_port}"
    configure(ws.root, **{"executor.kind": '"ray"', "executor.address": f'"{address}"', "executor.parallel": "2"})
    eng = Engine(ws.root)
    set_constant(ws.root / "train.py", "LR", "0.003")
    sub = eng.submit_experiment("learning rate through ray client")
    res = eng.wait([sub.experiment_id], timeout=300)
    out = res.results[0]
    assert not res.timed_out and out.state == "decided" and out.status == "ok", res
    ok = [row for row in (eng.ledger.experiment(r) for r in sub.runs) if row["status"] == "ok"]
    assert ok and all(json.loads(r["metrics_json"])["worker"].startswith("ray:") for r in ok), ok
    check_consistent(eng)
    asyncrun.close_driver(eng)
    eng.close()


def test_a_target_campaign_runs_on_the_cluster_and_its_hidden_files_stay_out_of_the_working_copy(tmp_path, cluster):
    """A user's own target (issue 27) on Ray: the editable file and the pinned files travel by content, the
    hidden files only to the evaluator; the candidate's run, on a worker, scores and is decided as usual."""
    from mcp_server.loop.setup import init_workspace

    ws = init_workspace(tmp_path / "fastsum", target="fastsum")
    eng = Engine(ws.root)
    try:
        assert eng.run_experiment("baseline").status == "ok"       # locally: the reference's seed set
        configure(ws.root, **{"executor.kind": '"ray"', "executor.address": f'"{cluster.address}"',
                              "executor.parallel": "2"})
        last = eng.ledger.experiments(eng.campaign["id"], limit=1, newest_first=True)[0]   # a baseline run
        spec = asyncrun.spec_for(eng, eng.campaign, last)
        assert spec.target and set(spec.hidden) == {"hidden/reference.py"} and not spec.data
        assert not any(rel.startswith("hidden/") for rel in spec.evaluator), "hidden files never enter the copy"
        set_constant(ws.root / "solution.py", "SEGMENT", "32")
        sub = eng.submit_experiment("SEGMENT 16 -> 32 on ray")
        res = eng.wait([sub.experiment_id], timeout=300)
        out = res.results[0]
        assert not res.timed_out and out.state == "decided" and out.status == "ok", res
        ok = [row for row in (eng.ledger.experiment(r) for r in sub.runs) if row["status"] == "ok"]
        assert ok and all(json.loads(r["metrics_json"])["worker"].startswith("ray:") for r in ok), ok
        assert all(r["val_bpb"] and r["val_bpb"] > 0 for r in ok)     # the measured CPU seconds
        check_consistent(eng)
        asyncrun.close_driver(eng)
    finally:
        eng.close()


ATTACK = r"""
import hashlib, json, os, sys
# red team C1: read every file under the worker's TMPDIR and state home, and where the cache used to be
found = {}
for root in ROOTS:
    for d, dirs, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            try:
                with open(p, "rb") as f:
                    found[p] = hashlib.sha256(f.read()).hexdigest()
            except OSError:
                pass
print("FOUND " + json.dumps(found))
sys.exit(3)
"""


def test_train_py_on_a_worker_reads_no_held_out_data_nor_other_working_copies(ws, cluster, unmasked):
    """Red team C1, on the real cluster with the workers' TMPDIR and state home outside every default mask:
    the worker caches data under its private state-home dir (never the temp dir) and fetches val/test only
    for the evaluation; the cache and the other runs' working copies are hidden from train.py. A train.py
    that reads everything it can find there sees neither a held-out split nor another working copy."""
    if unmasked is None:
        pytest.skip("no writable folder outside the sandbox's default masks here (set LOOPWRIGHT_TEST_UNMASKED_DIR)")
    from mcp_server.executors.base import RunSpec
    from mcp_server.executors.ray import RayExecutor

    configure(ws.root, **{"executor.kind": '"ray"', "executor.address": f'"{cluster.address}"',
                          "executor.parallel": "1"})
    eng = Engine(ws.root)
    c = eng.campaign
    manifest = asyncrun.data_manifest(eng, c)
    held_out = {manifest[n] for n in ("val.bin", "test.bin")}
    # what a busy worker holds: the cached splits, and another run's working copy with its val/test
    worker = unmasked / "home" / "workspaces" / ".worker"
    (worker / "data").mkdir(parents=True, exist_ok=True)
    other = worker / "work" / "loopwright-run-other" / "state" / "data"
    other.mkdir(parents=True, exist_ok=True)
    for name in ("val.bin", "test.bin"):
        data = (eng.ws.data_dir / name).read_bytes()
        (worker / "data" / manifest[name]).write_bytes(data)
        (other / name).write_bytes(data)
    roots = [str(unmasked), str(unmasked / "tmp" / f"loopwright-{os.getuid()}")]
    evaluator = {n: gitops.verified_blob_bytes(ws.root, c["pinned_commit"], n) for n in ("prepare.py", "loopwright.toml")}
    spec = RunSpec(run_id=990001, seed=1, sources={"train.py": ATTACK.replace("ROOTS", repr(roots))},
                   evaluator=evaluator, data=manifest, label="C1 attack")
    ex = RayExecutor(eng.ws.cfg.executor, eng.ws.data_dir, manifest)
    try:
        ex.submit(spec)
        outs = ex.wait(timeout=300)
    finally:
        ex.close()
    assert outs and outs[0].status == "crash", outs
    line = next(ln for ln in outs[0].train_log.splitlines() if ln.startswith("FOUND "))
    found = json.loads(line[len("FOUND "):])
    assert not held_out & set(found.values()), f"train.py read a held-out split: {found}"
    assert not [p for p in found if "/.worker/data/" in p or "loopwright-run-other" in p], found
    # the sandbox works: its own working copy is there (its train.py, the train view)
    assert any(p.endswith("/ws/train.py") for p in found), found
    eng.close()


def test_a_whole_node_dies_mid_experiment(ws, cluster):
    """The worker node's raylet and everything under it SIGKILLed while it runs one of a candidate's runs
    (what a machine that loses power looks like to Ray): the run is `lost`, re-queued once, and finishes on
    the node that is left; ledger and git consistent. Last in the module: the cluster has one node after it."""
    configure(ws.root, **{"executor.kind": '"ray"', "executor.address": f'"{cluster.address}"',
                          "executor.parallel": "2"})
    eng = Engine(ws.root)
    set_constant(ws.root / "train.py", "LR", "0.005")
    sub = eng.submit_experiment("learning rate while a node dies")
    node_pgid = cluster.pgids[1]        # the worker node's `ray start` process group (pgids[0] is the head)
    deadline, victims = time.monotonic() + 120, []
    while not victims and time.monotonic() < deadline:
        victims = _busy_ray_workers([node_pgid])
        time.sleep(0.1)
    assert victims, "no Ray worker of the worker node was seen running the experiment"
    os.killpg(node_pgid, signal.SIGKILL)
    for pid in victims:                 # Ray gives each worker its own process group: it dies with the machine
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    res = eng.wait([sub.experiment_id], timeout=600)
    out = res.results[0]
    assert not res.timed_out and out.state == "decided" and out.lost_runs, res
    lost = eng.ledger.experiment(out.lost_runs[0])
    assert lost["status"] == "lost" and "re-queued as #" in lost["reason"], lost
    again = eng.ledger.experiment(int(lost["reason"].rsplit("#", 1)[1]))
    assert again["status"] == "ok" and again["seed"] == lost["seed"] and again["commit_sha"] == lost["commit_sha"]
    dead: set = set()
    deadline = time.monotonic() + 120      # the run is lost at once; the GCS declares the node dead later
    while not dead and time.monotonic() < deadline:
        dead = {n["NodeID"][:12] for n in ray.nodes() if not n["Alive"]}
        time.sleep(0.5)
    assert not ray_client.is_connected(), "the driver went on through the earlier ray:// connection"
    ran_on = json.loads(again["metrics_json"])["worker"].split(":")[1]
    assert dead and ran_on not in dead, (dead, ran_on)
    print(f"lost run recorded on {json.loads(lost['metrics_json'])['worker']!r}; dead node(s) {dead}")
    assert out.status == "ok" and out.verdict in ("keep", "discard"), out
    check_consistent(eng)
    asyncrun.close_driver(eng)
    eng.close()
