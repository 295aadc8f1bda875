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
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

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


def mode(ws) -> str:
    return getattr(ws.cfg.campaign, "autonomy", "closed") or "closed"


def branch_prefix(tag: str) -> str:
    return f"loopwright-pending/{tag}/"


# -- git helpers (plumbing only: the index and working tree of the agent are never touched) -----------
_GIT_ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_AUTHOR_NAME": "loopwright", "GIT_AUTHOR_EMAIL": "loopwright@localhost",
            "GIT_COMMITTER_NAME": "loopwright", "GIT_COMMITTER_EMAIL": "loopwright@localhost"}


def _git(root: Path, *args: str, env: Optional[dict] = None, data: Optional[bytes] = None,
         check: bool = True) -> subprocess.CompletedProcess:
    # no hooks, no fsmonitor, no user/system config, no GIT_DIR/GIT_INDEX_FILE of the caller: nothing the
    # agent planted runs, and a private index stays private
    return subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", *args],
                          cwd=root, env={**gitops.safe_env(), **_GIT_ENV, **(env or {})}, input=data,
                          capture_output=True, check=check)


def _set_branch(root: Path, branch: str, commit: str) -> None:
    _git(root, "update-ref", f"refs/heads/{branch}", commit)


def _blob(root: Path, commit: str, rel: str) -> Optional[bytes]:
    try:
        return gitops.blob_bytes(root, commit, rel)
    except gitops.GitError:
        return None


def _commit_files(root: Path, parent: str, files: dict[str, Optional[bytes]], message: str) -> str:
    """A commit with `parent` and the given editable files, made with a private index (never the working
    tree or the agent's index)."""
    with tempfile.TemporaryDirectory() as td:
        env = {"GIT_INDEX_FILE": os.path.join(td, "index")}
        _git(root, "read-tree", parent, env=env)
        for rel, data in files.items():
            if data is None:
                _git(root, "update-index", "--force-remove", rel, env=env)
                continue
            blob = _git(root, "hash-object", "-w", "--stdin", data=data).stdout.decode().strip()
            _git(root, "update-index", "--add", "--cacheinfo", f"100644,{blob},{rel}", env=env)
        tree = _git(root, "write-tree", env=env).stdout.decode().strip()
        return _git(root, "commit-tree", tree, "-p", parent, "-m", message).stdout.decode().strip()


def _merge3(root: Path, ours: bytes, base: bytes, theirs: bytes) -> tuple[bytes, bool]:
    """(merged, clean): `git merge-file` on the three versions of one file."""
    with tempfile.TemporaryDirectory() as td:
        paths = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            p = os.path.join(td, name)
            Path(p).write_bytes(data)
            paths.append(p)
        r = _git(root, "merge-file", "-p", *paths, check=False)
        return r.stdout, r.returncode == 0


# -- reading ---------------------------------------------------------------------------------------
def waiting(ledger, campaign_id: int) -> list[dict]:
    """Approvals that wait on a person (pending) or on a quiet moment to be applied (approved)."""
    return ledger.approvals(campaign_id, statuses=("pending", "approved"))


def describe(a: dict) -> str:
    p = a["payload"]
    what = (f"keep of experiment #{a['experiment_id']} (val_bpb {p.get('val_bpb', float('nan')):.4f}, "
            f"{p.get('delta_vs_best', 0.0):+.4f} vs best)" if a["kind"] == "keep" else "run before it starts")
    left = ""
    if a["status"] == "pending" and a["expires_at"]:
        left = f", auto-reject in {max(0.0, (a['expires_at'] - time.time()) / 3600):.1f} h"
    dec = f" by {a['decided_by']} via {a['decided_via']}" if a["decided_by"] else ""
    return f"#{a['id']} {a['status']}{dec}: {what}: {a['description'][:70]} [{a['branch']}{left}]"


def report_section(ledger, campaign_id: int) -> list[str]:
    """For report.md: every approval, decided or waiting, with who decided, through what and when."""
    rows = ledger.approvals(campaign_id)
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


