"""Slack sink: a Block Kit message per kept improvement (with the progress plot), alerts, summaries.

Two modes: a bot token (chat.postMessage, plot uploaded into the message's thread)
or an incoming webhook (message only). The token is read from the environment
variable named in [slack] and lives only in the client object: it is never
written, never logged (the SDK's debug log, which prints headers, is silenced)
and redacted from error text.

Posting is made idempotent across retries in two ways:
- once chat.postMessage succeeded, its ts is saved (`checkpoint`), so a retry
  after a failed plot upload only uploads;
- a retry after an ambiguous failure (a timeout: did Slack post it?) first looks
  for the message in the channel history by the metadata every message carries
  (needs the channels:history scope; without it the retry posts again, i.e. at
  least once). Webhook mode cannot look, so it is at least once.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.webhook import WebhookClient

from mcp_server.notify import approval_blocks
from mcp_server.notify.events import DeliveryError, Event, ledger_uid, plot_marker_key, redact
from mcp_server.notify.fmt import as_shown, join, keep_deltas, num

log = logging.getLogger("loopwright.notify.slack")
# The SDK logs request headers (the bearer token) at DEBUG; give it a logger that never does.
_sdk_log = logging.getLogger("loopwright.notify.slack.sdk")
_sdk_log.setLevel(logging.INFO)

KINDS = frozenset({"keep", "crash_streak", "tamper", "plateau", "budget_spent", "session_end",
                   "campaign_start", "campaign_end", "approval_requested", "approval_decided",
                   "mechanism_activated", "mechanism_kept", "mechanism_reverted", "launch_failed"})
METADATA_TYPE = "loopwright_event"
# errors that every later message would hit too: stop the pass instead of burning their attempts
SINK_WIDE_ERRORS = {"invalid_auth", "not_authed", "token_revoked", "token_expired", "account_inactive",
                    "channel_not_found", "not_in_channel", "is_archived", "ratelimited"}
HEADER_MAX = 150
# A keep's message goes out with its plot: until the report has drawn the keep, the delivery fails and is
# retried (backoff); after this many attempts it goes without the plot and its ref says why.
PLOT_WAIT_ATTEMPTS = 3


# -- rendering (pure functions of the payload) ---------------------------------
def _esc(text) -> str:
    """Agent-written text must not become mentions (<!channel>) or links: escape Slack's controls."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _header(text: str) -> dict:
    if len(text) > HEADER_MAX:
        text = text[:HEADER_MAX - 1] + "…"
    return {"type": "header", "text": {"type": "plain_text", "text": text, "emoji": True}}


def _section(text: str) -> dict:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:2900]}}


def _context(text: str) -> dict:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text[:2900]}]}


def _fields(pairs: list[tuple[str, str]]) -> dict:
    return {"type": "section", "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{v}"[:2000]} for k, v in pairs[:10]]}


def _keep(p: dict, tag: str) -> tuple[str, list[dict]]:
    p = as_shown(p)
    metric = str(p.get("metric") or "val_bpb")
    val, best, base = p.get("val_bpb"), p.get("previous_best"), p.get("baseline")
    d_best, d_base = keep_deltas(p)
    title = f"New best {metric} {num(val)} ({num(d_best, '+.4f')}) · {tag}"
    if p.get("test_divergence"):
        check = f":warning: test_bpb {num(p.get('test_bpb'))} diverges from val: possible overfitting or leakage"
    elif p.get("test_bpb") is not None:
        check = f"test_bpb {num(p.get('test_bpb'))} · consistent with val"
    else:
        check = "n/a"
    commit = str(p.get("commit") or "")[:12] or "n/a"
    blocks = [
        _header(title),
        _fields([
            (metric, f"`{num(val, '.6f')}`"),
            ("vs previous best", f"{num(d_best, '+.6f')} (was {num(best, '.6f')})"),
            ("vs baseline", f"{num(d_base, '+.6f')} (baseline {num(base, '.6f')})"),
            ("Noise", f"σ {num(p.get('sigma'), '.5f')} · threshold {num(p.get('threshold'), '.5f')}"),
            ("Commit", f"`{_esc(commit)}`"),
            ("Hidden test", check),
        ]),
        _section(_esc(p.get("description") or "(no description)")),
        _context(f"experiment #{_esc(p.get('experiment_id', '?'))} · campaign `{_esc(tag)}`"),
    ]
    return title, blocks


