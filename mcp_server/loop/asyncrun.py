"""Asynchronous experiments: submit_experiment / wait, on an executor (mcp_server/executors/).

    submit   snapshot the editable files into a commit (the branch, index and working tree stay as they
             are: the agent edits on), queue its runs -- the reference runs of the best it still needs,
             then the candidate on every seed of the seed set, paired -- and return its id at once.
    wait     record what finished, decide what can be decided, return results.

One driver per workspace and process (`Driver`: the executor, a queue, a pump thread, the driver lock
`driver.lock` in the state directory, held while it lives). The engine's thread is the only writer of
the ledger and git; the pump thread only moves specs to the executor and outcomes back.

Rules:
- Budget: a submission needs all its runs to fit: finished + running + planned <= max_experiments
  (lost runs do not count: their re-queued run does). Nothing is submitted once the budget is spent.
- Verdicts are against the best at decision time. A candidate whose parent is no longer the best is
  rebased (git's 3-way merge of each editable file onto the new best) and re-measured as a new candidate
  row, paired with the new best's runs; a conflict, or a change the best already holds, is a discard
  with that reason. Never compared against a stale reference.
- A retest verdict queues the confirm pair itself (fresh seed: the best and the candidate).
- A lost run (dead worker or node) is recorded as `lost` and re-queued once; lost twice discards it.
- Driver restart: runs recorded in `inflight` whose outcome.json is in their run directory are recorded;
  the others are marked interrupted and re-queued once. Only a driver (submit / wait / the server) does
  this, at its first settle: opening the workspace (read-only commands, `loopwright status`) leaves them
  in flight.
- Autonomy approve-keeps works as on the synchronous path (loop/outcome.py keep): a keep verdict is held
  for a person (the best does not move, the working tree stays the agent's); an approved keep is applied
  at the next submission (or by `loopwright approve --apply`). approve-runs is refused: a person sees each
  change before it runs, which a queue of submissions cannot wait for.
"""
from __future__ import annotations

import collections
import json
import statistics
import threading
import time
from typing import Optional

from mcp_server.common.locks import FileLock, HeldLock
from mcp_server.executors.base import OUTCOME_NAME, Executor, ExecutorError, RunOutcome, RunSpec
from mcp_server.executors.factory import make_executor
from mcp_server.executors.workcopy import sha256_of
from mcp_server.loop import gitops, integrity, outcome, sandbox, targets, verdict
from mcp_server.loop import text as textmod
from mcp_server.loop.approvals import Approvals
from mcp_server.loop.errors import LoopError
from mcp_server.loop.models import AsyncResult, Change, SubmitResult, WaitResult
from mcp_server.loop.outcome import LoopEngine  # Engine, as this module uses it (no import of engine.py)
from mcp_server.loop.workspace import pinned_evaluator

FAILED = ("crash", "timeout", "rejected", "interrupted")
MAX_ATTEMPTS = 2          # a lost run is re-queued once


class Driver:
    """The executor of one workspace in this process, fed by a queue (at most `capacity` runs in flight)."""

    def __init__(self, executor: Executor, lock: HeldLock):
        self.ex = executor
        self._lock = lock
        self._cond = threading.Condition()
        self._queue: collections.deque[RunSpec] = collections.deque()
        self._done: list[RunOutcome] = []
        self.dispatched: dict[int, float] = {}     # run id -> when the executor got it
        self.reconciled = False                    # what a previous driver left: handled at the first settle
        self._stop = False
        self._thread = threading.Thread(target=self._pump, name="loopwright-driver", daemon=True)
        self._thread.start()

    def enqueue(self, spec: RunSpec) -> None:
        with self._cond:
            self._queue.append(spec)
            self._cond.notify_all()

    def take_done(self) -> list[RunOutcome]:
        with self._cond:
            out, self._done = self._done, []
            return out

    def wait_for_outcome(self, timeout: float) -> None:
        with self._cond:
            if not self._done:
                self._cond.wait(timeout)

    def busy(self) -> int:
        with self._cond:
            return len(self._queue) + len(self.dispatched)

    def _pump(self) -> None:
        while not self._stop:
            with self._cond:
                while self._queue and len(self.dispatched) < self.ex.capacity:
                    spec = self._queue.popleft()
                    try:
                        self.ex.submit(spec)
                        self.dispatched[spec.run_id] = time.time()
                    except Exception as e:  # noqa: BLE001 - an outcome, never a dead pump
                        self._done.append(RunOutcome(spec.run_id, "lost", f"the executor refused it: {e}"))
                        self._cond.notify_all()
                idle = not self.dispatched
                if idle:
                    self._cond.wait(0.5)
                    continue
            try:
                outs = self.ex.wait(timeout=0.5)
            except Exception as e:  # noqa: BLE001 - keep pumping; the error is every in-flight run's outcome
                outs = [RunOutcome(h, "lost", f"the executor failed: {type(e).__name__}: {e}") for h in self.ex.in_flight()]
                for h in self.ex.in_flight():
                    self.ex.cancel(h)
            if outs:
                with self._cond:
                    for o in outs:
                        self.dispatched.pop(o.run_id, None)
                    self._done.extend(outs)
                    self._cond.notify_all()

    def close(self) -> None:
        self._stop = True
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout=5)
        self.ex.close()
        self._lock.release()


