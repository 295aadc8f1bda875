"""The autonomy slider: changes that wait for a person before they count.

`[campaign] autonomy` (an operational setting, the human's):
- closed: the verifier closes the loop; a keep moves the best at once (the default);
- approve-keeps: a keep verdict becomes `pending_approval`; the change waits on its own branch
  `loopwright-pending/<tag>/<id>`, the best does not move, and the agent keeps working from the best;
- approve-runs: as approve-keeps, and each new experiment is also held before it runs, so a person
  sees the diff first.
(Git cannot hold both `loopwright/<tag>` and `loopwright/<tag>/pending/<id>`: one ref would have to be
a file and a directory. Hence `loopwright-pending/<tag>/<id>`.)

Decisions come from `loopwright approve/reject` (the human's CLI; the guard refuses it to the agent),
Slack buttons and Jira comments through the signed webhook. No MCP tool decides. Each decision is
recorded once, with who, through what and when; a second one (a double click) changes nothing.
Approvals not decided within the timeout are rejected, recorded as decided by `timeout`.

Applying an approved keep happens when nothing else is in flight (no experiment running or awaiting
its score): if the change sits on the current best, the best moves to it; if other keeps landed
meanwhile, the change is carried onto the new best (three-way merge of the editable files) and
re-measured there as a normal experiment, and only a keep verdict applies it (`stale` otherwise,
`conflict` when the merge fails; nothing moves). An agent's uncommitted edit survives either way.

Approvals bind to bytes, never to the working tree (which a process of the agent may rewrite at any
moment): an approved run or a re-measure is a commit built from the approved blobs with a private index,
the engine runs exactly that commit (`Approved`, passed explicitly), and before a keep or an approved
run is applied the source hash of its committed files must equal the approved one; a mismatch is
refused and recorded as a tamper event (`refuse_unbound`).
"""
from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from typing import Any, Optional

from mcp_server.loop import gitops
from mcp_server.loop.errors import LoopError
from mcp_server.loop.workspace import sinks_for

log = logging.getLogger("loopwright.approvals")

MODES = ("closed", "approve-keeps", "approve-runs")
DECISIONS = ("approved", "rejected", "expired")


class ApprovalError(RuntimeError):
    """A decision that cannot be made; the message says why and what to do."""


class Tampered(LoopError):
    """What is about to run or be kept is not what a person approved: refused, a tamper event recorded."""


@dataclasses.dataclass(frozen=True)
class Approved:
    """A person's approval as the engine gets it: an explicit argument, made only in a person's process
    (loop/decisions.py) or from a person's decision in the ledger (before_run), never an attribute or
    state the agent could set. `commit` is what runs, built from the approved blobs (never the working
    tree); `source_sha` the source hash its editable files must have (Engine.source_sha)."""
    approval_id: int
    commit: str
    source_sha: str
    by: str


def branch_prefix(tag: str) -> str:
    return f"loopwright-pending/{tag}/"


def describe(a: dict) -> str:
    """One line for a person: what waits, since when, decided by whom."""
    p = a["payload"]
    what = (f"keep of experiment #{a['experiment_id']} (val_bpb {p.get('val_bpb', float('nan')):.4f}, "
            f"{p.get('delta_vs_best', 0.0):+.4f} vs best)" if a["kind"] == "keep" else "run before it starts")
    left = ""
    if a["status"] == "pending" and a["expires_at"]:
        left = f", auto-reject in {max(0.0, (a['expires_at'] - time.time()) / 3600):.1f} h"
    dec = f" by {a['decided_by']} via {a['decided_via']}" if a["decided_by"] else ""
    return f"#{a['id']} {a['status']}{dec}: {what}: {a['description'][:70]} [{a['branch']}{left}]"