def render(kind: str, p: dict, tag: str) -> tuple[str, list[dict]]:
    """(fallback text, blocks) for one event; tolerant of missing payload keys."""
    if kind == "keep":
        return _keep(p, tag)
    if kind == "crash_streak":
        title = f"{p.get('count', '?')} crashes in a row · {tag}"
        body = f":rotating_light: Last reason: {_esc(p.get('last_reason') or 'unknown')}"
    elif kind == "tamper":
        title = f"Tamper attempt on frozen files · {tag}"
        body = (f":lock: Files: {_esc(join(p.get('files')) or 'n/a')}\n"
                f"Action taken: {_esc(p.get('action') or 'n/a')}")
    elif kind == "plateau":
        title = f"Plateau · {tag}"
        body = f":hourglass: {p.get('experiments_since_keep', '?')} experiments since the last keep"
    elif kind == "budget_spent":
        title = f"Budget spent · {tag}"
        body = ":checkered_flag: " + _esc(join(p.get("reasons"), "; ") or "budget exhausted")
    elif kind == "session_end":
        title = f"Session ended ({p.get('agent', '?')}, {p.get('trigger', '?')}) · {tag}"
        body = (f"exit {_esc(p.get('exit_code', '?'))} · cost ${num(p.get('cost_usd'), '.2f')} · "
                f"{_esc(p.get('turns', '?'))} turns · {_esc(p.get('experiments', '?'))} experiments · "
                f"{_esc(p.get('kept', '?'))} kept")
    elif kind == "launch_failed":
        title = f"Session could not start ({p.get('agent', '?')}, {p.get('trigger', '?')}) · {tag}"
        body = f":x: {_esc(p.get('error') or 'unknown error')}"
    elif kind in ("mechanism_activated", "mechanism_kept", "mechanism_reverted"):
        verb = {"mechanism_activated": "on trial", "mechanism_kept": "kept",
                "mechanism_reverted": "reverted"}[kind]
        title = f"Search mechanism {p.get('name', '?')} v{p.get('version', '?')} {verb} · {tag}"
        if kind == "mechanism_activated":
            body = (f":test_tube: for the next {_esc(p.get('window', '?'))} experiments "
                    f"(by {_esc(p.get('author') or 'unknown')})")
        else:
            body = (":white_check_mark: " if kind == "mechanism_kept" else ":leftwards_arrow_with_hook: ") + \
                _esc(p.get("reason") or "no reason recorded")
    elif kind in ("campaign_start", "campaign_end"):
        verb = "started" if kind == "campaign_start" else "ended"
        title = f"Campaign {tag} {verb}"
        body = f"best {num(p.get('best'))} · baseline {num(p.get('baseline'))}"
    else:
        title, body = f"{kind} · {tag}", _esc(p)
    return title, [_header(title), _section(body)]