_DRIVERS: dict[str, Driver] = {}
_DRIVERS_LOCK = threading.Lock()


def driver_for(eng: LoopEngine, create: bool = True) -> Optional[Driver]:
    """This process's driver for the workspace (made on first use: the executor is connected, what a dead
    driver left in flight is reconciled). LoopError when another process drives it or the executor fails."""
    key = str(eng.ws.state_dir)
    with _DRIVERS_LOCK:
        drv = _DRIVERS.get(key)
        if drv is not None or not create:
            return drv
        held = FileLock(eng.ws.state_dir / "driver.lock").try_acquire()
        if held is None:
            raise LoopError("another process drives the asynchronous experiments of this workspace (see "
                            f"{eng.ws.state_dir / 'driver.lock'}); submit and wait through it (its MCP server), "
                            "or wait for it to end")
        cfg = eng.ws.cfg.executor
        c = eng.campaign
        try:
            ex = make_executor(cfg, eng.ws.data_dir, eng.ws.state_dir / "work", eng.ws.run_dir,
                               data_manifest(eng, c))
        except ExecutorError as e:
            held.release()
            raise LoopError(str(e)) from None
        except BaseException:
            held.release()
            raise
        drv = Driver(ex, held)
        _DRIVERS[key] = drv
    return drv


def close_driver(eng: LoopEngine) -> None:
    """Stop this process's driver of the workspace (what is in flight is cancelled; a later driver
    reconciles it)."""
    with _DRIVERS_LOCK:
        drv = _DRIVERS.pop(str(eng.ws.state_dir), None)
    if drv is not None:
        drv.close()


def driver_alive_elsewhere(eng: LoopEngine) -> bool:
    """True when some driver (this process's or another's) holds the workspace's driver lock."""
    if str(eng.ws.state_dir) in _DRIVERS:
        return True
    held = FileLock(eng.ws.state_dir / "driver.lock").try_acquire()
    if held is None:
        return True
    held.release()
    return False


# -- specs ------------------------------------------------------------------------------------------

AUX_DATA = ("meta.json", "token_bytes.npy", "tokenizer.json", "peak_flops.json")


def data_manifest(eng: LoopEngine, c: dict) -> dict[str, str]:
    """{file: sha256} of the data a run needs: the splits as the pinned loopwright.lock records them, and
    the small files that describe them (meta.json -- which itself lists the splits' hashes -- the tokenizer
    files) as they are in the state directory."""
    if eng.ws.cfg.target is not None:
        return {}      # a target has no data splits: its hidden files travel by content (spec_for)
    out = dict(integrity.pinned_lock(eng.ws, c["pinned_commit"])["data"])
    for name in AUX_DATA:
        if (eng.ws.data_dir / name).is_file():
            out[name] = sha256_of(eng.ws.data_dir / name)
    return out


def spec_for(eng: LoopEngine, c: dict, row: dict) -> RunSpec:
    """A run of row's commit on row's seed, everything by content."""
    root, pinned = eng.ws.root, c["pinned_commit"]
    if eng.ws.cfg.target is not None:
        return _target_spec(eng, pinned, row)
    sources = {}
    for rel in eng.ws.cfg.paths.editable:
        try:
            sources[rel] = gitops.blob_bytes(root, row["commit_sha"], rel).decode("utf-8", "replace")
        except gitops.GitError:
            pass
    evaluator = pinned_evaluator(root, pinned)   # prepare.py, its siblings where pinned, loopwright.toml
    return RunSpec(run_id=row["id"], seed=int(row["seed"]), sources=sources, evaluator=evaluator,
                   data=data_manifest(eng, c), unsafe=sandbox.unsafe_requested(),
                   label=f"#{row['id']} {row['role']} seed {row['seed']}")


