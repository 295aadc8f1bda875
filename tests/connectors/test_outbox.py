"""The delivery loop itself, with in-memory sinks: retries, backoff, give-up, checkpoints, never raising."""
from __future__ import annotations

import random

import pytest

from mcp_server.ledger.store import Ledger
from mcp_server.loop.config import JiraConfig, LoopwrightConfig, SlackConfig
from mcp_server.notify.outbox import MAX_ATTEMPTS, DeliveryError, backoff_delay, build_sinks, deliver_pending, redact

T0 = 1_800_000_000.0


class ScriptedSink:
    """Fails according to a script (one entry per call: None = succeed, an exception = raise it)."""

    name = "mem"
    kinds = frozenset({"keep", "tamper"})

    def __init__(self, *script):
        self.script = list(script)
        self.delivered: list[int] = []
        self.seen_refs: list = []

    def wants(self, kind):
        return kind in self.kinds

    def deliver(self, event):
        self.seen_refs.append(event.external_ref)
        outcome = self.script.pop(0) if self.script else None
        if callable(outcome):
            outcome = outcome(event)
        if isinstance(outcome, BaseException):
            raise outcome
        self.delivered.append(event.event_id)
        return f"ref-{event.event_id}"


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(tmp_path / "state.db")
    led.cid = led.create_campaign("main", "loopwright/main", "abc123")
    return led


def row(ledger, eid, sink="mem"):
    return next(d for d in ledger.deliveries(sink) if d["event_id"] == eid)


def test_backoff_grows_exponentially_with_jitter_and_a_cap():
    rng = random.Random(1)
    for attempts in range(1, 12):
        d = min(3600.0, 30.0 * 2 ** (attempts - 1))
        for _ in range(20):
            assert d / 2 <= backoff_delay(attempts, rng) <= d
    assert len({round(backoff_delay(3, rng), 3) for _ in range(20)}) > 10    # jittered


def test_success_marks_delivered_with_the_external_ref(ledger):
    eid = ledger.add_event(ledger.cid, "keep", {"val_bpb": 1.0}, sinks=["mem"])
    sink = ScriptedSink()
    rep = deliver_pending(ledger, None, [sink], now=T0)
    assert rep.delivered == 1 and rep.failed == 0
    d = row(ledger, eid)
    assert d["status"] == "delivered" and d["external_ref"] == f"ref-{eid}" and d["attempts"] == 1
    assert deliver_pending(ledger, None, [sink], now=T0 + 10).delivered == 0   # never twice
    assert sink.delivered == [eid]


def test_failure_is_recorded_retried_after_backoff_then_delivered(ledger):
    eid = ledger.add_event(ledger.cid, "keep", {}, sinks=["mem"])
    sink = ScriptedSink(RuntimeError("boom"))
    rep = deliver_pending(ledger, None, [sink], now=T0, rng=random.Random(0))
    assert rep.failed == 1 and "boom" in rep.sinks["mem"].errors[0]
    d = row(ledger, eid)
    assert d["status"] == "pending" and d["attempts"] == 1 and "RuntimeError: boom" in d["last_error"]
    assert T0 + 15 <= d["next_attempt_at"] <= T0 + 30
    assert deliver_pending(ledger, None, [sink], now=T0 + 1).delivered == 0      # not due yet
    assert deliver_pending(ledger, None, [sink], now=d["next_attempt_at"]).delivered == 1
    assert row(ledger, eid)["status"] == "delivered" and row(ledger, eid)["last_error"] is None


def test_gives_up_after_max_attempts_and_never_raises(ledger):
    eid = ledger.add_event(ledger.cid, "keep", {}, sinks=["mem"])
    sink = ScriptedSink(*[ValueError(f"bad {i}") for i in range(MAX_ATTEMPTS + 5)])
    now = T0
    for _ in range(MAX_ATTEMPTS + 3):
        deliver_pending(ledger, None, [sink], now=now)
        now += 10 * 3600
    d = row(ledger, eid)
    assert d["status"] == "failed" and d["attempts"] == MAX_ATTEMPTS and "bad 7" in d["last_error"]


def test_retry_after_is_honoured(ledger):
    eid = ledger.add_event(ledger.cid, "keep", {}, sinks=["mem"])
    sink = ScriptedSink(DeliveryError("HTTP 429", retry_after=900))
    deliver_pending(ledger, None, [sink], now=T0)
    assert row(ledger, eid)["next_attempt_at"] >= T0 + 900