class Approvals:
    """The approvals of one open engine's workspace: what waits, holding a change for a person, recording a
    decision, applying an approved keep that sits on the best. `eng` is a loop/engine.py Engine (typed
    loosely: the engine imports this module, never the reverse)."""

    def __init__(self, eng: Any):
        self.eng = eng
        self.ws = eng.ws
        self.ledger = eng.ledger

    # -- reading -----------------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self.ws.cfg.campaign.autonomy

    def waiting(self, campaign_id: int) -> list[dict]:
        """Approvals that wait on a person (pending) or on a quiet moment to be applied (approved)."""
        return self.ledger.approvals(campaign_id, statuses=("pending", "approved"))

    def report_section(self, campaign_id: int) -> list[str]:
        """For report.md: every approval, decided or waiting, with who decided, through what and when."""
        rows = self.ledger.approvals(campaign_id)
        if not rows:
            return []
        out = ["## Approvals (autonomy slider)", "", "| # | kind | change | status | decided by | via | when | outcome |",
               "|---|---|---|---|---|---|---|---|"]
        for a in rows:
            what = (f"#{a['experiment_id']} {a['description']}" if a["kind"] == "keep" else a["branch"] or "")
            what = what.replace("|", "\\|").replace("\n", " ")[:80]
            when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(a["decided_at"])) if a["decided_at"] else ""
            outcome = (a["outcome"] or a["decision_note"] or "").replace("|", "\\|").replace("\n", " ")[:100]
            out.append(f"| {a['id']} | {a['kind']} | {what} | {a['status']} | {a['decided_by'] or ''} | "
                       f"{a['decided_via'] or ''} | {when} | {outcome} |")
        waiting = sum(a["status"] in ("pending", "approved") for a in rows)
        out += ["", f"{waiting} waiting." if waiting else "Nothing waits.", ""]
        return out

    def blocks_agent(self, campaign_id: int) -> Optional[str]:
        """Why everything waits on a person (the agent may stop), or None while it has work to do."""
        ledger = self.ledger
        pending = ledger.approvals(campaign_id, statuses=("pending",))
        runs = [a for a in pending if a["kind"] == "run"]
        keeps = [a for a in pending if a["kind"] == "keep"]
        approved_runs = ledger.approvals(campaign_id, statuses=("approved",), kind="run")
        if runs and not approved_runs:
            return (f"{len(runs)} run(s) wait for a person's approval before they start "
                    f"(#{', #'.join(str(a['id']) for a in runs)})")
        limit = self.ws.cfg.campaign.max_waiting
        if len(keeps) >= limit:
            return (f"{len(keeps)} kept changes wait for a person's approval "
                    f"(#{', #'.join(str(a['id']) for a in keeps)}; max_waiting = {limit})")
        return None

    def editable_bytes(self) -> dict[str, Optional[bytes]]:
        """The editable files as they are in the working tree now (None: absent)."""
        root = self.ws.root
        return {rel: ((root / rel).read_bytes() if (root / rel).is_file() else None) for rel in self.ws.cfg.paths.editable}

    # -- binding to bytes ------------------------------------------------------------------------------
    def refuse_unbound(self, c: dict, approved: Approved, commit: str, when: str, recorded: Optional[str] = None) -> None:
        """Raise Tampered (after recording a tamper event and settling the approval as refused) unless `commit`
        is the approved commit and its editable files -- every git object re-hashed -- and the source hash
        recorded for it (`recorded`) all equal the approved source hash."""
        problems = []
        if commit != approved.commit:
            problems.append(f"commit {commit[:10]} is not the approved {approved.commit[:10]}")
        try:
            actual: Optional[str] = self.eng.source_sha(commit)
        except gitops.GitError as e:
            actual = None
            problems.append(str(e))
        if actual is not None and actual != approved.source_sha:
            problems.append(f"its files hash to {actual[:12]}, not to the approved {approved.source_sha[:12]}")
        if recorded is not None and recorded != approved.source_sha:
            problems.append(f"its recorded source hash {recorded[:12]} is not the approved {approved.source_sha[:12]}")
        if not problems:
            return
        detail = "; ".join(problems)
        self.ledger.add_event(c["id"], "tamper", {
            "files": list(self.ws.cfg.paths.editable), "when": when, "approval_id": approved.approval_id,
            "commit": commit, "detail": detail, "action": ["refused: nothing was run or kept"]}, sinks_for(self.ws.cfg))
        self.ledger.settle_approval(approved.approval_id, "stale", f"refused {when}: {detail} (tamper event recorded)")
        raise Tampered(f"approval #{approved.approval_id} ({when}): what would run or be kept is not what was "
                       f"approved: {detail}. Refused: nothing was run or kept, and a tamper event was recorded.")

    def _keep_binding(self, a: dict) -> Approved:
        """The approved keep as bytes: its commit and the source hash recorded when it was measured."""
        exp = self.ledger.experiment(a["experiment_id"]) if a["experiment_id"] else None
        sha = a["source_sha"] or (exp and exp["source_sha"]) or self.eng.source_sha(a["commit_sha"])
        return Approved(a["id"], a["commit_sha"], sha, a["decided_by"] or "")

    def _start_approved_run(self, c: dict, a: dict) -> Approved:
        """An approved run, as the commit that runs: the approved commit itself while it sits on the best, else
        a commit of its editable files on the best (private index). Checked against the approval, then settled."""
        ws = self.ws
        bound = Approved(a["id"], a["commit_sha"], a["source_sha"] or self.eng.source_sha(a["commit_sha"]), a["decided_by"] or "")
        if a["base_commit"] != c["best_commit"]:
            try:
                files = self.eng.files_at(a["commit_sha"], verified=True)
            except gitops.GitError:
                pass       # an overwritten object: refused just below
            else:
                bound = dataclasses.replace(bound, commit=gitops.commit_files(ws.root, c["best_commit"], files,
                                                                        f"approved run #{a['id']}"))
        self.refuse_unbound(c, bound, bound.commit, "before an approved run")
        self.ledger.settle_approval(a["id"], "ran", f"started by run_experiment as commit {bound.commit[:10]}")
        return bound

    # -- holding ---------------------------------------------------------------------------------------
    def _expires(self, kind: str, now: float) -> Optional[float]:
        hours = self.ws.cfg.campaign.run_timeout_hours if kind == "run" else self.ws.cfg.campaign.keep_timeout_hours
        return None if hours is None else now + hours * 3600

    def hold_keep(self, c: dict, exp: dict, v, samples: list[float], best_mean: float, sig: float,
                  approved_by_person: Optional[Approved] = None, reset_tree: bool = True):
        """Called for a keep verdict (loop/outcome.py keep, from both loops). Under approve-keeps/-runs: the
        change waits as a pending approval and (verdict, next_step) for the agent come back; otherwise None
        (keep as usual: also for a person's re-measure, approved_by_person, whose bytes score() has checked).
        reset_tree=False (the asynchronous loop): the working tree holds the agent's next edit; it stays."""
        if self.mode == "closed" or approved_by_person is not None:
            return None
        ws, led = self.ws, self.ledger
        now = time.time()
        base = led.baseline_samples(c["id"])
        val = statistics.fmean(samples)
        test = [r["test_bpb"] for r in [exp] + led.confirm_runs(exp["id"]) if r["test_bpb"]]
        payload = {"experiment_id": exp["id"], "commit": exp["commit_sha"], "description": exp["description"],
                   "val_bpb": val, "previous_best": best_mean, "baseline": statistics.fmean(base) if base else None,
                   "delta_vs_best": val - best_mean,
                   "delta_vs_baseline": val - statistics.fmean(base) if base else None,
                   "sigma": sig, "threshold": v.threshold, "gain": v.gain, "tag": c["tag"],
                   "test_bpb": statistics.fmean(test) if test else None}
        aid = led.create_approval(c["id"], "keep", exp["commit_sha"], c["best_commit"], exp["description"],
                                  branch_prefix(c["tag"]), experiment_id=exp["id"], source_sha=exp["source_sha"],
                                  payload=payload, expires_at=self._expires("keep", now))
        row = led.approval(aid)
        gitops.set_branch(ws.root, row["branch"], exp["commit_sha"])
        reason = f"{v.reason}; kept by the verifier, waits for a person (approval #{aid})"
        for r in [exp] + led.confirm_runs(exp["id"]):
            led.update_experiment(r["id"], verdict="pending_approval", verdict_reason=reason)
        if reset_tree:
            gitops.reset_to(ws.root, c["best_commit"])
        led.add_event(c["id"], "approval_requested", {**payload, "approval_id": aid, "kind": "keep",
                                                      "branch": row["branch"], "expires_at": row["expires_at"]},
                      sinks_for(ws.cfg))
        why = self.blocks_agent(c["id"])
        nxt = (f"Kept by the verifier, but autonomy is {self.mode}: the change waits for a person as approval #{aid} "
               f"(branch {row['branch']}). The best did not move and train.py is back at the best version. Do not "
               "wait for the decision: note what worked, then try the next idea from the current best.")
        if why:
            nxt += f" {why}: you may stop now; the loop resumes once a person decides."
        return dataclasses.replace(v, kind="pending_approval", reason=reason), nxt

    def before_run(self, c: dict, confirm_of: Optional[int], approved_by_person: Optional[Approved] = None):
        """Called by Engine.run_experiment() under its lock, before anything runs. Expires overdue approvals;
        a person's run (approved_by_person) comes back as it is, to run exactly its commit. Otherwise applies
        approved keeps that sit on the best, and under approve-runs holds a new change until a person approves
        it (returns the ExperimentResult for the agent) or returns the approved run to start (an Approved: the
        engine runs its commit, not the working tree); else None (run the working tree as usual)."""
        led, ws = self.ledger, self.ws
        if approved_by_person is not None:
            self.expire_due()
            return approved_by_person
        c = self.apply_ready(c)
        if self.mode != "approve-runs" or confirm_of is not None:
            return None
        src, best_src = self.eng.editable_source(), self.eng.committed_source(c["best_commit"])
        approved = led.approvals(c["id"], statuses=("approved",), kind="run")
        if src == best_src:   # (also the first call: the baseline is the pinned code, it needs no person)
            if approved and led.baseline_samples(c["id"]):   # train.py at the best: run the oldest approved change
                return self._start_approved_run(c, approved[0])
            return None
        sha = self.eng.text_sha(src)
        for a in approved:
            if a["source_sha"] == sha:    # the approved change is in the tree: its commit runs, not the tree
                return self._start_approved_run(c, a)
        from mcp_server.loop.models import ExperimentResult

        same = [a for a in led.approvals(c["id"], statuses=("pending",), kind="run") if a["source_sha"] == sha]
        if same:
            a = same[0]
        else:
            # read once: the person is shown, and approves, exactly the commit of these bytes
            commit = gitops.commit_files(ws.root, c["best_commit"], self.editable_bytes(), "held for approval")
            diff = gitops.diff_text(ws.root, c["best_commit"], commit, ws.cfg.paths.editable)
            now = time.time()
            aid = led.create_approval(c["id"], "run", commit, c["best_commit"], "(run held for approval)",
                                      branch_prefix(c["tag"]), source_sha=self.eng.source_sha(commit),
                                      payload={"diff": diff[:20000]}, expires_at=self._expires("run", now))
            a = led.approval(aid)
            gitops.set_branch(ws.root, a["branch"], commit)
            led.add_event(c["id"], "approval_requested", {"approval_id": aid, "kind": "run", "tag": c["tag"],
                                                          "branch": a["branch"], "diff": diff[:2500],
                                                          "expires_at": a["expires_at"]}, sinks_for(ws.cfg))
        gitops.reset_to(ws.root, c["best_commit"])
        best, _ = self.eng.best(c)
        return ExperimentResult(
            experiment_id=None, approval_id=a["id"], status="pending_approval", best_val_bpb=best,
            commit=a["commit_sha"][:10],
            next_step=(f"Autonomy is approve-runs: a person sees each change before it runs. This one waits as "
                       f"approval #{a['id']} (saved on branch {a['branch']}); train.py is back at the best. Nothing "
                       "ran. You may stop now: once it is approved, run_experiment with train.py unchanged runs it."))

    def apply_ready(self, c: dict) -> dict:
        """Before new work (run_experiment, submit_experiment; the caller holds the engine lock): expire
        overdue approvals and apply an approved keep that sits on the best (the best moves to it, an agent's
        uncommitted edit is carried over). Returns the campaign as it is now."""
        self.expire_due()
        ready = [a for a in self.ledger.approvals(c["id"], statuses=("approved",), kind="keep")
                 if a["base_commit"] == c["best_commit"]]
        if ready and gitops.head_sha(self.ws.root) == c["best_commit"]:   # git only when something is to be applied
            try:
                self.move_best(c, ready[0])
            except Tampered:
                pass       # refused and recorded; the agent's own work goes on
            c = self.ledger.recorded_campaign(c["id"])
        return c

    # -- deciding ----------------------------------------------------------------------------------------
    def close_undone(self, a: dict, why: str) -> None:
        """A rejected or expired keep: its experiment is discarded, with the decision as the reason."""
        if a["kind"] == "keep" and a["experiment_id"]:
            for r in [self.ledger.experiment(a["experiment_id"])] + self.ledger.confirm_runs(a["experiment_id"]):
                if r and r["verdict"] == "pending_approval":
                    self.ledger.update_experiment(r["id"], verdict="discard", verdict_reason=why)

    def record_decided(self, a: dict) -> None:
        self.ledger.add_event(a["campaign_id"], "approval_decided", {
            "approval_id": a["id"], "kind": a["kind"], "decision": a["status"], "by": a["decided_by"],
            "via": a["decided_via"], "at": a["decided_at"], "note": a["decision_note"],
            "description": a["description"], "experiment_id": a["experiment_id"]}, sinks_for(self.ws.cfg))

    def expire_due(self, now: Optional[float] = None) -> list[int]:
        """Reject what waited past its timeout (decided by 'timeout', recorded like any decision)."""
        now = time.time() if now is None else now
        done = []
        for aid in self.ledger.expired_approvals(now):
            if self.ledger.decide_approval(aid, "expired", "timeout", "timeout", "no decision before the timeout", at=now):
                a = self.ledger.approval(aid)
                self.close_undone(a, f"approval #{aid} expired: no decision before the timeout")
                self.record_decided(a)
                done.append(aid)
        return done

    def decide(self, approval_id: int, approve: bool, who: str, via: str, note: Optional[str] = None,
               now: Optional[float] = None) -> tuple[dict, bool]:
        """Record a person's decision, once (a second one, a double click, changes nothing). Returns (the
        approval row, whether this call decided it)."""
        who = (who or "").strip()
        if not who:
            raise ApprovalError("a decision needs a name: who decides")
        self.expire_due(now)
        a = self.ledger.approval(int(approval_id))
        if a is None:
            raise ApprovalError(f"there is no approval #{approval_id}; `loopwright status` lists what waits")
        decided = self.ledger.decide_approval(a["id"], "approved" if approve else "rejected", who, via, note, at=now)
        a = self.ledger.approval(a["id"])
        if decided:
            if not approve:
                self.close_undone(a, f"rejected by {who} via {via}" + (f": {note}" if note else ""))
            self.record_decided(a)
        return a, decided

    # -- applying ------------------------------------------------------------------------------------------
    def restore_edits(self, saved: dict, old_best: str, new_best: str) -> list[str]:
        """Put an agent's uncommitted edit (made on old_best) back on top of new_best."""
        ws, notes = self.ws, []
        for rel, mine in saved.items():
            base = gitops.blob_or_none(ws.root, old_best, rel)
            if mine == base:
                continue     # not edited: the tree already shows the new best
            theirs = gitops.blob_or_none(ws.root, new_best, rel)
            if mine is None or base is None or theirs is None:
                merged, clean = mine, False
            else:
                merged, conflicted = gitops.merge_file(base, mine, theirs)
                clean = not conflicted
            if not clean:
                merged = mine
                notes.append(f"{rel}: the agent's uncommitted edit conflicts with the newly applied best; kept as it was")
            if merged is None:
                (ws.root / rel).unlink(missing_ok=True)
            else:
                (ws.root / rel).write_bytes(merged)
        return notes

    def move_best(self, c: dict, a: dict) -> None:
        """Fast path (caller holds the engine lock, HEAD at the best): the approved change sits on the best.
        Tampered (the approval refused and closed) unless its commit holds the bytes that were measured."""
        ws, led = self.ws, self.ledger
        exp = led.experiment(a["experiment_id"])
        try:
            self.refuse_unbound(c, self._keep_binding(a), a["commit_sha"], "before an approved keep",
                           recorded=exp["source_sha"] if exp else None)
        except Tampered as e:
            self.close_undone(a, str(e))
            raise
        saved, old = self.editable_bytes(), c["best_commit"]
        gitops.reset_to(ws.root, a["commit_sha"])
        led.set_best(c["id"], a["commit_sha"], a["experiment_id"])
        for r in [led.experiment(a["experiment_id"])] + led.confirm_runs(a["experiment_id"]):
            led.update_experiment(r["id"], verdict="keep",
                                  verdict_reason=f"approved by {a['decided_by']} via {a['decided_via']} (#{a['id']})")
        notes = self.restore_edits(saved, old, a["commit_sha"])
        led.settle_approval(a["id"], "applied", "; ".join(["the best moved to the approved change"] + notes))
        led.add_event(c["id"], "keep", {**a["payload"], "approval_id": a["id"], "approved_by": a["decided_by"],
                                        "plot_path": str(ws.reports_dir / "progress.png")}, sinks_for(ws.cfg))
