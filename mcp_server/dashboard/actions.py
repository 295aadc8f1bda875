"""The one thing the dashboard changes: a person's decision on a waiting change.

It goes through loop/decisions.py exactly as Slack, Jira and `loopwright approve` do: the decision is
recorded once (who, via "dashboard", when, the note) with its approval_decided event, and an approved keep is
applied from the approved commit's bytes (re-measured on the new best when other keeps landed meanwhile), in
a background thread: a re-measure takes minutes and the page must answer now.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Optional

from mcp_server.loop import approvals, decisions

log = logging.getLogger("loopwright.dashboard")
VIA = "dashboard"


@dataclass
class Decision:
    ok: bool
    message: str
    status: Optional[str] = None


class Appliers:
    """The background threads applying approved keeps (tests join them; shutdown does not wait)."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.lines: list[str] = []

    def start(self, root) -> None:
        def run() -> None:
            try:
                for line in decisions.apply_approved(root):
                    log.info("approval: %s", line)
                    self.lines.append(line)
            except Exception:
                log.exception("applying approved changes failed; `loopwright approve --apply` retries")
        t = threading.Thread(target=run, name="loopwright-dashboard-apply", daemon=True)
        t.start()
        self.threads.append(t)

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout)


def decide(root, approval_id: int, approve: bool, who: str, note: str, appliers: Appliers) -> Decision:
    note = (note or "").strip()
    if not approve and not note:
        return Decision(False, "a rejection needs a reason (it is recorded with the decision)")
    try:
        a, decided = decisions.decide(root, approval_id, approve, who, VIA, note or None)
    except approvals.ApprovalError as e:
        return Decision(False, str(e))
    if not decided:
        return Decision(False, f"approval #{a['id']} was already decided: {a['status']} by {a['decided_by']} via "
                               f"{a['decided_via']}; nothing changed", a["status"])
    if approve:
        appliers.start(root)
    verb = "approved" if approve else "rejected"
    return Decision(True, f"approval #{a['id']} {verb} by {who}" + ("; applying it now" if approve else ""),
                    a["status"])