def _target_spec(eng: LoopEngine, pinned: str, row: dict) -> RunSpec:
    """A target's run by content: the editable files of row's commit, every other pinned file, the hidden
    files (checked against the pinned lock) for the evaluator alone."""
    root = eng.ws.root
    editable = [rel for rel in gitops.tracked_files(root, row["commit_sha"])
                if targets.matches(rel, eng.ws.cfg.paths.editable)]
    sources = {rel: gitops.blob_bytes(root, row["commit_sha"], rel).decode("utf-8", "replace") for rel in editable}
    evaluator = targets.pinned_files(eng.ws, pinned)
    return RunSpec(run_id=row["id"], seed=int(row["seed"]), sources=sources, evaluator=evaluator, data={},
                   unsafe=sandbox.unsafe_requested(), label=f"#{row['id']} {row['role']} seed {row['seed']}",
                   target=True, hidden=targets.hidden_files(eng.ws, pinned))


def _queue_row(eng: LoopEngine, drv: Optional[Driver], c: dict, row_id: int, attempt: int = 1) -> None:
    if drv is None:
        raise LoopError("no driver to queue runs on")
    row = eng.ledger.experiment(row_id)
    assert row is not None
    eng.ledger.add_inflight(row_id, c["id"], drv.ex.kind, attempt)
    drv.enqueue(spec_for(eng, c, row))


def _room(eng: LoopEngine, c: dict) -> Optional[int]:
    """Runs the budget still allows, counting those in flight (None: no limit)."""
    cap = eng.ws.cfg.budget.max_experiments
    if cap is None:
        return None
    used, _ = eng.ledger.usage(c["id"])
    return cap - used - eng.ledger.count_running(c["id"])


def _reference_rows(eng: LoopEngine, c: dict, seeds: list[int]) -> dict[int, int]:
    """seed -> a run of the best on it (a recorded ok one, or one in flight), for the seeds that have one."""
    have = {s: r["id"] for s, r in eng.reference_runs(c).items()}
    for r in eng.ledger.running_runs_of_commit(c["id"], c["best_commit"]):
        have.setdefault(r["seed"], r["id"])
    return {s: have[s] for s in seeds if s in have}


def _start_reference(eng: LoopEngine, c: dict, seed: int, set_index: Optional[int], why: str, session_id) -> int:
    best_id = c["best_experiment_id"]
    label = f"baseline (seed {seed}, {why})" if best_id is None else f"reference: best #{best_id} on seed {seed} ({why})"
    return eng.ledger.start_experiment(
        c["id"], label, commit_sha=c["best_commit"], parent_commit=c["best_commit"], is_baseline=int(best_id is None),
        confirm_of=best_id, session_id=session_id, role="baseline" if best_id is None else "reference",
        seed=seed, seed_set=set_index, lines_added=0, lines_removed=0)


def _plan_candidate(eng: LoopEngine, drv: Optional[Driver], c: dict, commit: str, description: str,
                    hypothesis: Optional[str], source_sha: str, session_id,
                    change: Optional[dict] = None) -> tuple[int, list[int], list[int], list[int]]:
    """Rows for a candidate at `commit` (parent: the best now) on the seed set, paired with the best's runs
    (queued where missing). Returns (candidate id, run ids, reference run ids queued, seeds)."""
    set_index, seeds = eng.seed_set(c)
    refs = _reference_rows(eng, c, seeds)
    new_refs = []
    for s in seeds:
        if s not in refs:
            refs[s] = _start_reference(eng, c, s, set_index, f"seed set {set_index}", session_id)
            new_refs.append(refs[s])
    added, removed = gitops.diff_stats(eng.ws.root, c["best_commit"], commit, eng.ws.cfg.paths.editable[0])
    common = dict(hypothesis=hypothesis, commit_sha=commit, parent_commit=c["best_commit"], source_sha=source_sha,
                  lines_added=added, lines_removed=removed, session_id=session_id, seed_set=set_index)
    cand = eng.ledger.start_experiment(c["id"], description, role="candidate", seed=seeds[0],
                                       paired_with=refs[seeds[0]], change=change, **common)
    # adaptive pairs: min_pairs of the seed set now, the rest only while the sequential test asks (_decide)
    first = first_wave(eng, len(seeds))
    runs = [cand] + [eng.ledger.start_experiment(c["id"], f"{description} [seed {s}]", role="pair", seed=s,
                                                 confirm_of=cand, paired_with=refs[s], **common)
                     for s in seeds[1:first]]
    for rid in new_refs + runs:
        _queue_row(eng, drv, c, rid)
    return cand, runs, new_refs, seeds


def first_wave(eng: LoopEngine, n_seeds: int) -> int:
    """Pairs of the seed set a submission queues at once: all of them (fixed pairs), or min_pairs (adaptive)."""
    noise = eng.ws.cfg.noise
    return n_seeds if noise.pairs == "fixed" else max(1, min(noise.min_pairs, n_seeds))


