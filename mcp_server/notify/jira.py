"""Jira sink: one issue per campaign, a comment per kept improvement, a transition at the end.

Jira Cloud authenticates with basic_auth(email, API token), Server/DC with a
personal access token (token_auth); both come from environment variables named
in [jira]. The client never sleeps on retries (max_retries=0): the outbox
retries with backoff, so the loop is never held up.

Each step is idempotent:
- the campaign's issue key is kept in the ledger kv (`jira.issue.<project>.<campaign>`),
  so the issue is created once; an ambiguous create (a timeout) is resolved on
  the retry by searching recent issues for the marker in the description; two
  passes never create at once (the outbox has one row per sink in flight), and
  the first key recorded wins;
- every comment ends with a marker naming the event, checked before a retry posts;
- the transition is skipped when the issue is already in the target status.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Mapping, Optional

from mcp_server.notify.events import DeliveryError, Event, ledger_uid, redact
from mcp_server.notify.fmt import as_shown, join, keep_deltas, num

log = logging.getLogger("loopwright.notify.jira")

KINDS = frozenset({"campaign_start", "keep", "budget_spent", "campaign_end", "approval_requested"})
END_KINDS = ("budget_spent", "campaign_end")


def inert(text) -> str:
    """Agent-written text as a {noformat} block: Jira renders no link, mention, image or colour in it
    (a {noformat} inside it is removed, so it cannot close the block)."""
    clean = re.sub(r"\{noformat\}", "", str(text or ""), flags=re.IGNORECASE)
    return "{noformat}" + clean + "{noformat}"


def comment_text(kind: str, p: dict) -> str:
    if kind == "approval_requested":   # the autonomy slider: how to decide from this issue
        aid = p.get("approval_id", "?")
        what = (f"keep of experiment #{p.get('experiment_id', '?')}: val_bpb {num(p.get('val_bpb'), '.6f')} "
                f"({num(p.get('delta_vs_best'), '+.6f')} vs best)" if p.get("kind") == "keep" else "run (not started)")
        return (f"Approval #{aid} waits: {what}, branch {p.get('branch', '?')}\n"
                f"{inert(p.get('description'))}\n"
                f"Comment /approve {aid} or /reject {aid} <reason> (approvers only).")
    if kind == "keep":
        p = as_shown(p)
        d_best, d_base = keep_deltas(p)
        lines = [f"New best {p.get('metric') or 'val_bpb'} {num(p.get('val_bpb'), '.6f')} "
                 f"(experiment #{p.get('experiment_id', '?')}, "
                 f"commit {str(p.get('commit') or 'n/a')[:12]})",
                 f"- vs previous best: {num(d_best, '+.6f')} (was {num(p.get('previous_best'), '.6f')})",
                 f"- vs baseline: {num(d_base, '+.6f')} (baseline {num(p.get('baseline'), '.6f')})",
                 f"- noise: sigma {num(p.get('sigma'), '.5f')}, threshold {num(p.get('threshold'), '.5f')}",
                 f"- hidden test: test_bpb {num(p.get('test_bpb'), '.6f')}"
                 + (" -- DIVERGES from val: possible overfitting or leakage" if p.get("test_divergence") else ""),
                 "", inert(p.get("description")) if p.get("description") else "(no description)"]
        return "\n".join(lines)
    reasons = join(p.get("reasons"), "; ")
    return (f"Campaign {'budget spent' if kind == 'budget_spent' else 'ended'}"
            + (f": {reasons}" if reasons else "")
            + f"\nbest {num(p.get('best'), '.6f')}, baseline {num(p.get('baseline'), '.6f')}")


class JiraSink:
    name = "jira"
    kinds = KINDS

    def __init__(self, cfg, ledger, *, token: str, email: Optional[str] = None, timeout: float = 10,
                 max_retries: int = 0):
        self.cfg, self.ledger = cfg, ledger
        self._token, self._email = token, email
        self._timeout, self._max_retries = timeout, max_retries
        self._jira = None

    @classmethod
    def from_config(cls, cfg, ledger, env: Mapping[str, str]) -> tuple[Optional["JiraSink"], Optional[str]]:
        token = env.get(cfg.token_env)
        email = env.get(cfg.email_env) if cfg.auth == "cloud" else None
        needed = {cfg.token_env: token, **({cfg.email_env: email} if cfg.auth == "cloud" else {})}
        missing = [name for name, value in needed.items() if not value]
        if missing:
            return None, f"jira: ${' and $'.join(missing)} not set (deliveries stay pending until they are)"
        return cls(cfg, ledger, token=token or "", email=email), None   # token is set: checked above

    def wants(self, kind: str) -> bool:
        return kind in self.kinds

    # -- delivery ----------------------------------------------------------------
    def deliver(self, event: Event) -> Optional[str]:
        if event.campaign_id is None:
            return "skipped:no-campaign"
        try:
            key = self._ensure_issue(event)
            if event.kind == "campaign_start":
                return key
            ref = event.external_ref
            if not ref:
                ref = self._comment_once(key, event)
                event.checkpoint(ref)
            if event.kind in END_KINDS:
                self._transition_once(key)
            return ref
        except DeliveryError:
            raise
        except Exception as e:
            raise self._error(e) from None

    def _client(self):
        if self._jira is None:
            from jira import JIRA

            auth = ({"basic_auth": (self._email, self._token)} if self.cfg.auth == "cloud"
                    else {"token_auth": self._token})
            self._jira = JIRA(server=self.cfg.server, max_retries=self._max_retries, timeout=self._timeout, **auth)
        return self._jira

    def _marker(self, what: str) -> str:
        return f"[loopwright {ledger_uid(self.ledger)} {what}]"

    def _ensure_issue(self, event: Event) -> str:
        kv_key = f"jira.issue.{self.cfg.project}.{event.campaign_id}"
        key = self.ledger.kv_get(kv_key)
        if key:
            return key
        marker = self._marker(f"campaign {event.campaign_id}")
        pending = f"jira.creating.{self.cfg.project}.{event.campaign_id}"
        if self.ledger.kv_get(pending):   # an earlier create may have reached Jira
            key = self._find_issue(marker)
        if not key:
            self.ledger.kv_set(pending, "1")
            row = self.ledger.campaign(event.campaign_id) or {}
            tag = event.payload.get("tag") or row.get("tag") or str(event.campaign_id)
            fields = {"project": {"key": self.cfg.project}, "issuetype": {"name": self.cfg.issue_type},
                      "summary": f"loopwright campaign {tag}"[:250],
                      "description": (f"Research campaign {tag} run by loopwright (branch {row.get('branch', '?')}, "
                                      f"pinned commit {str(row.get('pinned_commit') or '?')[:12]}).\n"
                                      f"Kept improvements are added as comments.\n\n{marker}")}
            created = self._client().create_issue(fields=fields, prefetch=False).key
            # the first key recorded wins: should a second issue ever be made (a pass that outlived its
            # lease), every later comment still goes to one issue
            key = self.ledger.kv_setdefault(kv_key, created)
            if key != created:
                log.warning("Jira issue %s duplicates %s for campaign %s; comments go to %s (close %s)",
                            created, key, event.campaign_id, key, created)
            return key
        return self.ledger.kv_setdefault(kv_key, key)

    def _find_issue(self, marker: str) -> Optional[str]:
        jql = f'project = "{self.cfg.project}" AND created >= -14d ORDER BY created DESC'
        for issue in self._client().search_issues(jql, maxResults=50, fields="description"):
            # Cloud's v3 search returns the description as a document tree: search its JSON text
            if marker in json.dumps(getattr(issue.fields, "description", None) or "", default=str):
                return issue.key
        return None

    def _comment_once(self, key: str, event: Event) -> str:
        marker = self._marker(f"event {event.event_id}")
        if event.attempts > 0:   # did an earlier attempt post it before failing?
            for c in self._client().comments(key):
                if marker in json.dumps(getattr(c, "body", ""), default=str):
                    return f"{key}#comment-{c.id}"
        c = self._client().add_comment(key, f"{comment_text(event.kind, event.payload)}\n\n{marker}")
        return f"{key}#comment-{c.id}"

    def _transition_once(self, key: str) -> None:
        target = self.cfg.done_transition.lower()
        jira = self._client()
        status = jira.issue(key, fields="status").fields.status
        if status.name.lower() == target:
            return
        transitions = jira.transitions(key)
        for t in transitions:
            if t["name"].lower() == target or t.get("to", {}).get("name", "").lower() == target:
                jira.transition_issue(key, t["id"])
                return
        if getattr(getattr(status, "statusCategory", None), "key", "") == "done":
            return   # already closed under another status name
        names = ", ".join(repr(t["name"]) for t in transitions) or "none"
        raise DeliveryError(f"Jira {key}: no transition named {self.cfg.done_transition!r} from status "
                            f"{status.name!r} (available: {names}); set [jira] done_transition")

    def _error(self, e: Exception) -> DeliveryError:
        """A redacted DeliveryError. JIRAError's own text includes the request headers
        (the credentials), so build the message from its fields instead."""
        from jira.exceptions import JIRAError

        secrets_ = (self._token, self._email)
        if isinstance(e, JIRAError):
            status = e.status_code or 0
            retry_after = None
            if status == 429:
                try:
                    retry_after = float(e.response.headers.get("Retry-After", 30))  # type: ignore[union-attr]
                except (AttributeError, TypeError, ValueError):   # no response: the default
                    retry_after = 30.0
            msg = f"Jira HTTP {status} {e.url or ''}: {str(e.text or '')[:300]}"
            return DeliveryError(redact(msg, secrets_), sink_wide=status in (0, 401, 403) or status >= 500,
                                 retry_after=retry_after)
        import requests

        if isinstance(e, (requests.RequestException, OSError)):   # down or slow: stop this pass
            return DeliveryError(redact(f"Jira: {type(e).__name__}: {e}", secrets_), sink_wide=True)
        return DeliveryError(redact(f"Jira: {type(e).__name__}: {e}", secrets_))
