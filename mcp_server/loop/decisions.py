"""A person's decisions on waiting changes: record them, and apply approved keeps.

These open the engine (the approvals module below it only records and holds), so they sit above both:
the CLI and the webhook call them; no MCP tool does. What a person approved reaches the engine as an
explicit `Approved` (the commit to run, built from the approved blobs, and its source hash), never as
the working tree, which a process of the agent may rewrite while the re-measure runs.
"""
from __future__ import annotations

from typing import Optional

from mcp_server.loop import gitops
from mcp_server.loop.approvals import ApprovalError, Approvals, Approved, Tampered
from mcp_server.loop.engine import Busy, Engine, LoopError

__all__ = ["ApprovalError", "apply_approved", "decide"]


def decide(root, approval_id: int, approve: bool, who: str, via: str, note: Optional[str] = None,
           now: Optional[float] = None) -> tuple[dict, bool]:
    """Record a person's decision, once. Returns (the approval row, whether this call decided it)."""
    with Engine(root) as eng:
        return Approvals(eng).decide(approval_id, approve, who, via, note, now)


def apply_approved(root, on_progress=None, max_confirms: int = 3) -> list[str]:
    """Apply every approved keep that can be applied now (the person's process: the CLI or the webhook).
    Returns what happened, one line per approval; an approval that cannot be applied yet stays approved."""
    out = []
    with Engine.open_for_writing(root) as eng:   # it moves the best and runs re-measures
        ap = Approvals(eng)
        for a in eng.ledger.approvals(statuses=("approved",), kind="keep"):
            c = eng.ledger.recorded_campaign(a["campaign_id"])   # an approval's campaign is in the ledger
            try:
                if gitops.current_branch(eng.ws.root) != c["branch"]:
                    out.append(f"#{a['id']}: deferred: the workspace is not on {c['branch']}")
                    continue
                if a["base_commit"] == c["best_commit"]:
                    with eng.exclusive():
                        if gitops.head_sha(eng.ws.root) != c["best_commit"]:
                            out.append(f"#{a['id']}: deferred: an experiment awaits its score; applied at the "
                                       "next run_experiment or `loopwright approve --apply`")
                            continue
                        ap.move_best(c, a)
                    out.append(f"#{a['id']}: applied: the best is now {a['commit_sha'][:10]}")
                else:
                    out.append(_remeasure(eng, ap, c, a, on_progress, max_confirms))
            except Tampered as e:
                out.append(f"#{a['id']}: refused: {e}")
            except Busy:
                out.append(f"#{a['id']}: deferred: an experiment is running; applied at the next run_experiment "
                           "or `loopwright approve --apply`")
            except LoopError as e:
                out.append(f"#{a['id']}: deferred: {e}")
    return out


def _remeasure(eng: Engine, ap: Approvals, c: dict, a: dict, on_progress, max_confirms: int) -> str:
    """Carry an approved change onto the new best and measure it there as a normal experiment."""
    ws, led = eng.ws, eng.ledger
    if gitops.head_sha(ws.root) != c["best_commit"]:
        return f"#{a['id']}: deferred: an experiment awaits its score"
    files, conflicts = {}, []
    for rel in ws.cfg.paths.editable:
        base, mine, theirs = (gitops.blob_or_none(ws.root, a["base_commit"], rel),
                              gitops.blob_or_none(ws.root, a["commit_sha"], rel),
                              gitops.blob_or_none(ws.root, c["best_commit"], rel))
        if mine == base:
            files[rel] = theirs
            continue
        if base is None or mine is None or theirs is None:   # missing from one of the versions: no 3-way merge
            conflicts.append(rel)
            continue
        merged, conflicted = gitops.merge_file(base, theirs, mine)
        files[rel] = merged
        if conflicted:
            conflicts.append(rel)
    if conflicts:
        led.settle_approval(a["id"], "conflict", f"does not merge onto the new best {c['best_commit'][:10]}: "
                                                 f"{', '.join(conflicts)}")
        ap.close_undone(a, f"approved (#{a['id']}) but it conflicts with the newer best")
        return f"#{a['id']}: conflict: the change does not merge onto the new best ({', '.join(conflicts)}); nothing moved"
    saved, old_best = ap.editable_bytes(), c["best_commit"]
    # the candidate is a commit of the merged bytes (private index): exactly it runs and can be kept
    commit = gitops.commit_files(ws.root, c["best_commit"], files, f"re-measure of approved #{a['id']} on the new best")
    bound = Approved(a["id"], commit, eng.text_sha(eng.source_of(files)), a["decided_by"] or "")
    try:
        res = eng.run_experiment(f"re-measure of approved #{a['id']} on the new best: {a['description']}"[:300],
                                 hypothesis=f"approved by {a['decided_by']}; was measured on {a['base_commit'][:10]}",
                                 on_progress=on_progress, approved_by_person=bound)
        if res.status != "ok":
            led.settle_approval(a["id"], "stale", f"the re-measure #{res.experiment_id} {res.status}: {res.reason}",
                                experiment_id=None)
            ap.close_undone(a, f"approved (#{a['id']}); its re-measure on the new best failed")
            return f"#{a['id']}: stale: the re-measure on the new best {res.status}"
        eid = res.experiment_id
        s = eng.score(eid, approved_by_person=bound)
        for _ in range(max_confirms):
            if s.verdict != "retest":
                break
            eng.run_experiment("confirm", confirm_of=eid, on_progress=on_progress, approved_by_person=bound)
            s = eng.score(eid, approved_by_person=bound)
        if s.verdict == "keep":
            led.settle_approval(a["id"], "applied", f"re-measured as #{eid} on the new best: gain {s.gain:.4f} "
                                                    f"(bar {s.threshold:.4f}); kept")
            ap.close_undone(a, f"approved (#{a['id']}); superseded by its re-measure #{eid}, kept")
            return f"#{a['id']}: applied after a re-measure on the new best (#{eid}, gain {s.gain:.4f})"
        led.settle_approval(a["id"], "stale", f"re-measured as #{eid} on the new best: {s.verdict} ({s.reason})")
        ap.close_undone(a, f"approved (#{a['id']}); re-measured as #{eid} on the new best: {s.verdict}")
        return f"#{a['id']}: stale: re-measured on the new best (#{eid}) it is no longer a gain ({s.verdict})"
    except Tampered as e:    # refused and recorded (the approval settled) by the check of its bytes
        ap.close_undone(a, str(e))
        return f"#{a['id']}: refused: {e}"
    finally:
        # whatever happened (a retest left open, an error), the tree ends at the best with the agent's edit
        c2 = led.recorded_campaign(c["id"])
        gitops.reset_to(ws.root, c2["best_commit"])
        ap.restore_edits(saved, old_best, c2["best_commit"])