def _next_set_pair(eng: LoopEngine, c: dict, cand: dict, own: list[dict]) -> Optional[tuple[int, int]]:
    """(seed, reference run) of the candidate's seed set it has no pair on yet, if the set is still current."""
    set_index, seeds = eng.seed_set(c)
    if cand["seed_set"] != set_index:
        return None
    used = {r["seed"] for r in own}
    refs = _reference_rows(eng, c, seeds)
    return next(((s, refs[s]) for s in seeds if s not in used and s in refs), None)


# -- submit ------------------------------------------------------------------------------------------

def submit(eng: LoopEngine, description: str, hypothesis: Optional[str] = None, session_id=None,
           change: Optional[Change] = None) -> SubmitResult:
    description = textmod.clean(description, textmod.MAX_DESCRIPTION)
    if not description:
        raise LoopError("description is required: say in a few words what this experiment changes")
    hypothesis = textmod.clean(hypothesis, textmod.MAX_DESCRIPTION) if hypothesis else None
    if eng.ws.cfg.campaign.autonomy == "approve-runs":
        raise LoopError("asynchronous experiments cannot run under autonomy = approve-runs (a person sees each "
                        "change before it runs); use run_experiment and score instead")
    with eng.exclusive():
        c = eng.campaign
        status = eng.budget(c)
        if status.should_stop:
            raise LoopError(f"the campaign budget is spent ({'; '.join(status.reasons)}); stop here.")
        eng.check_integrity(c, "before the submission")
        drv = driver_for(eng)            # the executor first: an unreachable cluster records nothing
        assert drv is not None
        settle(eng, drv)
        # approve-keeps: an approved keep on the best is applied first, as run_experiment does (what is in
        # flight on the old best is rebased at its verdict)
        c = Approvals(eng).apply_ready(eng.campaign)
        files = {rel: (eng.ws.root / rel).read_bytes() for rel in eng.ws.cfg.paths.editable
                 if (eng.ws.root / rel).is_file()}
        no_baseline = not eng.ledger.baseline_samples(c["id"]) and c["best_experiment_id"] is None
        src = eng.editable_source()
        identical = src == eng.committed_source(c["best_commit"])
        if no_baseline and identical:
            return _submit_baseline(eng, drv, c, session_id)
        src = eng.refuse_non_change(c)
        if change is not None:
            eng.check_change(c, change)
        sha = eng.text_sha(src)
        p = eng.ledger.prior_of_source(c["id"], sha, skip_statuses=("interrupted", "lost"))
        if p is not None:
            raise LoopError(f"exact repeat of experiment #{p['id']} ({p['description']!r}: status {p['status']}, "
                            f"verdict {p['verdict']}). Try something else; state_read(view='tried') lists what was tried.")
        _, seeds = eng.seed_set(c, rotate=not no_baseline)
        need = first_wave(eng, len(seeds)) + len([s for s in seeds if s not in _reference_rows(eng, c, seeds)])
        room = _room(eng, c)
        if room is not None and need > room:
            raise LoopError(f"this experiment needs {need} runs but the budget has room for {max(room, 0)} (runs in "
                            "flight count): wait() for the running ones, then stop or ask for more budget.")
        try:
            commit = gitops.snapshot_commit(eng.ws.root, c["best_commit"], files, f"experiment: {description}",
                                            f"refs/loopwright/submitted/{sha[:20]}")
        except gitops.GitError as e:
            raise LoopError(f"could not snapshot train.py: {e}") from None
        cand, runs, refs, seeds = _plan_candidate(eng, drv, c, commit, description, hypothesis, sha, session_id,
                                                  change.model_dump() if change is not None else None)
        eng.ledger.add_submission(c["id"], cand)
        return SubmitResult(experiment_id=cand, kind="candidate", commit=commit[:10], seeds=seeds, runs=runs,
                            reference_runs=refs, in_flight=drv.busy(), executor=drv.ex.kind,
                            next_step=(f"Submitted as #{cand} ({len(runs)} run(s) on seeds {seeds}, paired with the best"
                                       f"{f'; {len(refs)} reference run(s) first' if refs else ''}). train.py is yours "
                                       f"again: edit and submit the next idea, or wait(ids=[{cand}])."))


