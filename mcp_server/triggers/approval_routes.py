"""Approvals through the webhook receiver: Slack buttons (interactivity) and Jira comment commands.

Both arrive signed (the receiver verifies the signature, the timestamp window and replays before
anything here runs). Here: who may decide (allow-lists in [campaign]), which approval (the button's
value names this ledger; a Jira comment must be on the campaign's own issue), the decision (recorded
once: a double click decides once), the Slack message updated in place, and the approved change
applied in a background thread (a re-measure can take minutes; Slack wants a reply within 3 s).
"""
from __future__ import annotations

import json
import logging
import re
import threading
from typing import Mapping, Optional
from urllib.parse import parse_qs

from mcp_server.loop import approvals, decisions
from mcp_server.notify import approval_blocks
from mcp_server.notify.events import ledger_uid

log = logging.getLogger("loopwright.webhook.approvals")

JIRA_COMMAND = re.compile(r"^\s*/(?:loopwright\s+)?(approve|reject)\s+#?(\d+)\b\s*(.*)$", re.I | re.S)


class Outcome(dict):
    """What the route answers (JSON) and, for tests and logs, what it did."""


def _apply_in_background(root, threads: list) -> None:
    def run():
        try:
            for line in decisions.apply_approved(root):
                log.info("approval: %s", line)
        except Exception:
            log.exception("applying approved changes failed; `loopwright approve --apply` retries")
    t = threading.Thread(target=run, name="loopwright-apply-approval", daemon=True)
    t.start()
    threads.append(t)


def slack_interaction(root, cfg, ledger, body: bytes, env: Mapping[str, str], threads: list) -> Outcome:
    """A verified Slack interactivity request (form-encoded `payload=` JSON, type block_actions)."""
    try:
        p = json.loads(parse_qs(body.decode("utf-8", "replace"))["payload"][0])
    except (KeyError, IndexError, ValueError):
        return Outcome(status="ignored", reason="not a Slack interaction payload (payload=<json>)")
    if not isinstance(p, dict) or p.get("type") != "block_actions" or not p.get("actions"):
        return Outcome(status="ignored", reason=f"interaction type {p.get('type') if isinstance(p, dict) else '?'}")
    action = p["actions"][0] or {}
    if action.get("action_id") not in (approval_blocks.APPROVE, approval_blocks.REJECT):
        return Outcome(status="ignored", reason=f"action {action.get('action_id')!r} is not loopwright's")
    try:
        uid, aid = approval_blocks.parse_value(str(action.get("value", "")))
    except ValueError:
        return Outcome(status="ignored", reason="malformed button value")
    if uid != ledger_uid(ledger):
        return Outcome(status="ignored", reason="the button belongs to another loopwright workspace")
    user = (p.get("user") or {}).get("id") or ""
    allowed = list(cfg.campaign.slack_approvers)
    if user not in allowed:
        log.warning("slack user %s tried to decide approval #%s but is not in [campaign] slack_approvers", user, aid)
        return Outcome(status="forbidden", approval_id=aid,
                       reason=f"Slack user {user or '?'} is not in [campaign] slack_approvers")
    approve = action["action_id"] == approval_blocks.APPROVE
    try:
        a, decided = decisions.decide(root, aid, approve, f"slack:{user}", "slack",
                                      None if approve else "rejected in Slack")
    except approvals.ApprovalError as e:
        return Outcome(status="ignored", reason=str(e))
    _update_message(cfg, p, a, env)
    if decided and approve:
        _apply_in_background(root, threads)
    return Outcome(status="decided" if decided else "already decided", approval_id=aid, decision=a["status"],
                   by=a["decided_by"])


def _update_message(cfg, p: dict, a: dict, env: Mapping[str, str]) -> None:
    """chat.update the clicked message with the decision (who, when); never fails the request."""
    token = env.get(cfg.slack.token_env) if cfg.slack else None
    channel = (p.get("channel") or {}).get("id")
    ts = (p.get("message") or {}).get("ts") or (p.get("container") or {}).get("message_ts")
    if not (token and channel and ts):
        log.warning("cannot update the Slack message of approval #%s (bot token, channel or ts missing)", a["id"])
        return
    from slack_sdk import WebClient

    decision = "approved" if a["status"] in ("approved", "applied", "stale", "conflict", "ran") else a["status"]
    text, blocks = approval_blocks.decided_blocks((p.get("message") or {}).get("blocks"), decision,
                                                  str(a["decided_by"]), a["decided_at"], a["decision_note"])
    try:
        kw = {"base_url": cfg.slack.base_url} if cfg.slack.base_url else {}
        WebClient(token=token, timeout=5, retry_handlers=[], **kw).chat_update(
            channel=channel, ts=ts, text=text, blocks=blocks)
    except Exception as e:  # noqa: BLE001 - the decision is recorded; the message is cosmetic
        log.warning("chat.update for approval #%s failed: %s", a["id"], type(e).__name__)


def jira_comment(root, cfg, ledger, payload: dict, threads: list) -> Optional[Outcome]:
    """`/approve 12` or `/reject 12 reason` in a comment on the campaign's Jira issue; None if the comment
    is no approval command (the receiver goes on with its other commands)."""
    comment = payload.get("comment") or {}
    m = JIRA_COMMAND.match(str(comment.get("body") or ""))
    if not m:
        return None
    verb, aid, why = m.group(1).lower(), int(m.group(2)), m.group(3).strip()
    a = ledger.approval(aid)
    if a is None:
        return Outcome(status="ignored", reason=f"there is no approval #{aid}")
    issue = str((payload.get("issue") or {}).get("key") or "")
    project = cfg.jira.project if cfg.jira else None
    expected = ledger.kv_get(f"jira.issue.{project}.{a['campaign_id']}") if project else None
    if not expected or issue != expected:
        return Outcome(status="ignored", reason=f"approval #{aid} is decided on its campaign's issue "
                                                f"({expected or 'none yet'}), not on {issue or '?'}")
    author = comment.get("author") or {}
    ids = {str(author.get(k)) for k in ("accountId", "name", "emailAddress") if author.get(k)}
    allowed = set(cfg.campaign.jira_approvers)
    if not ids & allowed:
        return Outcome(status="forbidden", approval_id=aid,
                       reason=f"Jira user {author.get('displayName') or '?'} is not in [campaign] jira_approvers")
    who = f"jira:{author.get('accountId') or author.get('name') or author.get('emailAddress')}"
    try:
        a, decided = decisions.decide(root, aid, verb == "approve", who, "jira", why or None)
    except approvals.ApprovalError as e:
        return Outcome(status="ignored", reason=str(e))
    if decided and verb == "approve":
        _apply_in_background(root, threads)
    return Outcome(status="decided" if decided else "already decided", approval_id=aid, decision=a["status"],
                   by=a["decided_by"])