def blocks_agent(ws, ledger, campaign_id: int) -> Optional[str]:
    """Why everything waits on a person (the agent may stop), or None while it has work to do."""
    pending = ledger.approvals(campaign_id, statuses=("pending",))
    runs = [a for a in pending if a["kind"] == "run"]
    keeps = [a for a in pending if a["kind"] == "keep"]
    approved_runs = ledger.approvals(campaign_id, statuses=("approved",), kind="run")
    if runs and not approved_runs:
        return (f"{len(runs)} run(s) wait for a person's approval before they start "
                f"(#{', #'.join(str(a['id']) for a in runs)})")
    limit = getattr(ws.cfg.campaign, "max_waiting", 3)
    if len(keeps) >= limit:
        return (f"{len(keeps)} kept changes wait for a person's approval (#{', #'.join(str(a['id']) for a in keeps)}; "
                f"max_waiting = {limit})")
    return None


# -- binding to bytes ------------------------------------------------------------------------------
def refuse_unbound(eng, c: dict, approved: Approved, commit: str, when: str, recorded: Optional[str] = None) -> None:
    """Raise Tampered (after recording a tamper event and settling the approval as refused) unless `commit`
    is the approved commit and its editable files -- every git object re-hashed -- and the source hash
    recorded for it (`recorded`) all equal the approved source hash."""
    problems = []
    if commit != approved.commit:
        problems.append(f"commit {commit[:10]} is not the approved {approved.commit[:10]}")
    try:
        actual: Optional[str] = eng.source_sha(commit)
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
    eng.ledger.add_event(c["id"], "tamper", {
        "files": list(eng.ws.cfg.paths.editable), "when": when, "approval_id": approved.approval_id,
        "commit": commit, "detail": detail, "action": ["refused: nothing was run or kept"]}, sinks_for(eng.ws.cfg))
    eng.ledger.settle_approval(approved.approval_id, "stale", f"refused {when}: {detail} (tamper event recorded)")
    raise Tampered(f"approval #{approved.approval_id} ({when}): what would run or be kept is not what was "
                   f"approved: {detail}. Refused: nothing was run or kept, and a tamper event was recorded.")


def _keep_binding(eng, a: dict) -> Approved:
    """The approved keep as bytes: its commit and the source hash recorded when it was measured."""
    exp = eng.ledger.experiment(a["experiment_id"]) if a["experiment_id"] else None
    sha = a["source_sha"] or (exp and exp["source_sha"]) or eng.source_sha(a["commit_sha"])
    return Approved(a["id"], a["commit_sha"], sha, a["decided_by"] or "")


def _start_approved_run(eng, c: dict, a: dict) -> Approved:
    """An approved run, as the commit that runs: the approved commit itself while it sits on the best, else
    a commit of its editable files on the best (private index). Checked against the approval, then settled."""
    ws = eng.ws
    bound = Approved(a["id"], a["commit_sha"], a["source_sha"] or eng.source_sha(a["commit_sha"]), a["decided_by"] or "")
    if a["base_commit"] != c["best_commit"]:
        try:
            files = eng._files_at(a["commit_sha"], verified=True)
        except gitops.GitError:
            pass       # an overwritten object: refused just below
        else:
            bound = dataclasses.replace(bound, commit=_commit_files(ws.root, c["best_commit"], files,
                                                                    f"approved run #{a['id']}"))
    refuse_unbound(eng, c, bound, bound.commit, "before an approved run")
    eng.ledger.settle_approval(a["id"], "ran", f"started by run_experiment as commit {bound.commit[:10]}")
    return bound


# -- holding ---------------------------------------------------------------------------------------
def _expires(ws, kind: str, now: float) -> Optional[float]:
    hours = getattr(ws.cfg.campaign, f"{kind}_timeout_hours", None)
    return None if hours is None else now + hours * 3600