def _submit_baseline(eng: LoopEngine, drv: Driver, c: dict, session_id) -> SubmitResult:
    running = eng.ledger.running_baseline_runs(c["id"])
    if running:
        raise LoopError(f"the baseline is being measured (runs {[r['id'] for r in running]}); edit train.py and "
                        "submit a change, or wait() for it")
    set_index, seeds = eng.seed_set(c)
    room = _room(eng, c)
    if room is not None and len(seeds) > room:
        raise LoopError(f"the baseline needs {len(seeds)} runs but the budget has room for {max(room, 0)}")
    ids = [_start_reference(eng, c, s, set_index, f"seed set {set_index}", session_id) for s in seeds]
    for rid in ids:
        _queue_row(eng, drv, c, rid)
    eng.ledger.add_submission(c["id"], ids[0])
    return SubmitResult(experiment_id=ids[0], kind="baseline", commit=c["best_commit"][:10], seeds=seeds, runs=ids,
                        in_flight=drv.busy(), executor=drv.ex.kind,
                        next_step=(f"The baseline is being measured on seeds {seeds} (runs {ids}). Edit train.py and "
                                   "submit_experiment your first change: it is paired with these runs."))


# -- recording and deciding ------------------------------------------------------------------------------

def settle(eng: LoopEngine, drv: Optional[Driver]) -> None:
    """Record the outcomes that arrived and decide every submission that can be decided. Under the
    engine's lock (the caller holds it)."""
    if drv is not None and not drv.reconciled:
        drv.reconciled = True
        reconcile(eng, drv)
    if drv is not None:
        for out in drv.take_done():
            record(eng, drv, out)
    c = eng.campaign
    for sub in eng.ledger.submissions(c["id"], open_only=True):
        _decide(eng, drv, eng.campaign, sub)


def record(eng: LoopEngine, drv: Optional[Driver], out: RunOutcome, interrupted: bool = False) -> None:
    """One run's outcome into its row (and its logs into the run directory); a lost run is re-queued once."""
    row = eng.ledger.experiment(out.run_id)
    infl = {r["run_id"]: r for r in eng.ledger.inflight()}.get(out.run_id)
    eng.ledger.remove_inflight(out.run_id)
    if row is None or row["status"] != "running":
        return
    c = eng.ledger.campaign(row["campaign_id"])
    assert c is not None
    run_dir = eng.ws.run_dir(row["id"])
    run_dir.mkdir(parents=True, exist_ok=True)
    if out.train_log:
        (run_dir / "train.log").write_text(out.train_log)
    if out.eval_json:
        (run_dir / "eval.json").write_text(json.dumps(out.eval_json, indent=2))
    (run_dir / OUTCOME_NAME).write_text(out.to_json())
    started = (drv.dispatched.get(row["id"]) if drv else None) or row["started_at"]
    if out.lost or interrupted:
        attempt = infl["attempt"] if infl else MAX_ATTEMPTS
        again = attempt < MAX_ATTEMPTS and drv is not None
        status = "interrupted" if interrupted else "lost"
        new_id = None
        if again:
            new_id = eng.ledger.start_experiment(
                c["id"], row["description"], **{k: row[k] for k in (
                    "hypothesis", "commit_sha", "parent_commit", "is_baseline", "confirm_of", "source_sha", "seed",
                    "role", "paired_with", "seed_set", "lines_added", "lines_removed", "session_id", "change")})
        eng.ledger.update_experiment(row["id"], status=status, finished_at=time.time(), started_at=started,
                                     reason=f"{out.reason or status}; " + (f"re-queued as #{new_id}" if new_id else
                                                                             "not re-queued (lost before)"),
                                     metrics_json=json.dumps({"worker": out.worker, "attempt": attempt}))
        for sub in eng.ledger.submissions(c["id"], open_only=True):
            cur = eng.ledger.experiment(sub["current_id"])
            mine = [cur] + eng.ledger.confirm_runs(sub["current_id"]) if cur else []
            if any(m["id"] == row["id"] or m["paired_with"] == row["id"] for m in mine):
                _note(eng, sub["id"], "lost", row["id"])
        eng.ledger.add_event(c["id"], "run_lost", {"experiment_id": row["id"], "status": status, "reason": out.reason,
                                                   "worker": out.worker, "attempt": attempt, "requeued_as": new_id})
        if new_id is not None:
            eng.ledger.repoint_runs(row["id"], new_id)
            if row["role"] == "candidate":   # the new row stands for the experiment; the lost one hangs under it
                eng.ledger.update_experiment(row["id"], confirm_of=new_id)
            for sub in eng.ledger.submissions(c["id"], open_only=True):
                if sub["current_id"] == row["id"]:      # a candidate, or a baseline's first run
                    eng.ledger.set_submission(sub["id"], current_id=new_id)
            _queue_row(eng, drv, c, new_id, attempt + 1)
        return
    status = out.status if out.status in ("ok", "crash", "timeout", "rejected") else "crash"
    outcome.write_run(eng, row["id"], status=status, reason=out.reason, is_baseline=bool(row["is_baseline"]),
                      summary=out.summary, extra_metrics={"train_wall_s": out.train_wall_s,
                                                          "eval_wall_s": out.eval_wall_s,
                                                          "sandboxed": 0 if out.sandbox == "none" else 1,
                                                          "worker": out.worker},
                      val_bpb=out.val_bpb, test_bpb=out.test_bpb, eval_seconds=out.eval_seconds,
                      total_seconds=round(out.train_wall_s + out.eval_wall_s, 3), log_tail=out.log_tail,
                      started_at=started)
    if out.sandbox == "none":
        outcome.note_unsandboxed(eng, c, row["id"])


