"""`loopwright approve ID`, `loopwright reject ID --why ...`: the person's side of the autonomy slider.

The CLI is the human's: the guard refuses these commands to the agent, and no MCP tool decides.
A decision is recorded once (a second one on the same approval changes nothing and says who decided);
an approved keep is then applied, re-measured first when other keeps landed meanwhile.
"""
from __future__ import annotations

import getpass
import os
import sys
from typing import Optional


def _who(args) -> str:
    return args.by or os.environ.get("LOOPWRIGHT_USER") or getpass.getuser()


def _root(args):
    from mcp_server.loop.workspace import Workspace

    return Workspace.find(args.workspace).root


def approve_args(sp) -> None:
    sp.add_argument("approval_id", nargs="?", type=int, help="the approval (`loopwright status` lists them)")
    sp.add_argument("--by", default=None, help="who decides (default: $LOOPWRIGHT_USER or your login name)")
    sp.add_argument("--no-apply", action="store_true", help="record the decision only; apply later")
    sp.add_argument("--apply", action="store_true", help="(without an ID) apply what was approved but not yet applied")


def approve(args) -> int:
    from mcp_server.loop import decisions

    root = _root(args)
    if args.approval_id is None:
        if not args.apply:
            print("loopwright approve: name the approval (`loopwright approve ID`), or pass --apply to apply "
                  "what was approved already; `loopwright status` lists what waits", file=sys.stderr)
            return 2
    else:
        a, status = _decide(root, args, approve=True)
        if a is None:
            return status
        print(f"approval #{a['id']} approved by {a['decided_by']}")
        if a["kind"] == "run":
            print(f"the change on {a['branch']} runs at the agent's next run_experiment (train.py at the best)")
        if args.no_apply:
            return 0
    lines = decisions.apply_approved(
        root, on_progress=lambda s, loss, e, r: print(f"re-measure: step {s} loss {loss:.4f} {r:.0f}s left",
                                                      file=sys.stderr))
    for line in lines:
        print(line)
    if not lines and args.approval_id is None:
        print("nothing to apply: no approved change waits to be applied (`loopwright status` lists what waits)")
    _deliver(root)
    return 0


def reject_args(sp) -> None:
    sp.add_argument("approval_id", type=int)
    sp.add_argument("--why", required=True, help="the reason, recorded with the decision")
    sp.add_argument("--by", default=None, help="who decides (default: $LOOPWRIGHT_USER or your login name)")


def reject(args) -> int:

    root = _root(args)
    if not args.why.strip():
        print("loopwright reject: --why needs a reason (it is recorded with the decision)", file=sys.stderr)
        return 2
    a, status = _decide(root, args, approve=False, note=args.why.strip())
    if a is None:
        return status
    print(f"approval #{a['id']} rejected by {a['decided_by']}: {a['decision_note']}")
    _deliver(root)
    return 0


def _decide(root, args, approve: bool, note: Optional[str] = None) -> tuple[Optional[dict], int]:
    """Record the person's decision: (the approval, 0), or (None, exit status) when nothing was decided."""
    from mcp_server.loop import approvals, decisions

    extra = () if note is None else (note,)
    try:
        a, decided = decisions.decide(root, args.approval_id, approve, _who(args), "cli", *extra)
    except approvals.ApprovalError as e:
        print(f"loopwright {'approve' if approve else 'reject'}: {e}", file=sys.stderr)
        return None, 2
    if not decided:
        print(f"approval #{a['id']} was already decided: {a['status']} by {a['decided_by']} via "
              f"{a['decided_via']}; nothing changed")
        return None, 1
    return a, 0


def _deliver(root) -> None:
    try:
        from mcp_server.cli.common import deliver_events

        deliver_events(root, wait_s=20)
    except Exception:  # noqa: BLE001 - the outbox retries; the decision is recorded
        pass


def waiting_lines(eng) -> list[str]:
    """For `loopwright status`: what waits on a person (or on a quiet moment to be applied)."""
    from mcp_server.loop import approvals

    ap = approvals.Approvals(eng)
    ap.expire_due()
    return [approvals.describe(a) for a in ap.waiting(eng.campaign["id"])]