def test_a_sink_wide_error_ends_the_pass_a_per_event_error_does_not(ledger):
    e1, e2, e3 = (ledger.add_event(ledger.cid, "keep", {"n": i}, sinks=["mem"]) for i in range(3))
    sink = ScriptedSink(DeliveryError("HTTP 503", sink_wide=True))
    rep = deliver_pending(ledger, None, [sink], now=T0)
    assert rep.failed == 1 and sink.delivered == []
    assert [row(ledger, e)["attempts"] for e in (e1, e2, e3)] == [1, 0, 0]   # e2, e3 untouched
    sink = ScriptedSink(ValueError("this event's payload is odd"))
    rep = deliver_pending(ledger, None, [sink], now=T0 + 7200)
    assert sink.delivered == [e2, e3] and row(ledger, e1)["status"] == "pending"


def test_checkpoint_is_seen_by_the_retry(ledger):
    eid = ledger.add_event(ledger.cid, "keep", {}, sinks=["mem"])

    def half_done(event):
        event.checkpoint("C1:123.4")
        return DeliveryError("upload failed", sink_wide=True)

    sink = ScriptedSink(half_done)
    deliver_pending(ledger, None, [sink], now=T0)
    assert row(ledger, eid)["external_ref"] == "C1:123.4"
    deliver_pending(ledger, None, [sink], now=T0 + 7200)
    assert sink.seen_refs == [None, "C1:123.4"]


def test_unwanted_kinds_are_skipped_and_unlisted_events_get_rows(ledger):
    e_plateau = ledger.add_event(ledger.cid, "plateau", {}, sinks=["mem"])
    e_keep = ledger.add_event(ledger.cid, "keep", {}, sinks=[])             # recorded without sinks
    e_discard = ledger.add_event(ledger.cid, "discard", {}, sinks=[])
    sink = ScriptedSink()
    rep = deliver_pending(ledger, None, [sink], now=T0)
    assert rep.sinks["mem"].skipped == 1 and sink.delivered == [e_keep]
    assert row(ledger, e_plateau)["external_ref"] == "skipped"
    assert e_discard not in [d["event_id"] for d in ledger.deliveries("mem")]  # not a kind it announces


def test_a_broken_ledger_is_reported_not_raised(ledger):
    ledger.add_event(ledger.cid, "keep", {}, sinks=["mem"])
    ledger.close()
    rep = deliver_pending(ledger, None, [ScriptedSink()], now=T0)
    assert rep.delivered == 0 and "stopped" in rep.sinks["mem"].errors[0]


def test_build_sinks_leaves_rows_pending_without_secrets(ledger):
    cfg = LoopwrightConfig(slack=SlackConfig(channel="C1"), jira=JiraConfig(server="http://127.0.0.1:9", project="LW"))
    eid = ledger.add_event(ledger.cid, "keep", {}, sinks=["slack", "jira"])
    sinks, notes = build_sinks(cfg, ledger, env={})
    assert sinks == [] and "SLACK_BOT_TOKEN" in notes[0] and "JIRA_API_TOKEN" in notes[1]
    rep = deliver_pending(ledger, cfg, env={}, now=T0)
    assert "SLACK_BOT_TOKEN" in str(rep)
    assert {d["status"] for d in ledger.deliveries() if d["event_id"] == eid} == {"pending"}
    assert all(d["attempts"] == 0 for d in ledger.deliveries())
    sinks, notes = build_sinks(LoopwrightConfig(slack=SlackConfig()), ledger, env={"SLACK_BOT_TOKEN": "xoxb-1"})
    assert sinks == [] and "channel is not set" in notes[0]
    sinks, notes = build_sinks(cfg, ledger, env={"SLACK_WEBHOOK_URL": "http://127.0.0.1:9/x",
                                                 "JIRA_API_TOKEN": "t", "JIRA_EMAIL": "a@b.c"})
    assert [s.name for s in sinks] == ["slack", "jira"] and notes == []


def test_redact():
    text = ("token xoxb-1234-abcd failed; headers {'authorization': 'Basic dXNlcjpwYXNzd29yZA=='} "
            "url https://hooks.slack.com/services/T1/B2/secret and raw s3cr3t-value")
    out = redact(text, ["s3cr3t-value"])
    for leaked in ("xoxb-1234", "dXNlcjpwYXNzd29yZA", "T1/B2/secret", "s3cr3t-value"):
        assert leaked not in out
    assert "failed" in out