def _own_runs(eng: LoopEngine, cand: dict) -> list[dict]:
    """The candidate's runs that count: a lost or interrupted run is not the change's outcome (re-queued, its new
    row stands for it; lost twice, `_decide` closes the candidate on that)."""
    return [r for r in [cand] + eng.ledger.confirm_runs(cand["id"]) if r["status"] not in ("lost", "interrupted")]


def _close(eng: LoopEngine, c: dict, sub: dict, rows: list[dict], kind: str, reason: str) -> None:
    for r in rows:
        eng.ledger.update_experiment(r["id"], verdict=kind, verdict_reason=reason)
    eng.ledger.set_submission(sub["id"], decided=True)
    outcome.after_verdict(eng, c)


def _decide(eng: LoopEngine, drv: Optional[Driver], c: dict, sub: dict) -> None:
    cand = eng.ledger.experiment(sub["current_id"])
    assert cand is not None
    if cand["is_baseline"]:   # a baseline submission: done when the campaign's baseline runs are
        if not eng.ledger.running_baseline_runs(c["id"]):
            eng.ledger.set_submission(sub["id"], decided=True)
        return
    own = _own_runs(eng, cand)
    refs = [eng.ledger.experiment(r["paired_with"]) for r in own if r["paired_with"] is not None]
    if any(r is None or r["status"] == "running" for r in own + refs):
        return
    lost_twice = [r for r in [cand] + eng.ledger.confirm_runs(cand["id"])
                  if r["status"] in ("lost", "interrupted") and "not re-queued" in (r["reason"] or "")]
    failed = [r for r in own if r["status"] in FAILED] + lost_twice
    if failed:
        f = failed[0]
        reason = f"run #{f['id']} (seed {f['seed']}) {f['status']}: {f['reason']}"
        _close(eng, c, sub, own, "discard", reason)
        outcome.record_crash(eng, c, f, cand["description"])
        return
    bad_ref = [r for r in refs if r is not None and r["status"] != "ok"]
    if bad_ref:
        r = bad_ref[0]
        _close(eng, c, sub, own, "discard", f"the best version's run #{r['id']} on seed {r['seed']} failed ({r['status']}: "
               f"{r['reason']}): the benchmark is broken on this machine, not this change")
        return
    if cand["parent_commit"] != c["best_commit"]:
        _rebase(eng, drv, c, sub, cand, own)
        return
    j = outcome.judge(eng, c, cand)   # the verdict, as score() computes it
    v = j.verdict
    noise = eng.ws.cfg.noise
    nxt = _next_set_pair(eng, c, cand, own) if v.kind == "retest" and noise.pairs == "adaptive" else None
    room = _room(eng, c)
    if nxt is not None and drv is not None and (room is None or room >= 1):
        # adaptive pairs, still uncertain: the next seed of the set, paired with the best's run on it
        for r in own:
            eng.ledger.update_experiment(r["id"], verdict="retest", verdict_reason=v.reason)
        run = eng.ledger.start_experiment(
            c["id"], f"{cand['description']} [seed {nxt[0]}]", hypothesis=cand["hypothesis"],
            commit_sha=cand["commit_sha"], parent_commit=cand["parent_commit"], confirm_of=cand["id"],
            source_sha=cand["source_sha"], seed=nxt[0], role="pair", paired_with=nxt[1],
            session_id=cand["session_id"], lines_added=cand["lines_added"], lines_removed=cand["lines_removed"],
            seed_set=cand["seed_set"])
        _queue_row(eng, drv, c, run)
        return
    if v.kind == "retest":
        if drv is not None and (room is None or room >= 2):
            for r in own:
                eng.ledger.update_experiment(r["id"], verdict="retest", verdict_reason=v.reason)
            seed = eng.fresh_seeds(c, 1)[0]
            ref = _start_reference(eng, c, seed, None, f"confirm of #{cand['id']}", cand["session_id"])
            conf = eng.ledger.start_experiment(
                c["id"], f"confirm #{cand['id']}", hypothesis=cand["hypothesis"], commit_sha=cand["commit_sha"],
                parent_commit=cand["parent_commit"], confirm_of=cand["id"], source_sha=cand["source_sha"], seed=seed,
                role="confirm", paired_with=ref, session_id=cand["session_id"], lines_added=cand["lines_added"],
                lines_removed=cand["lines_removed"])
            _queue_row(eng, drv, c, ref)
            _queue_row(eng, drv, c, conf)
            return
        v = verdict.Verdict("discard", v.gain, v.threshold, f"{v.reason}; no confirm pair could be run "
                            f"({'no budget left' if drv is not None else 'no driver'})")
    for r in own:
        eng.ledger.update_experiment(r["id"], verdict=v.kind, verdict_reason=v.reason)
    if v.kind == "keep":
        # autonomy approve-keeps: held for a person (the working tree is the agent's: left as it is)
        held = outcome.keep(eng, c, cand, j, reset_tree=False)
        if held is not None:
            v = held[0]
        else:
            _advance_branch(eng, c, cand["commit_sha"])
    _close(eng, c, sub, [], v.kind, v.reason)


