"""Slack Block Kit for the autonomy slider: the keep (or run) that waits, with Approve / Reject buttons,
and the same message once decided (updated in place with chat.update, buttons removed)."""
from __future__ import annotations

import time
from typing import Optional

from mcp_server.notify.fmt import num

APPROVE, REJECT = "loopwright_approve", "loopwright_reject"
ACTIONS_BLOCK = "loopwright_approval"
MARKS = {"approved": ":white_check_mark: Approved", "rejected": ":x: Rejected", "expired": ":hourglass: Expired"}


def _esc(text) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code(text) -> str:
    """Text for inside a ``` block: a ``` in it would close the block (a zero-width space breaks it)."""
    return _esc(text).replace("```", "`\u200b``")


def button_value(uid: str, approval_id: int) -> str:
    """Names the ledger and the approval, so a receiver serving another workspace ignores the click."""
    return f"{uid}:{approval_id}"


def parse_value(value: str) -> tuple[str, int]:
    uid, _, aid = (value or "").rpartition(":")
    return uid, int(aid)


def actions(uid: str, approval_id: int) -> dict:
    v = button_value(uid, approval_id)
    return {"type": "actions", "block_id": ACTIONS_BLOCK, "elements": [
        {"type": "button", "action_id": APPROVE, "style": "primary", "value": v,
         "text": {"type": "plain_text", "text": "Approve"}},
        {"type": "button", "action_id": REJECT, "style": "danger", "value": v,
         "text": {"type": "plain_text", "text": "Reject"}}]}


def render_request(p: dict, tag: str, uid: str, keep_blocks) -> tuple[str, list[dict]]:
    """The keep message (keep_blocks renders it) with a waiting header and the buttons; or a run's diff."""
    aid = p.get("approval_id", "?")
    if p.get("kind") == "keep":
        _, blocks = keep_blocks(p, tag)
        title = f"Awaiting approval #{aid}: val_bpb {num(p.get('val_bpb'))} ({num(p.get('delta_vs_best'), '+.4f')}) · {tag}"
        blocks[0] = {"type": "header", "text": {"type": "plain_text", "text": title[:150], "emoji": True}}
    else:
        title = f"Run awaiting approval #{aid} · {tag}"
        diff = str(p.get("diff") or "")[:2500]
        blocks = [{"type": "header", "text": {"type": "plain_text", "text": title[:150], "emoji": True}},
                  {"type": "section", "text": {"type": "mrkdwn", "text": f"```{_code(diff) or '(empty diff)'}```"}}]
    until = p.get("expires_at")
    note = f"branch `{_esc(p.get('branch', '?'))}`" + (
        f" · rejected automatically at <!date^{int(until)}^{{date_short_pretty}} {{time}}|{time.ctime(until)}>"
        if until else "")
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": note}]})
    blocks.append(actions(uid, int(aid) if str(aid).isdigit() else 0))
    return title, blocks


def decided_blocks(blocks: Optional[list], decision: str, by: str, at: Optional[float],
                   note: Optional[str] = None) -> tuple[str, list[dict]]:
    """The request's blocks without the buttons, plus who decided and when."""
    kept = [b for b in (blocks or []) if b.get("type") != "actions"]
    who = f"<@{by[len('slack:'):]}>" if by.startswith("slack:") else _esc(by)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at or time.time()))
    line = f"{MARKS.get(decision, decision)} by {who} at {when}" + (f": {_esc(note)}" if note else "")
    kept.append({"type": "section", "block_id": "loopwright_decision", "text": {"type": "mrkdwn", "text": line}})
    return f"{MARKS.get(decision, decision)} by {by}", kept
