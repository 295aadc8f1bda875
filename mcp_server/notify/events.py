"""What a sink receives and raises, shared by the outbox and the connectors (no imports of either)."""
from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from typing import Callable, Iterable, Optional


class DeliveryError(Exception):
    """A sink's failure, already redacted. A `sink_wide` one (network, 5xx, 429, bad credentials)
    would hit the next rows too, so it ends the sink's pass; others fail only their own row."""

    def __init__(self, message: str, sink_wide: bool = False, retry_after: Optional[float] = None,
                 deferred: bool = False):
        super().__init__(message)
        # deferred: nothing was sent (the method is still rate limited); the row waits without an attempt
        self.deferred = deferred
        self.sink_wide = sink_wide or (retry_after is not None and not deferred)
        self.retry_after = retry_after


@dataclass
class Event:
    event_id: int
    kind: str
    payload: dict
    campaign_id: Optional[int]
    created_at: float
    attempts: int                 # attempts made before this one
    external_ref: Optional[str]   # what an earlier, partly successful attempt saved
    checkpoint: Callable[[str], None] = lambda ref: None
    now: float = 0.0              # the pass's clock (rate-limit windows are measured on it)



MIN_SECRET_LEN = 8

_SECRET_PATTERNS = [
    (re.compile(r"xox[a-z]-[A-Za-z0-9-]+"), "xox*-***"),                                   # Slack tokens
    (re.compile(r"hooks\.slack\.com/services/[A-Za-z0-9/_-]+"), "hooks.slack.com/services/***"),
    (re.compile(r"(?i)\b(basic|bearer)\s+[A-Za-z0-9+/=._-]{8,}"), r"\1 ***"),                # auth headers
]


def redact(text: str, secret_values: Iterable[Optional[str]] = ()) -> str:
    """`text` without the given secret values and anything shaped like a token or credential."""
    for s in secret_values:
        # a value this short is no real token, and masking it would mangle ordinary words
        if s and len(s) >= MIN_SECRET_LEN:
            text = text.replace(s, "***")
    for pat, repl in _SECRET_PATTERNS:
        text = pat.sub(repl, text)
    return text


def ledger_uid(ledger) -> str:
    """A random id for this ledger, made once; it marks our messages and issues so that a retry
    after an ambiguous failure (a timeout) can find what the first attempt already created."""
    uid = ledger.kv_get("ledger_uid")
    if uid is None:
        uid = secrets.token_hex(6)
        ledger.kv_set("ledger_uid", uid)
    return uid


def plot_marker_key(path) -> str:
    """The ledger kv key naming the last event id the plot at `path` shows: the report writes it with the
    plot, and a keep's Slack message waits until its plot shows it."""
    return f"report.plot_through_event.{os.path.realpath(path)}"