def _advance_branch(eng: LoopEngine, c: dict, commit: str) -> None:
    """The branch moves to the kept commit. The working tree follows only where the agent has no pending
    edit (its editable files equal the old best's); otherwise its edit stays, to be submitted as it is."""
    root = eng.ws.root
    clean = eng.editable_source() == eng.committed_source(c["best_commit"])
    if gitops.current_branch(root) == c["branch"]:
        if clean:
            gitops.reset_to(root, commit)
        else:
            gitops.move_branch(root, commit)
    else:
        gitops.update_ref(root, f"refs/heads/{c['branch']}", commit)


def _rebase(eng: LoopEngine, drv: Optional[Driver], c: dict, sub: dict, cand: dict, own: list[dict]) -> None:
    """The best moved while the candidate ran: merge its change onto the new best and re-measure it."""
    root, best = eng.ws.root, c["best_commit"]
    stale = (f"stale: measured against #{cand['paired_with']}'s version, but the best moved to "
             f"#{c['best_experiment_id']} ({best[:10]}) before the verdict")
    merged: dict[str, bytes] = {}
    conflicts = []
    for rel in eng.ws.cfg.paths.editable:
        blobs = []
        for commit in (cand["parent_commit"], best, cand["commit_sha"]):
            try:
                blobs.append(gitops.blob_bytes(root, commit, rel))
            except gitops.GitError:
                blobs.append(b"")
        data, conflict = gitops.merge_file(*blobs)
        merged[rel] = data
        if conflict:
            conflicts.append(rel)
    if conflicts:
        _close(eng, c, sub, own, "discard", f"{stale}; the change does not merge onto the new best ({', '.join(conflicts)} "
               "conflicts): edit the current best and submit it again")
        return
    best_files = {rel: gitops.blob_bytes(root, best, rel) for rel in merged}
    if merged == best_files:
        _close(eng, c, sub, own, "discard", f"{stale}; the new best already holds this change")
        return
    _, seeds = eng.seed_set(c)
    need = len(seeds) + len([s for s in seeds if s not in _reference_rows(eng, c, seeds)])
    room = _room(eng, c)
    if drv is None or (room is not None and need > room):
        _close(eng, c, sub, own, "discard", f"{stale}; it could not be re-measured "
               f"({'no budget left' if drv is not None else 'no driver'})")
        return
    src = "\n".join(f"### {rel}\n" + data.decode("utf-8", "replace") for rel, data in merged.items())
    sha = eng.text_sha(src)
    commit = gitops.snapshot_commit(root, best, merged, f"experiment: {cand['description']} (rebased onto "
                                    f"{best[:10]})", f"refs/loopwright/submitted/{sha[:20]}")
    new, _, _, _ = _plan_candidate(eng, drv, c, commit, cand["description"], cand["hypothesis"], sha,
                                   cand["session_id"], cand["change"])
    for r in own:
        eng.ledger.update_experiment(r["id"], verdict="discard", verdict_reason=f"{stale}; rebased onto it and "
                                     f"re-measured as #{new}")
    eng.ledger.set_submission(sub["id"], current_id=new)
    _note(eng, sub["id"], "rebased_from", cand["id"])


# -- wait and the view -------------------------------------------------------------------------------

def _note(eng: LoopEngine, sub_id: int, key: str, value: int) -> None:
    k = f"submission:{sub_id}"
    data = json.loads(eng.ledger.kv_get(k) or "{}")
    data.setdefault(key, []).append(value)
    eng.ledger.kv_set(k, json.dumps(data))


