"""The loop's operations: run an experiment, score it, revert, budgets, state.

The MCP server, the CLI, the hooks and the built-in agent all go through this
module. Errors are `LoopError`s whose message tells the caller what to do next.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Optional

from mcp_server.common import procs
from mcp_server.common.locks import FileLock
from mcp_server.ledger.store import SeedSet
from mcp_server.loop import approvals, asyncrun, gitops, integrity, outcome, runner, verdict
from mcp_server.loop import budget as budgetmod
from mcp_server.loop import text as textmod
from mcp_server.loop.change import as_change, check_against
from mcp_server.loop.errors import Busy, Interrupted, LoopError
from mcp_server.loop.models import (
    BaselineInfo,
    BudgetResult,
    Change,
    ExperimentResult,
    ExperimentRow,
    NoiseInfo,
    NoteResult,
    NoteRow,
    RevertResult,
    ScoreResult,
    StateView,
    SubmitResult,
    Summary,
    WaitResult,
)
from mcp_server.loop.workspace import Workspace, sinks_for

NOTE_KINDS = ("lesson", "dead_end", "idea", "observation")
STATE_VIEWS = ("summary", "history", "best", "notes", "noise", "tried")
# The verdict_reason of an experiment closed because one of its runs was interrupted (the loop was stopped):
# discarded without a score, and not an "exact repeat" when the same change is run again.
INTERRUPTED_REASON = "interrupted: "
# While the loop puts other versions of the editable files in the tree (the baseline on the pinned train.py, a
# reference run, a replay), the edit that was there is kept on disk here, so that it survives any kill.
KEPT_EDIT = "kept-edit"
BACKUPS = "backups"
MAX_BACKUPS = 50


__all__ = ["Engine", "LoopError", "Busy"]


class Engine:
    """One workspace's loop. Opening it changes nothing (hooks, reports and status views open it while a run
    may be in flight); whatever writes opens it with `open_for_writing`, which recovers first."""

    def __init__(self, root: Path | str | None = None, read_only: bool = False):
        self.ws = Workspace.find(root) if root is None else Workspace.open(root)
        self.ledger = self.ws.ledger()
        self.notices: list[str] = []
        if read_only:
            # a viewer (the dashboard) writes nothing, not even the tamper event of a pin check: the pin is the
            # next writer's to check
            return
        self._check_pin_on_open()

    @classmethod
    def open_for_writing(cls, root: Path | str | None = None) -> "Engine":
        """The engine for a caller that runs, scores, reverts or starts a session: what a killed process left
        (orphaned `running` rows, candidates whose seed runs were interrupted, an edit kept on disk) is
        recovered first. Safe while a run is live: recover() needs the experiment lock and skips without it."""
        eng = cls(root)
        try:
            eng.recover()
        except BaseException:
            eng.close()
            raise
        return eng

    def close(self) -> None:
        self.ledger.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- campaign and best ----------------------------------------------------
    @property
    def campaign(self) -> dict:
        branch = gitops.current_branch(self.ws.root)
        if branch and branch.startswith("loopwright/"):
            c = self.ledger.campaign(tag=branch.split("/", 1)[1])
            if c:
                return c
        raise LoopError(f"the workspace is on {branch or 'a detached HEAD'}, not a campaign branch; "
                        f"check out one of: {', '.join(self._branches()) or '(none: run loopwright init)'}")

    def _branches(self) -> list[str]:
        return [branch for _, branch in self.ledger.campaign_names()]

    def _samples(self, experiment_id: int) -> list[float]:
        rows = [self.ledger.experiment(experiment_id)] + self.ledger.confirm_runs(experiment_id)
        return [r["val_bpb"] for r in rows if r and r["status"] == "ok" and r["val_bpb"] is not None]

    def best(self, c: Optional[dict] = None) -> tuple[Optional[float], int]:
        """(mean metric of the best version, number of runs behind it)."""
        c = c or self.campaign
        if c["best_experiment_id"] is None:
            base = self.ledger.baseline_samples(c["id"])
            return (statistics.fmean(base), len(base)) if base else (None, 0)
        s = self._samples(c["best_experiment_id"])
        return statistics.fmean(s), len(s)

    def sigma(self, c: dict) -> float:
        """SD of the baseline across seeds (unpaired: what a verdict without pairing would face)."""
        base = self.ledger.baseline_samples(c["id"])
        return max(self.ws.cfg.noise.sigma_floor, statistics.stdev(base)) if len(base) >= 2 \
            else self.ws.cfg.noise.sigma_floor

    def sigma_paired(self, c: dict) -> tuple[float, int]:
        """(SD of a paired difference, dof from this campaign's pairs): pooled within comparisons + prior."""
        groups: dict[int, list[float]] = {}
        for key, d in self.ledger.paired_differences(c["id"]):
            groups.setdefault(key, []).append(d)
        return verdict.pooled_sigma(list(groups.values()), self.ws.cfg.noise)

    # -- seeds: the runner picks them; candidates run on the reference's seeds ------------------------
    def seed_set(self, c: dict, rotate: bool = False) -> tuple[int, list[int]]:
        """(index, seeds) of the campaign's current seed set; with rotate=True a new one is started when
        `rotate_every` candidates ran on the current one (or baseline_seeds changed)."""
        n = self.ws.cfg.noise
        cur = self.ledger.seed_set(c["id"])
        count = self.ledger.campaign_counts(c["id"])["experiments"]
        if cur is None or self._seed_set_stale(cur, count, rotate):
            cur = self.ledger.start_seed_set(c["id"], 0 if cur is None else cur.index + 1,
                                             self.fresh_seeds(c, n.baseline_seeds), count)
        return cur.index, list(cur.seeds)

    def _seed_set_stale(self, cur: SeedSet, count: int, rotate: bool) -> bool:
        n = self.ws.cfg.noise
        return len(cur.seeds) != n.baseline_seeds or bool(
            rotate and n.rotate_every and count - cur.since >= n.rotate_every)

    def next_experiment_runs(self, c: dict) -> int:
        """Runs the next run_experiment takes at most (read-only): the baseline's seeds first, else the
        candidate on every seed plus the best version on the seeds of the (possibly fresh) set it lacks."""
        k = self.ws.cfg.noise.baseline_seeds
        if not self.ledger.baseline_samples(c["id"]):
            return k
        cur = self.ledger.seed_set(c["id"])
        if cur is None or self._seed_set_stale(cur, self.ledger.campaign_counts(c["id"])["experiments"], True):
            return 2 * k   # a fresh set: the best version has no run on any of its seeds
        have = self.reference_runs(c)
        return k + sum(1 for s in cur.seeds if s not in have)

    def fresh_seeds(self, c: dict, k: int) -> list[int]:
        """k seeds no run of this campaign has used (experiments and replays)."""
        used = self.ledger.used_seeds(c["id"])
        nxt = max([self.ws.cfg.noise.first_seed - 1, *used]) + 1
        return list(range(nxt, nxt + k))

    def reference_runs(self, c: dict) -> dict[int, dict]:
        """seed -> the latest ok run of the best version on that seed."""
        return {r["seed"]: r for r in self.ledger.runs_of_commit(c["id"], c["best_commit"]) if r["seed"] is not None}

    @contextmanager
    def tree_at(self, commit: str) -> Iterator[None]:
        """The editable files as of `commit` for the duration (the branch does not move); whatever was
        there before (an agent's pending edit, a committed candidate) is put back afterwards."""
        placed = self.files_at(commit)
        self._keep_edit(placed)
        for rel, data in placed.items():   # from the object store: git's index is left as it was
            if data is None:
                (self.ws.root / rel).unlink(missing_ok=True)
            else:
                (self.ws.root / rel).write_bytes(data)
        try:
            yield
        finally:
            self._put_back_kept_edit()

    def _measure_reference(self, c: dict, seeds: list[int], set_index: Optional[int], on_progress,
                           session_id, why: str) -> list[dict]:
        """Run the best version on the given seeds it has no run on yet. Baseline runs while the best is
        the baseline; otherwise 'reference' runs attached to the kept experiment. Counted as runs."""
        have = self.reference_runs(c)
        missing = [s for s in seeds if s not in have]
        out: list[dict] = []
        if not missing:
            return out
        best_id = c["best_experiment_id"]
        with self.tree_at(c["best_commit"]):
            for s in missing:
                label = (f"baseline (seed {s}, {why})" if best_id is None else f"reference: best #{best_id} on seed {s} ({why})")
                exp = self._execute(c, label, None, c["best_commit"], c["best_commit"], on_progress, session_id,
                                    is_baseline=best_id is None, confirm_of=best_id, seed=s,
                                    role="baseline" if best_id is None else "reference", seed_set=set_index)
                if exp.status != "ok":
                    raise LoopError(f"the best version itself failed on seed {s} ({exp.status}: {exp.reason}). "
                                    f"The benchmark is broken on this machine, not your change; log tail:\n"
                                    f"{exp.log_tail}")
                assert exp.experiment_id is not None   # _execute always records the run
                out.append(self.ledger.recorded_experiment(exp.experiment_id))
        return out

    # -- locking and recovery -------------------------------------------------
    @contextmanager
    def exclusive(self) -> Iterator[None]:
        held = FileLock(self.ws.state_dir / "server.lock").try_acquire()
        if held is None:
            raise Busy("another experiment is running in this workspace (one at a time). Wait for it: "
                       "call budget_check or state_read(view='history') in a minute (from a shell: "
                       "`loopwright status`).")
        with held:
            yield

    def recover(self) -> list[int]:
        """Mark experiments orphaned by a dead server as interrupted and clean the tree; close candidates whose
        seed runs were interrupted (discarded, never scorable); put back an edit a killed run kept on disk."""
        running = self.ledger.running_experiments()
        inflight = {r["run_id"] for r in self.ledger.inflight()}
        if inflight:   # asynchronous runs belong to a driver: a dead one's are left in flight for the next
            # driver (loop/asyncrun.py reconcile: finished ones recorded, the others re-queued).
            running = [r for r in running if r["id"] not in inflight]
        if not running and not self.ledger.interrupted_candidates() and not (self.ws.state_dir / KEPT_EDIT).is_dir():
            return []
        try:
            with self.exclusive():
                done = []
                for r in running:
                    runner.kill_stale(self.ws.run_dir(r["id"]))
                    self.ledger.update_experiment(r["id"], status="interrupted", finished_at=time.time(),
                                                  reason="the loop stopped during this experiment")
                    done.append(r["id"])
                if running:
                    c = self.ledger.campaign(running[-1]["campaign_id"])
                    if c and gitops.current_branch(self.ws.root) == c["branch"]:
                        gitops.reset_to(self.ws.root, c["best_commit"])
                for cand in self.ledger.interrupted_candidates():
                    run = next(r for r in self.ledger.confirm_runs(cand["id"]) if r["status"] == "interrupted")
                    self._close_interrupted(cand, f"its run #{run['id']} (seed {run['seed']}) was interrupted")
                self._put_back_kept_edit(after_kill=True)
                return done
        except Busy:
            return []  # a live server is running them

    def _close_interrupted(self, cand: dict, why: str) -> None:
        """A candidate whose seed runs were cut short: discarded as interrupted (what was recorded stays), so it
        never waits for a score; the branch goes back to the best if it still points at the candidate."""
        reason = (f"{INTERRUPTED_REASON}{why}; the loop was stopped before its seed runs were all in, so it was "
                  f"not scored (the change is commit {(cand['commit_sha'] or '')[:10]}; run it again to measure it)")
        for r in [cand] + self.ledger.confirm_runs(cand["id"]):
            if r["verdict"] is None:
                self.ledger.update_experiment(r["id"], verdict="discard", verdict_reason=reason)
        c = self.ledger.campaign(cand["campaign_id"])
        if c and gitops.current_branch(self.ws.root) == c["branch"] and cand["commit_sha"] \
                and gitops.head_sha(self.ws.root) == cand["commit_sha"]:
            gitops.move_branch(self.ws.root, c["best_commit"])   # the tree (the change) is left as it is

    # -- an edit kept on disk while the loop puts other versions of the editable files in the tree ----------
    def files_at(self, commit: str, verified: bool = False) -> dict[str, Optional[bytes]]:
        """The editable files at `commit` (None: not in it). verified: every git object on the way re-hashed
        (a GitError if one was overwritten), so the bytes are those the commit's name stands for."""
        out: dict[str, Optional[bytes]] = {}
        for rel in self.ws.cfg.paths.editable:
            try:
                out[rel] = gitops.blob_bytes(self.ws.root, commit, rel)
            except gitops.GitError:
                out[rel] = None
                continue
            if verified:
                out[rel] = gitops.verified_blob_bytes(self.ws.root, commit, rel)
        return out

    def run_tree(self, commit: str) -> dict[str, Optional[bytes]]:
        """What a run of `commit` sees as the workspace: the pinned commit's files with the editable ones as
        of `commit`, each git object re-hashed; nothing from the working tree."""
        pinned = self.campaign["pinned_commit"]
        tree: dict[str, Optional[bytes]] = {rel: gitops.verified_blob_bytes(self.ws.root, pinned, rel)
                                            for rel in gitops.tracked_files(self.ws.root, pinned)}
        tree.update(self.files_at(commit, verified=True))
        return tree

    def _tree_files(self) -> dict[str, Optional[bytes]]:
        return {rel: (self.ws.root / rel).read_bytes() if (self.ws.root / rel).is_file() else None
                for rel in self.ws.cfg.paths.editable}

    def _notice(self, text: str) -> None:
        """Something the user must know (a file put back or saved aside): kept for the caller, said on stderr."""
        self.notices.append(text)
        print(f"loopwright: {text}", file=sys.stderr, flush=True)

    def save_backup(self, files: Mapping[str, Optional[bytes]], why: str) -> Path:
        """Copies of editable files in a fresh folder under the state dir's backups/ (the newest MAX_BACKUPS
        folders are kept); its path."""
        root = self.ws.state_dir / BACKUPS
        base = f"{time.strftime('%Y%m%d-%H%M%S')}-{why}"
        d, n = root / base, 1
        while d.exists():
            n += 1
            d = root / f"{base}-{n}"
        for rel, data in files.items():
            if data is not None:
                (d / rel).parent.mkdir(parents=True, exist_ok=True)
                (d / rel).write_bytes(data)
        for old in sorted(p for p in root.iterdir() if p.is_dir())[:-MAX_BACKUPS]:
            shutil.rmtree(old, ignore_errors=True)
        return d

    def _keep_edit(self, placed: dict[str, Optional[bytes]]) -> None:
        """Before the loop puts `placed` in the tree: the editable files as they are now go to the state dir
        (written whole, then renamed), with digests of what is placed. Put back by _put_back_kept_edit, in this
        process or -- after a kill -- by the next writer's recovery (open_for_writing)."""
        kept = self.ws.state_dir / KEPT_EDIT
        if kept.is_dir():   # left by a killed process whose recovery has not run yet
            self._put_back_kept_edit(after_kill=True)
        tmp = self.ws.state_dir / f"{KEPT_EDIT}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        current = self._tree_files()
        for rel, data in current.items():
            if data is not None:
                (tmp / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / "files" / rel).write_bytes(data)
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "manifest.json").write_text(json.dumps({
            "had": {rel: data is not None for rel, data in current.items()},
            "placed": {rel: None if data is None else hashlib.sha256(data).hexdigest() for rel, data in placed.items()},
            "at": time.time()}))
        tmp.rename(kept)

    def _put_back_kept_edit(self, after_kill: bool = False) -> None:
        """The kept edit back in the tree. A file that is no longer what the loop placed there was edited
        meanwhile: in this process (an edit made while the run ran) that version is saved to backups/ and the
        kept edit put back; after a kill, what is in the tree now stays and the kept edit goes to backups/."""
        kept = self.ws.state_dir / KEPT_EDIT
        try:
            manifest = json.loads((kept / "manifest.json").read_text())
        except (OSError, ValueError):
            shutil.rmtree(kept, ignore_errors=True)
            return
        saved = {rel: (kept / "files" / rel).read_bytes() if manifest["had"].get(rel) else None
                 for rel in manifest["had"]}
        now = self._tree_files()
        changed = {rel: data for rel, data in now.items() if rel in manifest["placed"] and manifest["placed"][rel] !=
                   (None if data is None else hashlib.sha256(data).hexdigest())}
        names = ", ".join(sorted(changed)) or ", ".join(sorted(saved))
        if after_kill and changed:
            bk = self.save_backup(saved, "edit-before-interrupted-run")
            self._notice(f"a run that was killed had set your edit of {', '.join(sorted(saved))} aside; "
                         f"{names} changed since, so it was left as it is and the earlier edit was saved to {bk}")
        else:
            if changed:
                bk = self.save_backup(changed, "edited-during-run")
                self._notice(f"{names} was edited while the loop ran another version of it; that edit was saved "
                             f"to {bk} and your edit from before the run was put back")
            for rel, data in saved.items():
                if data is None:
                    (self.ws.root / rel).unlink(missing_ok=True)
                else:
                    (self.ws.root / rel).write_bytes(data)
            if after_kill and saved != now:
                self._notice(f"the run that set your edit of {', '.join(sorted(saved))} aside was killed; "
                             "the edit was put back")
        shutil.rmtree(kept, ignore_errors=True)

    # -- integrity ----------------------------------------------------------
    def _check_pin_on_open(self) -> None:
        """The pinned commit in the ledger must be the one recorded at init in the state directory."""
        try:
            c = self.campaign
        except LoopError:
            return      # not on a campaign branch: every operation says so
        mism = integrity.check_pin(self.ws, c["pinned_commit"])
        if mism:
            key = f"tamper_pin_reported:{c['id']}:{c['pinned_commit']}"
            if not self.ledger.kv_get(key):
                self.ledger.kv_set(key, "1")
                self.ledger.add_event(c["id"], "tamper", {"files": [m.path for m in mism], "when": "on open",
                                                          "detail": integrity.describe(mism),
                                                          "action": ["the loop refuses to run or score"]},
                                      sinks=sinks_for(self.ws.cfg))
            raise LoopError(f"the loop's record of the pinned commit was tampered with: {integrity.describe(mism)}. "
                            "Nothing can be run or scored until a human restores the ledger (state.db in "
                            f"{self.ws.state_dir}) from a backup.")

    def check_integrity(self, c: dict, when: str) -> None:
        mism = integrity.check(self.ws, c["pinned_commit"])
        if not mism:
            return
        actions = integrity.restore(self.ws, c["pinned_commit"], mism)
        self.ledger.add_event(c["id"], "tamper", {"files": [m.path for m in mism], "when": when,
                                                  "detail": integrity.describe(mism), "action": actions},
                              sinks=sinks_for(self.ws.cfg))
        if integrity.restored(mism, actions):
            raise LoopError(f"integrity check failed {when}: {integrity.describe(mism)}. Restored ({'; '.join(actions)}) "
                            f"and a tamper event was recorded; nothing was run or scored. Only "
                            f"{', '.join(self.ws.cfg.paths.editable)} may change -- make your change there and "
                            "call run_experiment again.")
        # Say the truth: nothing was (fully) restored, and what a human has to do.
        raise LoopError(f"integrity check failed {when}: {integrity.describe(mism)}. It could NOT be repaired "
                        f"automatically: {'; '.join(actions)}. A tamper event was recorded; nothing was run or "
                        "scored. Stop here and ask the human to fix the workspace.")

    # -- run_experiment -----------------------------------------------------------
    @staticmethod
    def source_of(files: dict[str, Optional[bytes]]) -> str:
        """The editable files as one text, the form source hashes are taken of (bytes decoded as they are:
        the live file and its committed blob give the same text)."""
        return "\n".join(f"### {rel}\n" + ("" if data is None else data.decode("utf-8", "replace"))
                         for rel, data in files.items())

    def editable_source(self) -> str:
        return self.source_of(self._tree_files())

    @staticmethod
    def text_sha(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    def committed_source(self, commit: str, verified: bool = False) -> str:
        return self.source_of(self.files_at(commit, verified))

    def source_sha(self, commit: str) -> str:
        """The source hash of the editable files at `commit`, every git object re-hashed on the way (a
        GitError if one was overwritten): what an experiment records, and what an approval binds to."""
        return self.text_sha(self.committed_source(commit, verified=True))

    def run_experiment(self, description: str, hypothesis: Optional[str] = None,
                       confirm_of: Optional[int] = None, on_progress: Optional[runner.ProgressFn] = None,
                       session_id: Optional[int] = None,
                       approved_by_person: Optional[approvals.Approved] = None,
                       change: Optional[Change | dict] = None) -> ExperimentResult:
        """Run the change in the working tree (committed first) on the seed set, or with confirm_of a confirm
        run of a retest. approved_by_person (only from a person's process: loop/decisions.py) runs exactly
        its commit instead, never the working tree, and is neither held nor delayed by other approvals."""
        # Agent-written text: control characters/ANSI stripped, length capped (status renders it).
        description = textmod.clean(description, textmod.MAX_DESCRIPTION)
        if not description:
            raise LoopError("description is required: say in a few words what this experiment changes")
        if confirm_of is not None:
            confirm_of = _experiment_id(confirm_of, "confirm_of")
        structured = as_change(change)
        if structured is not None and confirm_of is not None:
            raise LoopError("change describes a new candidate; a confirm run re-runs the retest's own change, "
                            "so leave change out with confirm_of")
        with self.exclusive():
            c = self.campaign
            pending = self.ledger.submissions(c["id"], open_only=True)
            if pending:
                raise LoopError(f"{len(pending)} submitted experiment(s) are not decided yet "
                                f"({', '.join('#' + str(p['id']) for p in pending)}): call wait() for them first "
                                "(run_experiment compares against the best, which they may still move)")
            status = self.budget(c)
            if status.should_stop:
                raise LoopError(f"the campaign budget is spent ({'; '.join(status.reasons)}); stop here.")
            self.check_integrity(c, "before the run")
            # the autonomy slider: a change held for a person (its result), or the approved run to start
            held = approvals.Approvals(self).before_run(c, confirm_of, approved_by_person)
            if isinstance(held, ExperimentResult):
                return held
            bound = held   # a person's approval: exactly its commit runs (never the working tree)
            c = self.campaign   # an approved keep may have moved the best
            baseline, refs = None, []
            first = not self.ledger.baseline_samples(c["id"])
            if confirm_of is None and not first:
                self.refuse_non_change(c, bound)   # before the reference runs: a non-change must cost no runs
            if confirm_of is None:
                # the reference must have a run on every seed of the (possibly fresh) seed set
                set_index, seeds = self.seed_set(c, rotate=not first)
                if first:
                    baseline = self._measure_baseline(c, seeds, set_index, on_progress, session_id)
                    if bound is None and self.editable_source() == self.committed_source(c["best_commit"]):
                        return self._baseline_result(c, baseline)
                else:
                    refs = self._measure_reference(c, seeds, set_index, on_progress, session_id,
                                                   f"seed set {set_index}")
            if confirm_of is not None:
                res = self._run_confirm(c, confirm_of, description, on_progress, session_id, bound)
            else:
                res = self._run_candidate(c, description, hypothesis, on_progress, session_id, bound, structured)
            res.baseline = baseline
            res.reference_runs += len(refs)
            if res.status != "ok":   # an ok run waits for score(): the end is recorded after the keep it may make
                outcome.record_if_budget_spent(self, c)
            return res

    def _measure_baseline(self, c: dict, seeds: list[int], set_index: int, on_progress,
                          session_id) -> BaselineInfo:
        """Run the pinned train.py on the seed set; the agent's pending edit (if any) is put back afterwards
        (it is kept in the state dir meanwhile, so that it survives a kill: the next writer puts it back)."""
        placed = self.files_at(c["best_commit"])
        self._keep_edit(placed)
        gitops.reset_to(self.ws.root, c["best_commit"])
        try:
            for k, s in enumerate(seeds, 1):
                if s in self.reference_runs(c):
                    continue
                exp = self._execute(c, f"baseline (seed run {k}/{len(seeds)}, seed {s})", None,
                                    c["best_commit"], c["best_commit"], on_progress, session_id, is_baseline=True,
                                    seed=s, role="baseline", seed_set=set_index)
                if exp.status != "ok":
                    raise LoopError(f"the baseline itself failed ({exp.status}: {exp.reason}). The benchmark "
                                    f"is broken on this machine, not your change; log tail:\n{exp.log_tail}")
        finally:
            self._put_back_kept_edit()
        samples = self.ledger.baseline_samples(c["id"])
        t = self.ws.cfg.target
        if t is not None and t.noise == "deterministic" and len(set(samples)) > 1:
            raise LoopError(f"target {t.name} declares noise = \"deterministic\" but its baseline's {t.metric} varies "
                            f"across seeds {seeds}: {', '.join(f'{v:g}' for v in samples)}. A keep on a varying "
                            "metric needs paired runs: declare noise = \"repeat\" (or \"seeded\") in [target] "
                            "-- a new workspace, the contract is frozen")
        sig = self.sigma(c)
        sd, _ = self.sigma_paired(c)
        n = self.ws.cfg.noise
        return BaselineInfo(samples=samples, mean=statistics.fmean(samples), sigma=sig,
                            keep_threshold=verdict.keep_bar(sd, n, len(seeds)), sigma_paired=sd,
                            mde=verdict.achieved_mde(sd, n), seeds=seeds)

    def _baseline_result(self, c: dict, baseline: BaselineInfo) -> ExperimentResult:
        last = self.ledger.experiments(c["id"], limit=1, newest_first=True)[0]
        return ExperimentResult(
            experiment_id=last["id"], status="ok", val_bpb=baseline.mean, best_val_bpb=baseline.mean,
            delta_vs_best=0.0, commit=c["best_commit"][:10], seed=last["seed"], baseline=baseline,
            training_seconds=last["training_seconds"], total_seconds=last["total_seconds"],
            eval_seconds=last["eval_seconds"], memory_gb=last["memory_gb"], num_steps=last["num_steps"],
            next_step=(f"Baseline measured on {len(baseline.samples)} seeds: {baseline.mean:.4f} ± "
                       f"{baseline.sigma:.4f} across seeds. Candidates run on the same seeds and are judged on "
                       f"paired differences: a keep needs a mean paired gain of {baseline.keep_threshold:.4f} "
                       f"(detectable effect ~{baseline.mde:.4f}). Edit {self.ws.cfg.paths.editable[0]} and call "
                       "run_experiment(description, hypothesis)."))

    def check_change(self, c: dict, change: Change, commit: Optional[str] = None) -> None:
        """A LoopError unless `change` agrees with train.py: the best version's against `commit`'s (None:
        the working tree's)."""
        rel = self.ws.cfg.paths.editable[0]
        after = self._tree_files() if commit is None else self.files_at(commit)
        check_against(change, self.files_at(c["best_commit"]).get(rel), after.get(rel), rel)

    def refuse_non_change(self, c, bound: Optional[approvals.Approved] = None) -> str:
        """train.py's source (the working tree's, or the approved commit's), unless it is no real change from
        the best version (then a LoopError saying what it is: identical, comments/whitespace only, or seed only)."""
        src = self.editable_source() if bound is None else self.committed_source(bound.commit, verified=True)
        best_src = self.committed_source(c["best_commit"])
        if src == best_src:
            raise LoopError("train.py is identical to the best version: edit it first, then call run_experiment.")
        if verdict.comments_only_change(best_src, src):
            raise LoopError("only comments/whitespace changed in train.py: the code is the same as the best "
                            "version, so a run would only measure noise. Change the code itself, then call "
                            "run_experiment.")
        if verdict.seed_only_change(best_src, src):
            raise LoopError("this change only touches the random seed; a seed change can never be kept "
                            "(the runner picks seeds). Try a real change to the model or training.")
        return src

    def _run_candidate(self, c, description, hypothesis, on_progress, session_id,
                       bound: Optional[approvals.Approved] = None,
                       change: Optional[Change] = None) -> ExperimentResult:
        src = self.refuse_non_change(c, bound)
        if change is not None:
            self.check_change(c, change, None if bound is None else bound.commit)
        sha = self.text_sha(src)
        p = self.ledger.prior_of_source(c["id"], sha, skip_statuses=("interrupted",),
                                        skip_reason_prefix=INTERRUPTED_REASON)
        if p is not None:
            raise LoopError(f"exact repeat of experiment #{p['id']} ({p['description']!r}: status {p['status']}, "
                            f"val_bpb {p['val_bpb']}, verdict {p['verdict']}). Try something else; "
                            "state_read(view='tried') lists what was tried.")
        from mcp_server.mechanisms import near_repeat_warnings
        # search mechanisms (tabu): near repeats of tried versions (of the working tree: the agent's own runs)
        warnings = near_repeat_warnings(self) if bound is None else []
        self._abandon_pending_retests(c)
        if bound is None:
            try:
                commit, _ = gitops.commit_editable(self.ws.root, self.ws.cfg.paths.editable,
                                                   self.ws.cfg.paths.state_dir, f"experiment: {description}")
            except gitops.GitError as e:
                raise LoopError(str(e)) from None
            assert commit is not None
            sha = self.source_sha(commit)   # what was committed (the file may have changed since it was read)
        else:
            # the commit built from the approved blobs, on the best; its bytes checked against the approval
            approvals.Approvals(self).refuse_unbound(c, bound, bound.commit, "before an approved run")
            commit, sha = bound.commit, bound.source_sha
            if [p.hexsha for p in gitops.repo(self.ws.root).commit(commit).parents] != [c["best_commit"]]:
                raise LoopError(f"approval #{bound.approval_id}: commit {commit[:10]} is not built on the best "
                                f"{c['best_commit'][:10]}; `loopwright approve --apply` carries it onto the best")
            gitops.reset_to(self.ws.root, commit)   # the branch moves to it, as a committed candidate does
        set_index, seeds = self.seed_set(c)
        refs = self.reference_runs(c)
        noise = self.ws.cfg.noise
        res = self._execute(c, description, hypothesis, commit, c["best_commit"], on_progress, session_id,
                            source_sha=sha, seed=seeds[0], role="candidate", paired_with=refs[seeds[0]]["id"],
                            seed_set=set_index, change=change)
        res.warnings.extend(warnings)
        if res.status != "ok":
            return res
        eid = res.experiment_id
        assert eid is not None   # a run that ran was recorded
        try:
            for s in seeds[1:]:   # the rest of the seed set, each paired with the reference's run on it
                if verdict.enough_pairs([p.d for p in outcome.pairs(self, eid)], self.sigma_paired(c)[0], noise, len(seeds)):
                    res.early_stopped = True   # the verdict is already clear: skip the rest of the seed set
                    break
                r = self._execute(c, f"{description} [seed {s}]", hypothesis, commit, c["best_commit"],
                                  on_progress, session_id, confirm_of=eid, source_sha=sha, seed=s, role="pair",
                                  paired_with=refs[s]["id"], seed_set=set_index)
                if r.status != "ok":
                    r.warnings.extend(warnings)
                    return r
        except BaseException as e:   # Ctrl-C, a signal, the server ending: never left waiting for a score
            cand = self.ledger.experiment(eid)
            if cand is not None and cand["verdict"] is None:
                self._close_interrupted(cand, f"a later seed run was interrupted ({type(e).__name__})")
            if gitops.head_sha(self.ws.root) != c["best_commit"]:
                gitops.reset_to(self.ws.root, c["best_commit"])
            raise
        return self._paired_result(c, eid, res)

    def _paired_result(self, c: dict, eid: int, first: ExperimentResult) -> ExperimentResult:
        """The candidate's result over its pairs: mean val_bpb, mean paired delta."""
        pairs = outcome.pairs(self, eid)
        res = first.model_copy()
        res.pairs = pairs
        if pairs:
            res.val_bpb = round(statistics.fmean(p.candidate for p in pairs), 6)
            res.delta_vs_best = round(statistics.fmean(p.d for p in pairs), 6)
        how = (f"the verdict was clear after {len(pairs)} pair(s), so the rest of the seed set was not run. "
               if res.early_stopped else "")
        res.next_step = (f"{how}Ran on {len(pairs)} seed(s) paired with the best version (mean paired delta "
                         f"{res.delta_vs_best:+.5f}). Call score(experiment_id={eid}) for the verdict.")
        return res

    def _abandon_pending_retests(self, c: dict) -> None:
        """A new candidate while a retest waits: the retest is discarded and the branch goes back to best."""
        for r in self.ledger.pending_retests(c["id"]):
            self.ledger.update_experiment(r["id"], verdict="discard",
                                          verdict_reason="abandoned: a new experiment started before its confirm run")
        if gitops.head_sha(self.ws.root) != c["best_commit"]:
            gitops.move_branch(self.ws.root, c["best_commit"])

    def _run_confirm(self, c, confirm_of, description, on_progress, session_id,
                     bound: Optional[approvals.Approved] = None) -> ExperimentResult:
        orig = self.ledger.experiment(confirm_of)
        if orig is None or orig["campaign_id"] != c["id"]:
            raise LoopError(f"experiment {confirm_of} does not exist in this campaign; "
                            "state_read(view='history') lists experiment ids")
        if orig["verdict"] != "retest":
            raise LoopError(f"experiment {confirm_of} has verdict {orig['verdict']!r}; only a 'retest' verdict "
                            "takes a confirm run")
        if bound is not None:   # the run is the commit, whatever the working tree holds
            approvals.Approvals(self).refuse_unbound(c, bound, orig["commit_sha"], "before an approved confirm run",
                                     recorded=orig["source_sha"])
        if gitops.head_sha(self.ws.root) != orig["commit_sha"] or (bound is None and gitops.is_dirty(self.ws.root)):
            raise LoopError(f"the tree is not at experiment {confirm_of}'s commit (you edited train.py after the "
                            "retest verdict). Call revert(to=%d) to go back to it, then run the confirm." % confirm_of)
        # a fresh seed for BOTH: the reference (best) runs on it first, then the candidate, paired
        seed = self.fresh_seeds(c, 1)[0]
        refs = self._measure_reference(c, [seed], None, on_progress, session_id, f"confirm of #{confirm_of}")
        ref_id = self.reference_runs(c)[seed]["id"]
        res = self._execute(c, description or f"confirm #{confirm_of}", orig["hypothesis"], orig["commit_sha"],
                            orig["parent_commit"], on_progress, session_id, confirm_of=confirm_of,
                            source_sha=orig["source_sha"], seed=seed, role="confirm", paired_with=ref_id)
        res.reference_runs += len(refs)
        if res.status != "ok":
            return res
        out = self._paired_result(c, confirm_of, res)
        out.next_step = (f"Confirm pair on fresh seed {seed} recorded (reference run #{ref_id}). Call "
                         f"score(experiment_id={confirm_of}) again.")
        return out

    def _execute(self, c, description, hypothesis, commit, parent, on_progress, session_id, *, seed: int,
                 is_baseline=False, confirm_of=None, source_sha=None, role=None, paired_with=None,
                 seed_set=None, change: Optional[Change] = None) -> ExperimentResult:
        t_start = time.monotonic()
        added, removed = (0, 0) if commit == parent else gitops.diff_stats(
            self.ws.root, parent, commit, self.ws.cfg.paths.editable[0])
        eid = self.ledger.start_experiment(
            c["id"], description, hypothesis=hypothesis, commit_sha=commit, parent_commit=parent,
            is_baseline=int(is_baseline), confirm_of=confirm_of, source_sha=source_sha, lines_added=added,
            lines_removed=removed, session_id=session_id, role=role, paired_with=paired_with, seed_set=seed_set,
            seed=seed, change=None if change is None else change.model_dump())
        run_dir = self.ws.run_dir(eid)
        try:
            ledger_before = self._ledger_digest(eid)
            # what runs is the commit on record, not the live tree the agent can rewrite meanwhile
            tr = runner.run_training(self.ws, run_dir, seed, on_progress, sources=self.run_tree(commit))
            if tr.status != "ok" and procs.stopping():   # killed by the loop itself on its way out
                raise Interrupted(f"the loop was stopped during run #{eid} (the run ended: {tr.reason})")
            status, reason, ev = tr.status, tr.reason, None
            if tr.sandbox == "none":   # only with the human's --unsafe-no-sandbox
                outcome.note_unsandboxed(self, c, eid)
            # train.py ran arbitrary code (even if it then crashed): check what it must not touch.
            problems = []
            mism = integrity.check(self.ws, c["pinned_commit"])
            if mism:
                actions = integrity.restore(self.ws, c["pinned_commit"], mism)
                self.ledger.add_event(c["id"], "tamper", {"files": [m.path for m in mism], "when": "during the run",
                                                          "experiment_id": eid, "action": actions},
                                      sinks=sinks_for(self.ws.cfg))
                problems.append(f"train.py changed frozen files while running: {integrity.describe(mism)}")
            if self._ledger_digest(eid) != ledger_before:
                self.ledger.add_event(c["id"], "tamper", {"files": [self.ws.db_path.name], "when": "during the run",
                                                          "experiment_id": eid, "action": ["the run was rejected"]},
                                      sinks=sinks_for(self.ws.cfg))
                problems.append("the ledger's recorded experiments changed while train.py ran; train.py must not "
                                "touch .loopwright/")
            if problems:
                status, reason = "rejected", "; ".join(problems)
            elif tr.status == "ok":
                assert tr.model_path is not None   # an ok training run always leaves its model
                ev = runner.run_evaluation(self.ws, c["pinned_commit"], run_dir, tr.model_path)
                if not ev.ok:
                    status, reason = "rejected", f"the evaluator rejected the model: {ev.reason}"
            # What the loop itself costs per experiment, apart from the two child processes.
            timing = {"train_wall_s": round(tr.wall_seconds, 3), "eval_wall_s": round(ev.wall_seconds, 3) if ev else 0.0,
                      "harness_s": round(time.monotonic() - t_start - tr.wall_seconds - (ev.wall_seconds if ev else 0.0), 3),
                      "sandboxed": 0 if tr.sandbox == "none" else 1}
            outcome.write_run(
                self, eid, status=status, reason=reason, is_baseline=is_baseline, summary=tr.summary,
                extra_metrics=timing, val_bpb=ev.val_bpb if ev and ev.ok else None,
                test_bpb=ev.test_bpb if ev and ev.ok else None, eval_seconds=ev.eval_seconds if ev else None,
                total_seconds=round(tr.wall_seconds, 3), log_tail=tr.log_tail)
        except BaseException as e:
            stopped = isinstance(e, (KeyboardInterrupt, Interrupted)) or procs.stopping()
            self.ledger.update_experiment(eid, status="interrupted", finished_at=time.time(), reason=(
                "interrupted: the loop was stopped during this run (Ctrl-C, SIGTERM/SIGHUP, or its server ended)"
                if stopped else f"loop error: {type(e).__name__}: {e}"))
            if not is_baseline and role != "reference":
                gitops.reset_to(self.ws.root, c["best_commit"])
            raise
        row = self.ledger.recorded_experiment(eid)
        if status != "ok" and not is_baseline and role != "reference":
            self._after_failure(c, row, confirm_of)
        return self._result(c, row)

    def _ledger_digest(self, running_id: int) -> str:
        """A digest of what train.py must not be able to rewrite while it runs (nothing else writes these
        rows during a run: the experiment lock is held)."""
        return self.ledger.scored_rows_digest(running_id)

    def _after_failure(self, c: dict, row: dict, confirm_of: Optional[int]) -> None:
        """A failed run is discarded at once and the tree goes back to the best commit."""
        self.ledger.update_experiment(row["id"], verdict="discard", verdict_reason=row["reason"])
        if confirm_of is not None:
            self.ledger.update_experiment(confirm_of, verdict="discard",
                                          verdict_reason=f"confirm run #{row['id']} failed: {row['reason']}")
        gitops.reset_to(self.ws.root, c["best_commit"])
        outcome.record_crash(self, c, row)

    def _result(self, c: dict, row: dict) -> ExperimentResult:
        best, _ = self.best(c)
        delta = None if row["val_bpb"] is None or best is None else row["val_bpb"] - best
        if row["status"] == "ok":
            nxt = (f"Call score(experiment_id={row['confirm_of'] or row['id']}) for the verdict."
                   if not row["is_baseline"] else "Baseline run recorded.")
        elif row["status"] == "rejected":
            nxt = "The run was rejected and discarded; the tree is back at the best commit. Read the reason."
        else:
            nxt = ("The run failed and was discarded; the tree is back at the best commit. Read log_tail, fix "
                   f"the problem in {self.ws.cfg.paths.editable[0]} and run again.")
        t = self.ws.cfg.target
        return ExperimentResult(
            metric=None if t is None else t.metric,
            metric_value=None if t is None or row["val_bpb"] is None else row["val_bpb"] * t.sign(),
            experiment_id=row["id"], status=row["status"], val_bpb=row["val_bpb"], best_val_bpb=best,
            delta_vs_best=None if delta is None else round(delta, 6), commit=(row["commit_sha"] or "")[:10],
            seed=row["seed"], confirm_of=row["confirm_of"], training_seconds=row["training_seconds"],
            total_seconds=row["total_seconds"], eval_seconds=row["eval_seconds"], memory_gb=row["memory_gb"],
            num_steps=row["num_steps"], reason=row["reason"],
            log_tail=None if row["status"] == "ok" else (row["log_tail"] or "")[-2500:], next_step=nxt)

    # -- score ------------------------------------------------------------------
    def score(self, experiment_id: Optional[int] = None,
              approved_by_person: Optional[approvals.Approved] = None) -> ScoreResult:
        """The verdict of an experiment whose runs are in. approved_by_person (a person's re-measure of an
        approved keep, loop/decisions.py): a keep applies at once, and only if the experiment is exactly
        the approved bytes (else refused, a tamper event recorded)."""
        with self.exclusive():
            c = self.campaign
            exp = self._scorable(c, experiment_id)
            self.check_integrity(c, "before scoring")
            if approved_by_person is not None:
                try:
                    approvals.Approvals(self).refuse_unbound(c, approved_by_person, exp["commit_sha"], "before an approved keep",
                                             recorded=exp["source_sha"])
                except approvals.Tampered as e:
                    for r in [exp] + self.ledger.confirm_runs(exp["id"]):
                        self.ledger.update_experiment(r["id"], verdict="discard", verdict_reason=str(e))
                    gitops.reset_to(self.ws.root, c["best_commit"])
                    raise
            if self.best(c)[0] is None:
                raise LoopError("no baseline yet: call run_experiment first (it measures the baseline)")
            j = outcome.judge(self, c, exp)   # the verdict, as the asynchronous loop computes it
            v, samples, pairs, sig, diffs = j.verdict, j.samples, j.pairs, j.sigma, j.diffs
            noise = self.ws.cfg.noise
            ids = [exp["id"]] + [r["id"] for r in self.ledger.confirm_runs(exp["id"])]
            for i in ids:
                self.ledger.update_experiment(i, verdict=v.kind, verdict_reason=v.reason)
            if v.kind == "keep":
                # autonomy approve-keeps: the keep may wait on a person (loop/approvals.py)
                held = outcome.keep(self, c, exp, j, approved_by_person)
                v, nxt = held if held is not None else (
                    v, "Kept: the branch advanced. Write a note about what worked, then try the next idea.")
            elif v.kind == "retest":
                nxt = (f"Too close to call. Do not edit train.py; call run_experiment(description='confirm', "
                       f"confirm_of={exp['id']}) to measure it on a fresh seed, then score({exp['id']}) again.")
            else:
                gitops.reset_to(self.ws.root, c["best_commit"])
                nxt = "Discarded: train.py is back at the best version. Note the dead end, then try something else."
            outcome.after_verdict(self, c)
            c = self.ledger.recorded_campaign(c["id"])
            best_after, _ = self.best(c)
            lo, hi = verdict.paired_interval(diffs, sig)
            return ScoreResult(experiment_id=exp["id"], verdict=v.kind, gain=round(v.gain, 6),
                               threshold=round(v.threshold, 6), sigma=round(sig, 6), samples=samples,
                               best_val_bpb=best_after, best_commit=c["best_commit"][:10], reason=v.reason,
                               pairs=pairs, interval=(round(lo, 6), round(hi, 6)), early_stop=v.early_stop,
                               mde=round(verdict.achieved_mde(sig, noise), 6), next_step=nxt)

    def _scorable(self, c: dict, experiment_id: Optional[int]) -> dict:
        if experiment_id is None:
            exp = self.ledger.latest_scorable(c["id"])
            if exp is None:
                raise LoopError("nothing to score: run_experiment first (the last experiment already has a verdict)")
        else:
            exp = self.ledger.experiment(_experiment_id(experiment_id, "experiment_id"))
            if exp is None or exp["campaign_id"] != c["id"]:
                raise LoopError(f"experiment {experiment_id} does not exist in this campaign; "
                                "state_read(view='history') lists experiment ids")
            if exp["confirm_of"] is not None:
                exp = self.ledger.recorded_experiment(exp["confirm_of"])
        if exp["is_baseline"]:
            raise LoopError(f"experiment {exp['id']} is a baseline run; baselines are not scored")
        if exp["status"] != "ok":
            raise LoopError(f"experiment {exp['id']} has status {exp['status']} and was discarded already "
                            f"({exp['reason']}); nothing to score")
        if exp["verdict"] in ("keep", "discard"):
            raise LoopError(f"experiment {exp['id']} was already scored: {exp['verdict']}. Scores are final.")
        if exp["verdict"] == "retest":
            pending = [r for r in self.ledger.confirm_runs(exp["id"]) if r["verdict"] is None and r["status"] == "ok"]
            if not pending:
                raise LoopError(f"experiment {exp['id']} awaits a confirm run: call run_experiment("
                                f"description='confirm', confirm_of={exp['id']}) first")
        if exp["commit_sha"] != gitops.head_sha(self.ws.root):
            raise LoopError(f"experiment {exp['id']} is not the current head (it was superseded); only the latest "
                            "experiment can be scored")
        return exp

    # -- asynchronous experiments (loop/asyncrun.py, on the executor of the [executor] settings) ----------
    def submit_experiment(self, description: str, hypothesis: Optional[str] = None,
                          session_id: Optional[int] = None, change: Optional[Change | dict] = None) -> SubmitResult:
        """Snapshot train.py into a commit (branch, index and working tree untouched: the agent edits on),
        queue its runs on the executor -- any reference runs of the best it needs, then the candidate on
        every seed of the seed set, paired, in parallel up to `[executor] parallel` -- and return its id at
        once. The first submission with an unchanged train.py measures the baseline. The verdict comes when
        all its runs are in, against the best at that time (a stale candidate is rebased and re-measured);
        wait() or state_read() record it. Raises LoopError (nothing recorded) when the budget cannot hold
        its runs, the executor cannot be reached, or another process drives this workspace."""
        return asyncrun.submit(self, description, hypothesis, session_id, as_change(change))

    def wait(self, ids: Optional[list[int]] = None, timeout: float = 600.0) -> WaitResult:
        """Record finished runs and decide what can be decided; block until every id in `ids` is decided
        (ids=None: until any experiment open at the call is), or `timeout` seconds passed."""
        return asyncrun.wait(self, ids, timeout)

    def poll(self) -> None:
        """Record what this process's driver finished, without blocking (no driver here: nothing)."""
        drv = asyncrun.driver_for(self, create=False)
        if drv is None:
            return
        try:
            with self.exclusive():
                asyncrun.settle(self, drv)
        except Busy:
            pass

    # -- revert -----------------------------------------------------------------
    def revert(self, to: Optional[int] = None) -> RevertResult:
        with self.exclusive():
            c = self.campaign
            if to is None:
                commit, eid = c["best_commit"], c["best_experiment_id"]
                moves_branch = True
            else:
                exp = self.ledger.experiment(_experiment_id(to, "to"))
                if exp is None or exp["campaign_id"] != c["id"]:
                    raise LoopError(f"experiment {to} does not exist in this campaign")
                if exp["verdict"] not in ("keep", "retest") and not exp["is_baseline"]:
                    raise LoopError(f"experiment {to} has verdict {exp['verdict']!r}; revert goes to the best, a kept "
                                    "experiment, a baseline, or a pending retest")
                commit, eid = exp["commit_sha"], exp["id"]
                moves_branch = exp["verdict"] == "retest"
            # an uncommitted edit (not in HEAD, not what the revert puts there) is saved before it is overwritten
            now, head, target = self._tree_files(), self.files_at(gitops.head_sha(self.ws.root)), self.files_at(commit)
            lost = {rel: data for rel, data in now.items() if data is not None and data != head[rel]
                    and data != target[rel]}
            backup = self.save_backup(lost, "before-revert") if lost else None
            if moves_branch or commit == c["best_commit"]:
                gitops.reset_to(self.ws.root, commit)   # the branch itself moves (best, or a pending retest)
            else:
                gitops.checkout_files(self.ws.root, commit, self.ws.cfg.paths.editable)
            files = self.ws.cfg.paths.editable
            msg = f"{', '.join(files)} now {'matches' if len(files) == 1 else 'match'} commit {commit[:10]}"
            if backup is not None:
                msg += f"; your uncommitted edit of {', '.join(sorted(lost))} was saved to {backup}"
            return RevertResult(commit=commit[:10], experiment_id=eid, files=self.ws.cfg.paths.editable,
                                message=msg, backup=None if backup is None else str(backup))

    def interruption_summary(self, after_id: int) -> str:
        """One line on what a run_experiment stopped by Ctrl-C or a signal left behind (its runs have ids
        above `after_id`): what was interrupted, what was recorded and discarded, the budget, train.py."""
        c = self.campaign
        rows = self.ledger.experiments_after(c["id"], after_id)
        b = self.budget(c)
        left = "" if b.experiments_left is None else f" ({b.experiments_used} used, {b.experiments_left} left)"
        budget = f"the interrupted run does not count against the experiment budget{left}"
        edit = self._tree_files() != self.files_at(c["best_commit"])
        tree = (f"{', '.join(self.ws.cfg.paths.editable)} kept as you left it" if edit else
                f"{', '.join(self.ws.cfg.paths.editable)} is at the best version ({c['best_commit'][:10]})")
        if not rows:
            return f"nothing had started yet: nothing was recorded or scored; {tree}"
        stopped = [r for r in rows if r["status"] == "interrupted"]
        cand = next((r for r in rows if r["role"] == "candidate"), None) or next(
            (self.ledger.experiment(r["confirm_of"]) for r in rows if r["role"] == "pair"), None)
        if cand is not None:
            what = f"experiment {cand['id']}'s run stopped"
            if stopped:
                what += f" (run #{stopped[-1]['id']}, seed {stopped[-1]['seed']})"
            done = (f"experiment {cand['id']} was discarded as interrupted, nothing was scored; your change is "
                    f"commit {(cand['commit_sha'] or '')[:10]} (`git checkout {(cand['commit_sha'] or '')[:10]} -- "
                    f"{' '.join(self.ws.cfg.paths.editable)}` brings it back, then run it again)")
        elif any(r["role"] == "confirm" for r in rows):
            conf = next(r for r in rows if r["role"] == "confirm")
            what = f"the confirm run of experiment {conf['confirm_of']} stopped"
            done = (f"experiment {conf['confirm_of']} still awaits its confirm run: revert(to={conf['confirm_of']}) "
                    "and run it again; nothing was scored")
        elif any(r["is_baseline"] for r in rows):
            base = self.ledger.baseline_samples(c["id"])
            what = f"the baseline measurement stopped ({len(base)} of {self.ws.cfg.noise.baseline_seeds} seed runs in)"
            done = "the runs that finished are kept and the next run_experiment measures the rest; nothing was scored"
        else:
            what = "a reference run of the best version stopped"
            done = "nothing was scored"
        if not stopped:
            budget = "no run was cut short"
        return f"{what}; {done}; {budget}; {tree}"

    # -- budget, state, notes ------------------------------------------------------
    def budget(self, c: Optional[dict] = None) -> BudgetResult:
        c = c or self.campaign
        best, _ = self.best(c)
        st = budgetmod.check(self.ledger, c["id"], self.ws.cfg.budget, best)
        stop = self.ledger.stop_request()
        reasons = list(st.reasons) + ([f"stop requested: {stop}"] if stop else [])
        should_stop = bool(reasons)
        nxt = ("Stop now: the budget is spent. Summarise what you learned with note()." if should_stop else
               "Budget remains: keep going (state_read, edit train.py, run_experiment, score).")
        sd, _ = self.sigma_paired(c)
        noise = self.ws.cfg.noise
        bar, mde = verdict.keep_bar(sd, noise, noise.baseline_seeds), verdict.achieved_mde(sd, noise)
        runs = self.next_experiment_runs(c)
        if not should_stop:
            left = "" if st.runs_left is None else f" ({st.runs_left} left in the budget)"
            nxt += (f" The next experiment takes up to {runs} training run(s) of {self.ws.cfg.benchmark.time_budget:g} s "
                    f"of training each{left}.")
            nxt += (f" Detectable effect now: ~{mde:.4f} bits/byte (a keep needs a mean paired gain of {bar:.4f} "
                    f"on {noise.baseline_seeds} seeds); prefer changes you expect to gain at least that much.")
        return BudgetResult(**{**st.model_dump(), "reasons": reasons, "should_stop": should_stop},
                            stop_requested=stop, benchmark_version=self.ws.benchmark_version,
                            sigma_paired=round(sd, 6), keep_threshold=round(bar, 6),
                            mde=round(mde, 6), runs_per_experiment=noise.baseline_seeds,
                            next_experiment_runs=runs, next_step=nxt)

    def budget_check(self) -> BudgetResult:
        """The agent's budget_check: budget(), and when it says stop the campaign's end is recorded (once),
        e.g. after a stop request or a last run the agent never scored."""
        b = self.budget()
        if b.should_stop:
            self.end_if_spent()
        return b

    def request_stop(self, reason: str) -> bool:
        """Ask the loop to stop: the next budget check says should_stop, with this reason. With no run in
        flight the campaign ends now (budget_spent and campaign_end are recorded: Slack says so, Jira closes
        the issue); else the run's own end records them, after its result. True when they were recorded."""
        self.ledger.request_stop(reason)
        return self.end_if_spent()

    def end_if_spent(self) -> bool:
        """Record the campaign's end (once) if the budget says stop and nothing is in flight whose result
        would come after it. True when it is recorded (now or before)."""
        c = self.campaign
        if self.ledger.count_running(c["id"]) or self.ledger.submissions(c["id"], open_only=True):
            return False
        outcome.record_if_budget_spent(self, c)
        return bool(self.ledger.kv_get(f"budget_spent_notified:{c['id']}"))

    def clear_stop_request(self) -> None:
        self.ledger.clear_stop_request()
        c = self.campaign
        if not self.budget(c).should_stop:   # the loop goes on: its next end is announced again
            self.ledger.kv_delete(f"budget_spent_notified:{c['id']}")

    def recent_experiments(self, limit: int = 10) -> list[dict]:
        """The campaign's latest experiments, newest first."""
        return self.ledger.experiments(self.campaign["id"], limit=limit, newest_first=True)

    def state(self, view: str = "summary", limit: int = 20) -> StateView:
        if view not in STATE_VIEWS:
            raise LoopError(f"unknown view {view!r}; use one of {', '.join(STATE_VIEWS)}")
        limit = max(1, min(int(limit), 500))
        self.poll()
        c = self.campaign
        out = StateView(view=view)
        if view == "summary":
            running, pending = asyncrun.in_flight_rows(self, c)
            out.in_flight = [ExperimentRow.from_row(r) for r in running]
            out.pending = pending
            out.summary = self.summary(c)
            out.experiments = [ExperimentRow.from_row(r) for r in
                               self.ledger.experiments(c["id"], limit=min(limit, 5), newest_first=True)]
            out.notes = [NoteRow(**_pick(n, NoteRow)) for n in self.ledger.notes(c["id"], limit=min(limit, 5))]
        elif view == "history":
            out.experiments = [ExperimentRow.from_row(r) for r in
                               self.ledger.experiments(c["id"], limit=limit, newest_first=True)]
        elif view == "best":
            if c["best_experiment_id"]:
                out.best = ExperimentRow.from_row(self.ledger.recorded_experiment(c["best_experiment_id"]))
            out.summary = self.summary(c)
        elif view == "notes":
            out.notes = [NoteRow(**_pick(n, NoteRow)) for n in self.ledger.notes(c["id"], limit=limit)]
        elif view == "noise":
            out.noise = self.noise(c)
        elif view == "tried":
            rows = self.ledger.candidates(c["id"], limit=limit, newest_first=True)
            out.tried = [f"#{r['id']} {r['verdict'] or r['status']}: {r['description']}" for r in reversed(rows)]
        return out

    def noise(self, c: dict) -> NoiseInfo:
        base = self.ledger.baseline_samples(c["id"])
        sig = self.sigma(c)
        n = self.ws.cfg.noise
        sd, dof = self.sigma_paired(c)
        idx, seeds = self.seed_set(c)
        return NoiseInfo(baseline_samples=base, baseline_mean=statistics.fmean(base) if base else None, sigma=sig,
                         min_delta=n.min_delta, k_sigma=n.k_sigma, single_run_threshold=verdict.bar(sd, n, 1),
                         sigma_paired=sd, paired_dof=dof, seeds=seeds, seed_set=idx,
                         keep_threshold=verdict.keep_bar(sd, n, len(seeds)), mde=verdict.achieved_mde(sd, n),
                         rule=("candidates run on the reference's seeds; keep iff mean(candidate - reference) <= "
                               + (f"-max({n.min_delta}, {n.k_sigma} * sigma_paired / sqrt(n))" if n.pairs == "fixed" else
                                  f"minus the sequential keep bound after n pairs (adaptive pairs: one more pair while "
                                  f"the call is close, at most {n.max_pairs})")
                               + f"; sigma_paired pools "
                               f"{dof} dof of this campaign's pairs with a prior {n.sigma_prior} worth "
                               f"{n.prior_pairs:g} pairs; fresh seed set every {n.rotate_every} candidates"))

    def summary(self, c: Optional[dict] = None) -> Summary:
        c = c or self.campaign
        best, _ = self.best(c)
        base = self.ledger.baseline_samples(c["id"])
        counts = self.ledger.campaign_counts(c["id"])
        stuck = {r["id"] for r in self.ledger.interrupted_candidates()}
        pending = [r for r in self.ledger.unscored_candidates(c["id"]) if r["id"] not in stuck]
        retest = self.ledger.pending_retests(c["id"])
        return Summary(tag=c["tag"], branch=c["branch"], pinned_commit=c["pinned_commit"][:10],
                       best_commit=c["best_commit"][:10], best_experiment_id=c["best_experiment_id"],
                       best_val_bpb=best, baseline_val_bpb=statistics.fmean(base) if base else None,
                       **counts,
                       pending_score=[r["id"] for r in pending], pending_retest=[r["id"] for r in retest],
                       time_budget_s=self.ws.cfg.benchmark.time_budget)

    def note(self, text: str, kind: str = "lesson", experiment_id: Optional[int] = None) -> NoteResult:
        if len(text or "") > 4 * textmod.MAX_NOTE:
            raise LoopError("note is longer than 4000 characters; keep notes short and specific")
        text = textmod.clean(text, 10 * textmod.MAX_NOTE, single_line=False)
        if not text:
            raise LoopError("note text is empty; write the lesson or dead end in a sentence or two")
        if kind not in NOTE_KINDS:
            raise LoopError(f"unknown note kind {kind!r}; use one of {', '.join(NOTE_KINDS)}")
        if len(text) > 4000:
            raise LoopError("note is longer than 4000 characters; keep notes short and specific")
        c = self.campaign
        if experiment_id is not None and self.ledger.experiment(_experiment_id(experiment_id, "experiment_id")) is None:
            raise LoopError(f"experiment {experiment_id} does not exist")
        return NoteResult(note_id=self.ledger.add_note(c["id"], kind, text, experiment_id), kind=kind)


def _experiment_id(value, name: str) -> int:
    """An experiment id from a caller (an agent): an int SQLite can hold, or a clear error."""
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise LoopError(f"{name}={value!r} is not an experiment id; state_read(view='history') lists them") from None
    if not 1 <= v < 2 ** 63:
        raise LoopError(f"{name}={value} is not an experiment id (ids are positive and far smaller); "
                        "state_read(view='history') lists them")
    return v


def _pick(row: dict, model) -> dict:
    return {k: row[k] for k in model.model_fields if k in row}