def hold_keep(eng, c: dict, exp: dict, v, samples: list[float], best_mean: float, sig: float,
              approved_by_person: Optional[Approved] = None):
    """Called by Engine.score() for a keep verdict. Under approve-keeps/-runs: the change waits as a
    pending approval and (verdict, next_step) for the agent come back; otherwise None (keep as usual:
    also for a person's re-measure, approved_by_person, whose bytes score() has checked)."""
    if mode(eng.ws) == "closed" or approved_by_person is not None:
        return None
    ws, led = eng.ws, eng.ledger
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
                              payload=payload, expires_at=_expires(ws, "keep", now))
    row = led.approval(aid)
    _set_branch(ws.root, row["branch"], exp["commit_sha"])
    reason = f"{v.reason}; kept by the verifier, waits for a person (approval #{aid})"
    for r in [exp] + led.confirm_runs(exp["id"]):
        led.update_experiment(r["id"], verdict="pending_approval", verdict_reason=reason)
    gitops.reset_to(ws.root, c["best_commit"])
    led.add_event(c["id"], "approval_requested", {**payload, "approval_id": aid, "kind": "keep",
                                                  "branch": row["branch"], "expires_at": row["expires_at"]},
                  sinks_for(ws.cfg))
    why = blocks_agent(ws, led, c["id"])
    nxt = (f"Kept by the verifier, but autonomy is {mode(ws)}: the change waits for a person as approval #{aid} "
           f"(branch {row['branch']}). The best did not move and train.py is back at the best version. Do not "
           "wait for the decision: note what worked, then try the next idea from the current best.")
    if why:
        nxt += f" {why}: you may stop now; the loop resumes once a person decides."
    return dataclasses.replace(v, kind="pending_approval", reason=reason), nxt


def before_run(eng, c: dict, confirm_of: Optional[int], approved_by_person: Optional[Approved] = None):
    """Called by Engine.run_experiment() under its lock, before anything runs. Expires overdue approvals;
    a person's run (approved_by_person) comes back as it is, to run exactly its commit. Otherwise applies
    approved keeps that sit on the best, and under approve-runs holds a new change until a person approves
    it (returns the ExperimentResult for the agent) or returns the approved run to start (an Approved: the
    engine runs its commit, not the working tree); else None (run the working tree as usual)."""
    led, ws = eng.ledger, eng.ws
    expire_due(eng)
    if approved_by_person is not None:
        return approved_by_person
    ready = [a for a in led.approvals(c["id"], statuses=("approved",), kind="keep")
             if a["base_commit"] == c["best_commit"]]
    if ready and gitops.head_sha(ws.root) == c["best_commit"]:   # git only when something is to be applied
        try:
            _move_best(eng, c, ready[0])
        except Tampered:
            pass       # refused and recorded; the agent's own run goes on
        c = led.campaign(c["id"])
    if mode(ws) != "approve-runs" or confirm_of is not None:
        return None
    src, best_src = eng._editable_source(), eng._committed_source(c["best_commit"])
    approved = led.approvals(c["id"], statuses=("approved",), kind="run")
    if src == best_src:   # (also the first call: the baseline is the pinned code, it needs no person)
        if approved and led.baseline_samples(c["id"]):   # train.py at the best: run the oldest approved change
            return _start_approved_run(eng, c, approved[0])
        return None
    sha = eng._sha(src)
    for a in approved:
        if a["source_sha"] == sha:    # the approved change is in the tree: its commit runs, not the tree
            return _start_approved_run(eng, c, a)
    from mcp_server.loop.models import ExperimentResult

    same = [a for a in led.approvals(c["id"], statuses=("pending",), kind="run") if a["source_sha"] == sha]
    if same:
        a = same[0]
    else:
        # read once: the person is shown, and approves, exactly the commit of these bytes
        commit = _commit_files(ws.root, c["best_commit"], _editable_bytes(ws), "held for approval")
        diff = gitops.diff_text(ws.root, c["best_commit"], commit, ws.cfg.paths.editable)
        now = time.time()
        aid = led.create_approval(c["id"], "run", commit, c["best_commit"], "(run held for approval)",
                                  branch_prefix(c["tag"]), source_sha=eng.source_sha(commit),
                                  payload={"diff": diff[:20000]}, expires_at=_expires(ws, "run", now))
        a = led.approval(aid)
        _set_branch(ws.root, a["branch"], commit)
        led.add_event(c["id"], "approval_requested", {"approval_id": aid, "kind": "run", "tag": c["tag"],
                                                      "branch": a["branch"], "diff": diff[:2500],
                                                      "expires_at": a["expires_at"]}, sinks_for(ws.cfg))
    gitops.reset_to(ws.root, c["best_commit"])
    best, _ = eng.best(c)
    return ExperimentResult(
        experiment_id=None, approval_id=a["id"], status="pending_approval", best_val_bpb=best,
        commit=a["commit_sha"][:10],
        next_step=(f"Autonomy is approve-runs: a person sees each change before it runs. This one waits as "
                   f"approval #{a['id']} (saved on branch {a['branch']}); train.py is back at the best. Nothing "
                   "ran. You may stop now: once it is approved, run_experiment with train.py unchanged runs it."))