# -- the sink ------------------------------------------------------------------
class SlackSink:
    name = "slack"
    kinds = KINDS
    reports_dir: Optional[Path] = None   # where the report's plot is (set by outbox.build_sinks)

    def __init__(self, cfg, ledger, *, token: Optional[str] = None, webhook_url: Optional[str] = None,
                 timeout: float = 10):
        if not token and not webhook_url:
            raise ValueError("SlackSink needs a bot token or an incoming webhook URL")
        self.cfg, self.ledger = cfg, ledger
        self._secrets = (token, webhook_url)
        # retry_handlers=[]: the outbox retries; an SDK-internal retry could post twice.
        # timeout: the SDK annotates it int but hands it to urlopen, which takes float seconds (tests use 0.5)
        opts: dict[str, Any] = {"timeout": timeout, "logger": _sdk_log, "retry_handlers": []}
        self.client: Optional[WebClient] = None      # exactly one of the two is set
        self.webhook: Optional[WebhookClient] = None
        if token:
            kw = {"base_url": cfg.base_url} if cfg.base_url else {}
            self.client = WebClient(token=token, **opts, **kw)
        elif webhook_url:
            self.webhook = WebhookClient(webhook_url, **opts)

    @classmethod
    def from_config(cls, cfg, ledger, env: Mapping[str, str]) -> tuple[Optional["SlackSink"], Optional[str]]:
        token, url = env.get(cfg.token_env), env.get(cfg.webhook_url_env)
        if token:
            if not cfg.channel:
                return None, ("slack: [slack] channel is not set; add e.g. channel = \"C0123456789\" "
                              "(deliveries stay pending)")
            return cls(cfg, ledger, token=token), None
        if url:
            return cls(cfg, ledger, webhook_url=url), None
        return None, (f"slack: neither ${cfg.token_env} nor ${cfg.webhook_url_env} is set "
                      "(deliveries stay pending until one is)")

    def wants(self, kind: str) -> bool:
        return kind in self.kinds

    def _tag(self, event: Event) -> str:
        tag = event.payload.get("tag")
        if not tag and event.campaign_id is not None:
            row = self.ledger.campaign(event.campaign_id)
            tag = row and row["tag"]
        return str(tag or "loopwright")

    def deliver(self, event: Event) -> Optional[str]:
        self._now = event.now or time.time()
        if event.kind == "approval_decided":   # the autonomy slider: update the request's message in place
            return self._update_request(event)
        if event.kind == "crash_streak" and int(event.payload.get("count") or 0) < self.cfg.crash_streak:
            return "skipped:below-threshold"
        if event.kind == "approval_requested":   # the keep message with Approve / Reject buttons
            text, blocks = approval_blocks.render_request(event.payload, self._tag(event), ledger_uid(self.ledger),
                                                          _keep)
        else:
            text, blocks = render(event.kind, event.payload, self._tag(event))
        if self.webhook is not None:
            return self._send_webhook(self.webhook, text, blocks)

        ref = event.external_ref
        if not ref and event.attempts > 0:
            ref = self._find_posted(event)          # the earlier attempt may have posted it
            if ref:
                event.checkpoint(ref)
        if not ref and self._wants_plot(event):
            why = self._plot_missing(event)
            if why and event.attempts + 1 < PLOT_WAIT_ATTEMPTS:
                raise DeliveryError(f"the keep waits for its plot: {why}")
        if not ref:
            uid = f"{ledger_uid(self.ledger)}:{event.event_id}"
            resp = self._call("chat.postMessage", self._web.chat_postMessage, channel=self.cfg.channel,
                              text=text, blocks=blocks, unfurl_links=False, unfurl_media=False,
                              metadata={"event_type": METADATA_TYPE,
                                        "event_payload": {"id": uid, "kind": event.kind}})
            if self.ledger.kv_get(self._channel_key()) != resp["channel"]:
                self.ledger.kv_set(self._channel_key(), resp["channel"])   # for _find_posted
            ref = f"{resp['channel']}:{resp['ts']}"
            event.checkpoint(ref)
        return self._upload_plot(event, ref)

    # -- helpers ---------------------------------------------------------------
    @property
    def _web(self) -> WebClient:
        """The Web API client. A webhook sink has none; it never gets past deliver's webhook branch."""
        if self.client is None:
            raise RuntimeError("this Slack sink posts through an incoming webhook: it has no Web API client")
        return self.client

    def _update_request(self, event: Event) -> str:
        """chat.update of the approval request's message: who decided and when, buttons removed."""
        p = event.payload
        if self.webhook is not None or p.get("via") == "slack":
            return "skipped:updated-by-the-click"   # the interactivity route already updated it
        req = [e for e in self.ledger.events(event.campaign_id, kind="approval_requested")
               if e["payload"].get("approval_id") == p.get("approval_id")]
        refs = [d["external_ref"] for d in self.ledger.deliveries("slack")
                if req and d["event_id"] == req[-1]["id"] and d["external_ref"]]
        if not refs:
            return "skipped:no-request-message"
        channel, ts = refs[0].split(":")[:2]
        _, blocks = approval_blocks.render_request(req[-1]["payload"], self._tag(event), ledger_uid(self.ledger), _keep)
        text, blocks = approval_blocks.decided_blocks(blocks, p.get("decision", "?"), str(p.get("by") or "?"),
                                                      p.get("at"), p.get("note"))
        self._call("chat.update", self._web.chat_update, channel=channel, ts=ts, text=text, blocks=blocks)
        return f"{channel}:{ts}:updated"

    def _channel_key(self) -> str:
        return f"slack.channel_id.{self.cfg.channel}"

    def _plot_path(self, event: Event) -> str:
        # the payload names the plot; else the workspace report's plot (reports_dir, set by notify_workspace)
        reports = self.reports_dir or Path(self.ledger.path).parent / "reports"
        return event.payload.get("plot_path") or str(Path(reports) / "progress.png")

    def _wants_plot(self, event: Event) -> bool:
        return event.kind == "keep" and self.cfg.upload_plot and self.client is not None

    def _plot_missing(self, event: Event) -> Optional[str]:
        """Why the keep's plot cannot go out yet (None: it can): not written, or drawn before this keep."""
        path = self._plot_path(event)
        if not os.path.isfile(path):
            return f"{path} is not written yet"
        through = self.ledger.kv_get(plot_marker_key(path))   # None: not a report's plot (named by the payload)
        if through is not None and (not through.isdigit() or int(through) < event.event_id):
            return f"{path} was drawn before this keep (event {event.event_id})"
        return None

    def _upload_plot(self, event: Event, ref: str) -> str:
        if not self._wants_plot(event) or ":file:" in ref or ":plot-" in ref:
            return ref
        channel, ts = ref.split(":")[:2]
        why = self._plot_missing(event)
        if why:   # waited PLOT_WAIT_ATTEMPTS attempts: the message is out, record why its plot is not
            log.warning("keep event %s goes to Slack without its plot: %s", event.event_id, why)
            return f"{channel}:{ts}:plot-missing"
        path = self._plot_path(event)
        try:
            fid = self._upload_once(event, channel, ts, path, ref)
        except DeliveryError as e:
            if e.sink_wide or e.deferred:
                raise
            # e.g. missing files:write: the message is out, record why the plot is not
            log.warning("plot upload for event %s failed for good: %s", event.event_id, e)
            return f"{channel}:{ts}:plot-failed:{str(e)[:100]}"
        return f"{channel}:{ts}:file:{fid}"

    def _upload_once(self, event: Event, channel: str, ts: str, path: str, ref: str) -> str:
        """Upload and share the plot in the message's thread, once: the file id is saved before the
        share, so a retry after a lost files.completeUploadExternal reply checks the file (files.info)
        instead of uploading and sharing it again."""
        title = f"progress after experiment #{event.payload.get('experiment_id', '?')}"
        if ":upload:" in ref:
            fid = ref.split(":upload:")[1].split(":")[0]
            if self._is_shared(fid, channel):
                return fid
            # never completed: Slack drops an upload that is not completed, so start over
        data = Path(path).read_bytes()
        resp = self._call("files.getUploadURLExternal", self._web.files_getUploadURLExternal,
                          filename=os.path.basename(path), length=len(data))
        fid = resp["file_id"]
        event.checkpoint(f"{channel}:{ts}:upload:{fid}")
        self._call("files.upload", self._post_bytes, url=resp["upload_url"], data=data)
        self._call("files.completeUploadExternal", self._web.files_completeUploadExternal,
                   files=[{"id": fid, "title": title}], channel_id=channel, thread_ts=ts)
        return fid

    def _post_bytes(self, url: str, data: bytes) -> None:
        client = self._web
        result = client._upload_file(url=url, data=data, logger=_sdk_log, timeout=client.timeout,
                                     proxy=client.proxy, ssl=client.ssl)
        if result.status != 200:
            raise DeliveryError(f"Slack files.upload: HTTP {result.status} {str(result.body)[:200]}",
                                sink_wide=result.status >= 500)

    def _is_shared(self, fid: str, channel: str) -> bool:
        """Was the file shared in `channel` (the completion went through, its reply was lost)? Needs the
        files:read scope; without it the upload is done again (at least once)."""
        try:
            f = self._call("files.info", self._web.files_info, file=fid).get("file") or {}
        except DeliveryError as e:
            if e.sink_wide or e.deferred:
                raise
            log.info("cannot check upload %s (%s); uploading again", fid, e)
            return False
        shares = f.get("shares") or {}
        return any(channel in (shares.get(scope) or {}) for scope in ("public", "private")) or channel in (
            (f.get("channels") or []) + (f.get("groups") or []) + (f.get("ims") or []))

    def _find_posted(self, event: Event) -> Optional[str]:
        channel = self.ledger.kv_get(self._channel_key()) or (
            self.cfg.channel if self.cfg.channel and self.cfg.channel[:1] in "CGD" else None)
        if channel is None:
            return None
        uid = f"{ledger_uid(self.ledger)}:{event.event_id}"
        try:
            resp = self._call("conversations.history", self._web.conversations_history, channel=channel,
                              oldest=str(event.created_at - 600), include_all_metadata=True, limit=200)
        except DeliveryError as e:
            if e.sink_wide:
                raise
            log.warning("cannot check whether event %s was already posted (%s); posting again", event.event_id, e)
            return None
        for m in resp.get("messages") or []:
            md = m.get("metadata") or {}
            if md.get("event_type") == METADATA_TYPE and (md.get("event_payload") or {}).get("id") == uid:
                return f"{channel}:{m['ts']}"
        return None

    def _call(self, method: str, fn, **kwargs):
        # Slack rate-limits per method (its tiers): after a 429 no row calls that method again before
        # Retry-After is over, in this pass or a later one (the window is kept in the ledger)
        gate = f"slack.rate_limited_until.{method}"
        now = getattr(self, "_now", None) or time.time()
        until = float(self.ledger.kv_get(gate) or 0)
        if now < until:
            raise DeliveryError(f"Slack {method}: rate limited for {until - now:.0f}s more (Retry-After); "
                                "not called", retry_after=until - now, deferred=True)
        try:
            return fn(**kwargs)
        except SlackApiError as e:
            status = e.response.status_code
            data = e.response.data if isinstance(e.response.data, dict) else {}
            retry_after = _retry_after(e.response.headers) if status == 429 else None
            if retry_after is not None:
                self.ledger.kv_set(gate, repr(now + retry_after))
            msg = f"Slack {method}: HTTP {status} {data.get('error') or str(e.response.data)[:200]}"
            sink_wide = status >= 500 or data.get("error") in SINK_WIDE_ERRORS
            raise DeliveryError(redact(msg, self._secrets), sink_wide=sink_wide, retry_after=retry_after) from None
        except DeliveryError:
            raise
        except Exception as e:  # network errors, timeouts, a failed upload POST
            raise DeliveryError(redact(f"Slack {method}: {type(e).__name__}: {e}", self._secrets),
                                sink_wide=True) from None

    def _send_webhook(self, webhook: WebhookClient, text: str, blocks: list[dict]) -> str:
        try:
            resp = webhook.send(text=text, blocks=blocks, unfurl_links=False, unfurl_media=False)
        except Exception as e:
            raise DeliveryError(redact(f"Slack webhook: {type(e).__name__}: {e}", self._secrets),
                                sink_wide=True) from None
        if resp.status_code == 200:
            return "webhook"
        msg = redact(f"Slack webhook: HTTP {resp.status_code} {str(resp.body)[:200]}", self._secrets)
        raise DeliveryError(msg, sink_wide=resp.status_code >= 500 or resp.status_code in (403, 404),
                            retry_after=_retry_after(resp.headers) if resp.status_code == 429 else None)


def _retry_after(headers) -> float:
    for k, v in (headers or {}).items():
        if k.lower() == "retry-after":
            try:
                return float(v[0] if isinstance(v, list) else v)
            except (TypeError, ValueError):
                break
    return 30.0