def result_of(eng: LoopEngine, sub: dict) -> AsyncResult:
    cur = eng.ledger.experiment(sub["current_id"])
    assert cur is not None
    notes = json.loads(eng.ledger.kv_get(f"submission:{sub['id']}") or "{}")
    rows = [r for r in [cur] + eng.ledger.confirm_runs(cur["id"]) if r["status"] != "lost"]
    pairs = [] if cur["is_baseline"] else outcome.pairs(eng, cur["id"])
    ok = [r["val_bpb"] for r in rows if r["status"] == "ok" and r["val_bpb"] is not None]
    return AsyncResult(
        experiment_id=sub["id"], current_id=cur["id"], state="decided" if sub["decided_at"] else "running",
        status=cur["status"], verdict=cur["verdict"], reason=cur["verdict_reason"] or cur["reason"],
        val_bpb=round(statistics.fmean(ok), 6) if ok else None,
        delta_vs_best=round(statistics.fmean(p.d for p in pairs), 6) if pairs else None, pairs=pairs,
        commit=(cur["commit_sha"] or "")[:10] or None, lost_runs=notes.get("lost", []),
        rebased_from=notes.get("rebased_from", []))


def wait(eng: LoopEngine, ids: Optional[list[int]] = None, timeout: float = 600.0) -> WaitResult:
    """Block until every experiment in `ids` is decided, or `timeout` seconds passed. ids=None ("any"):
    every decided submission whose verdict no wait() has handed over yet -- also one decided inside
    submit_experiment or state_read -- at once when there is one, else block until one is decided; with
    nothing in flight and nothing undelivered it returns at once, saying so. Every decided result returned
    counts as handed over. Records outcomes as they arrive."""
    c = eng.campaign
    wanted: Optional[set[int]] = None
    if ids is not None:
        wanted = set()
        for i in ids:
            if eng.ledger.submission(int(i)) is None:
                raise LoopError(f"#{i} was not submitted with submit_experiment; state_read(view='history') lists "
                                "experiments (run_experiment's results are final when it returns)")
            wanted.add(int(i))
    open_at_start = {s["id"] for s in eng.ledger.submissions(c["id"], open_only=True)}
    drv = driver_for(eng, create=bool(open_at_start & (wanted or open_at_start)))
    deadline = time.monotonic() + max(0.0, float(timeout))
    while True:
        with eng.exclusive():
            settle(eng, drv)
        subs = {s["id"]: s for s in eng.ledger.submissions(c["id"])}
        open_now = {i for i, s in subs.items() if not s["decided_at"]}
        idle = False
        if wanted is not None:
            done = not (wanted & open_now)
            show = sorted(wanted)
        else:
            show = [s["id"] for s in eng.ledger.unreported_submissions(c["id"])]
            idle = not show and not open_now
            done = bool(show) or idle
        left = deadline - time.monotonic()
        if done or left <= 0 or drv is None:
            results = [result_of(eng, subs[i]) for i in show]
            eng.ledger.mark_submissions_reported([r.experiment_id for r in results if r.state == "decided"])
            pending = sorted(open_now)
            if idle:
                nxt = ("Nothing in flight and nothing undelivered: every submitted experiment's verdict was "
                       "returned before. Submit the next idea with submit_experiment.")
            elif done:
                nxt = "Decided: read each verdict; keeps moved the branch. Submit the next idea."
            else:
                nxt = f"Still running after {timeout:g} s: wait again, or submit more ideas meanwhile."
            if drv is None and open_now and not done:
                nxt = "No driver runs in this process: submit_experiment starts one (and reconciles what was in flight)."
            return WaitResult(results=results, in_flight=pending, timed_out=not done, next_step=nxt)
        drv.wait_for_outcome(min(left, 5.0))


def reconcile(eng: LoopEngine, drv: Optional[Driver]) -> list[int]:
    """Runs a previous driver left in flight (the caller holds the engine's lock): recorded from their
    outcome.json where they finished, else interrupted (and re-queued once when `drv` is given). Returns
    the run ids handled."""
    mine = set(drv.dispatched) if drv is not None else set()
    done = []
    for r in eng.ledger.inflight():
        if r["run_id"] in mine:
            continue
        path = eng.ws.run_dir(r["run_id"]) / OUTCOME_NAME
        out = None
        if path.is_file():
            try:
                out = RunOutcome.from_json(path.read_text())
            except (OSError, ValueError, TypeError):
                out = None
        if out is not None and out.run_id == r["run_id"]:
            record(eng, drv, out)
        else:
            record(eng, drv, RunOutcome(r["run_id"], "lost", "the driver stopped while it ran"), interrupted=True)
        done.append(r["run_id"])
    return done


def in_flight_rows(eng: LoopEngine, c: dict) -> tuple[list[dict], list[int]]:
    """(runs queued or running, open submissions) for state_read."""
    return (eng.ledger.running_experiments(c["id"]),
            [s["id"] for s in eng.ledger.submissions(c["id"], open_only=True)])