# -- deciding ----------------------------------------------------------------------------------------
def _close_undone(eng, a: dict, why: str) -> None:
    """A rejected or expired keep: its experiment is discarded, with the decision as the reason."""
    if a["kind"] == "keep" and a["experiment_id"]:
        for r in [eng.ledger.experiment(a["experiment_id"])] + eng.ledger.confirm_runs(a["experiment_id"]):
            if r and r["verdict"] == "pending_approval":
                eng.ledger.update_experiment(r["id"], verdict="discard", verdict_reason=why)


def _decided_event(eng, a: dict) -> None:
    eng.ledger.add_event(a["campaign_id"], "approval_decided", {
        "approval_id": a["id"], "kind": a["kind"], "decision": a["status"], "by": a["decided_by"],
        "via": a["decided_via"], "at": a["decided_at"], "note": a["decision_note"],
        "description": a["description"], "experiment_id": a["experiment_id"]}, sinks_for(eng.ws.cfg))


def expire_due(eng, now: Optional[float] = None) -> list[int]:
    """Reject what waited past its timeout (decided by 'timeout', recorded like any decision)."""
    now = time.time() if now is None else now
    done = []
    for aid in eng.ledger.expired_approvals(now):
        if eng.ledger.decide_approval(aid, "expired", "timeout", "timeout", "no decision before the timeout", at=now):
            a = eng.ledger.approval(aid)
            _close_undone(eng, a, f"approval #{aid} expired: no decision before the timeout")
            _decided_event(eng, a)
            done.append(aid)
    return done


# -- applying ------------------------------------------------------------------------------------------
def _editable_bytes(ws) -> dict[str, Optional[bytes]]:
    return {rel: ((ws.root / rel).read_bytes() if (ws.root / rel).is_file() else None) for rel in ws.cfg.paths.editable}


def _restore_edits(ws, saved: dict, old_best: str, new_best: str) -> list[str]:
    """Put an agent's uncommitted edit (made on old_best) back on top of new_best."""
    notes = []
    for rel, mine in saved.items():
        base = _blob(ws.root, old_best, rel)
        if mine == base:
            continue     # not edited: the tree already shows the new best
        theirs = _blob(ws.root, new_best, rel)
        if mine is None or base is None or theirs is None:
            merged, clean = mine, False
        else:
            merged, clean = _merge3(ws.root, mine, base, theirs)
        if not clean:
            merged = mine
            notes.append(f"{rel}: the agent's uncommitted edit conflicts with the newly applied best; kept as it was")
        if merged is None:
            (ws.root / rel).unlink(missing_ok=True)
        else:
            (ws.root / rel).write_bytes(merged)
    return notes


def _move_best(eng, c: dict, a: dict) -> None:
    """Fast path (caller holds the engine lock, HEAD at the best): the approved change sits on the best.
    Tampered (the approval refused and closed) unless its commit holds the bytes that were measured."""
    ws, led = eng.ws, eng.ledger
    exp = led.experiment(a["experiment_id"])
    try:
        refuse_unbound(eng, c, _keep_binding(eng, a), a["commit_sha"], "before an approved keep",
                       recorded=exp["source_sha"] if exp else None)
    except Tampered as e:
        _close_undone(eng, a, str(e))
        raise
    saved, old = _editable_bytes(ws), c["best_commit"]
    gitops.reset_to(ws.root, a["commit_sha"])
    led.set_best(c["id"], a["commit_sha"], a["experiment_id"])
    for r in [led.experiment(a["experiment_id"])] + led.confirm_runs(a["experiment_id"]):
        led.update_experiment(r["id"], verdict="keep",
                              verdict_reason=f"approved by {a['decided_by']} via {a['decided_via']} (#{a['id']})")
    notes = _restore_edits(ws, saved, old, a["commit_sha"])
    led.settle_approval(a["id"], "applied", "; ".join(["the best moved to the approved change"] + notes))
    led.add_event(c["id"], "keep", {**a["payload"], "approval_id": a["id"], "approved_by": a["decided_by"],
                                    "plot_path": str(ws.reports_dir / "progress.png")}, sinks_for(ws.cfg))
