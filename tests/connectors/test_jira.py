"""The Jira sink with the real `jira` client against a loopback fake of the Jira REST API."""
from __future__ import annotations

import base64
import logging
import time

import pytest

from mcp_server.ledger.store import Ledger
from mcp_server.loop.config import JiraConfig, LoopwrightConfig
from mcp_server.notify.jira import JiraSink
from mcp_server.notify.outbox import deliver_pending

from fakes import Fault
from fakes.fake_jira import FakeJira

TOKEN, EMAIL = "jira-secret-token", "bot@example.com"
KEEP = {"experiment_id": 4, "commit": "abcdef1234567890", "description": "swap GELU for SwiGLU",
        "val_bpb": 0.9123, "previous_best": 0.9165, "baseline": 0.93, "sigma": 0.0006, "threshold": 0.0012,
        "test_bpb": 0.914, "test_divergence": False}


@pytest.fixture(params=["server", "cloud"])
def fake(request):
    with FakeJira(cloud=request.param == "cloud", email=EMAIL, token=TOKEN) as fj:
        yield fj


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(tmp_path / "state.db")
    led.cid = led.create_campaign("main", "loopwright/main", "abc123")
    return led


def sink_for(fake, ledger, token=TOKEN, timeout=0.5, **cfg):
    c = JiraConfig(server=fake.url, project="LW", auth="cloud" if fake.cloud else "token", **cfg)
    return JiraSink(c, ledger, token=token, email=EMAIL if fake.cloud else None, timeout=timeout)


def drain(ledger, sink, passes=10):
    now = time.time()
    return [deliver_pending(ledger, None, [sink], now=now + i * 7200) for i in range(passes)]


def test_issue_per_campaign_comment_per_keep_transition_at_end(fake, ledger):
    ledger.add_event(ledger.cid, "campaign_start", {"tag": "main"}, sinks=["jira"])
    ledger.add_event(ledger.cid, "keep", KEEP, sinks=["jira"])
    ledger.add_event(ledger.cid, "keep", {**KEEP, "experiment_id": 5, "val_bpb": 0.91}, sinks=["jira"])
    ledger.add_event(ledger.cid, "campaign_end", {"best": 0.91, "baseline": 0.93}, sinks=["jira"])
    rep = deliver_pending(ledger, None, [sink_for(fake, ledger)])
    assert rep.delivered == 4, rep
    [(key, issue)] = fake.issues.items()
    assert issue["fields"]["summary"] == "loopwright campaign main"
    assert issue["fields"]["issuetype"] == {"name": "Task"} and issue["fields"]["status"]["name"] == "Done"
    c1, c2, end = fake.comments(key)
    assert "New best val_bpb 0.912300 (experiment #4, commit abcdef123456)" in c1
    assert "vs previous best: -0.004200" in c1 and "vs baseline: -0.017700" in c1 and "SwiGLU" in c1
    assert "experiment #5" in c2 and "Campaign ended" in end and "best 0.910000" in end
    assert ledger.kv_get(f"jira.issue.LW.{ledger.cid}") == key
    assert [d["external_ref"] for d in ledger.deliveries("jira")][:2] == [key, f"{key}#comment-100"]
    auth = fake.requests[0].headers["authorization"]
    assert auth == ("Basic " + base64.b64encode(f"{EMAIL}:{TOKEN}".encode()).decode() if fake.cloud
                    else f"Bearer {TOKEN}")


def test_issue_created_lazily_and_only_once(fake, ledger):
    ledger.add_event(ledger.cid, "keep", KEEP, sinks=["jira"])           # no campaign_start seen
    deliver_pending(ledger, None, [sink_for(fake, ledger)])
    ledger.add_event(ledger.cid, "keep", {**KEEP, "experiment_id": 9}, sinks=["jira"])
    deliver_pending(ledger, None, [sink_for(fake, ledger)])              # a new sink, e.g. the next session
    assert len(fake.issues) == 1 and len(fake.calls("POST issue")) == 1
    assert len(fake.comments(next(iter(fake.issues)))) == 2


def test_faults_everywhere_still_give_one_issue_and_one_comment_each(fake, ledger):
    ledger.add_event(ledger.cid, "campaign_start", {"tag": "main"}, sinks=["jira"])
    for i in range(3):
        ledger.add_event(ledger.cid, "keep", {**KEEP, "experiment_id": i}, sinks=["jira"])
    ledger.add_event(ledger.cid, "budget_spent", {"reasons": ["max_hours 8 reached"]}, sinks=["jira"])
    ledger.add_event(ledger.cid, "campaign_end", {"best": 0.9}, sinks=["jira"])
    fake.inject("GET serverInfo", Fault(status=503))
    fake.inject("POST issue", Fault(stall_s=0.8))                       # created, but the reply is lost
    fake.inject("POST issue/{key}/comment", Fault(status=500), Fault(stall_s=0.8), Fault(status=429, retry_after=1))
    fake.inject("POST issue/{key}/transitions", Fault(status=502))
    reports = drain(ledger, sink_for(fake, ledger))
    assert sum(r.delivered for r in reports) == 6
    assert all(d["status"] == "delivered" for d in ledger.deliveries("jira"))
    [(key, issue)] = fake.issues.items()                               # the lost create was found, not repeated
    comments = fake.comments(key)
    assert len(comments) == 5 and len(set(comments)) == 5              # 3 keeps + budget + end, once each
    assert sorted(int(c.split("experiment #")[1].split(",")[0]) for c in comments if "New best" in c) == [0, 1, 2]
    assert issue["fields"]["status"]["name"] == "Done"
    assert len(fake.calls("POST issue/{key}/transitions")) == 2        # the 502, then one transition


def test_missing_transition_is_reported_with_the_choices(fake, ledger):
    ledger.add_event(ledger.cid, "campaign_end", {}, sinks=["jira"])
    rep = deliver_pending(ledger, None, [sink_for(fake, ledger, done_transition="Closed")])
    err = ledger.deliveries("jira")[0]["last_error"]
    assert rep.failed == 1 and "no transition named 'Closed'" in err and "'Done'" in err


def test_bad_credentials_stop_the_pass_and_never_leak(fake, ledger, caplog):
    caplog.set_level(logging.DEBUG)
    for i in range(3):
        ledger.add_event(ledger.cid, "keep", {**KEEP, "experiment_id": i}, sinks=["jira"])
    rep = deliver_pending(ledger, None, [sink_for(fake, ledger, token="wrong-secret-xyz")])
    assert rep.failed == 1 and "HTTP 401" in rep.sinks["jira"].errors[0]
    assert [d["attempts"] for d in ledger.deliveries("jira")] == [1, 0, 0]
    basic = base64.b64encode(f"{EMAIL}:wrong-secret-xyz".encode()).decode()
    for text in [caplog.text, *(d["last_error"] or "" for d in ledger.deliveries("jira"))]:
        assert "wrong-secret-xyz" not in text and basic not in text


def test_unreachable_jira_is_recorded_not_raised(ledger):
    ledger.add_event(ledger.cid, "keep", KEEP, sinks=["jira"])
    sink = JiraSink(JiraConfig(server="http://127.0.0.1:9", project="LW", auth="token"), ledger, token=TOKEN,
                    timeout=0.5)
    rep = deliver_pending(ledger, None, [sink])
    assert rep.failed == 1 and "ConnectionError" in ledger.deliveries("jira")[0]["last_error"]


def test_configured_from_env_names(fake, ledger):
    ledger.add_event(ledger.cid, "keep", KEEP, sinks=["jira"])
    cfg = LoopwrightConfig(jira=JiraConfig(server=fake.url, project="LW", auth="cloud" if fake.cloud else "token",
                                           token_env="MY_JIRA_TOKEN"))
    rep = deliver_pending(ledger, cfg, env={})
    assert "MY_JIRA_TOKEN" in rep.notes[0] and fake.requests == []
    rep = deliver_pending(ledger, cfg, env={"MY_JIRA_TOKEN": TOKEN, "JIRA_EMAIL": EMAIL})
    assert rep.delivered == 1 and len(fake.issues) == 1


def test_two_concurrent_passes_post_the_closing_comment_once(fake, ledger):
    """Issue 15 item 10: the engine's background pass and a `loopwright notify` at the same time."""
    import threading

    ledger.add_event(ledger.cid, "campaign_start", {"tag": "main"}, sinks=["jira"])
    ledger.add_event(ledger.cid, "keep", KEEP, sinks=["jira"])
    ledger.add_event(ledger.cid, "campaign_end", {"best": 0.91, "baseline": 0.93}, sinks=["jira"])
    fake.inject("POST issue/{key}/comment", *[Fault(stall_s=0.2)] * 4)        # slow, so the passes overlap
    barrier, reports = threading.Barrier(2), []

    def one_pass():
        led = Ledger(ledger.path)
        barrier.wait()
        reports.append(deliver_pending(led, None, [sink_for(fake, led)]))
    threads = [threading.Thread(target=one_pass) for _ in range(2)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    [(key, _)] = fake.issues.items()
    comments = fake.comments(key)
    assert len(comments) == 2 and sum("Campaign ended" in c for c in comments) == 1, comments
    assert "baseline 0.930000" in comments[-1]
    assert sum(r.delivered for r in reports) == 3


def test_a_pass_started_while_another_creates_the_issue_creates_none(fake, ledger):
    """Issue 24 item 1: under load two passes created two issues. Forced here: the first pass's
    create is held in the air while a second pass runs to its end."""
    import threading

    ledger.add_event(ledger.cid, "campaign_start", {"tag": "main"}, sinks=["jira"])
    ledger.add_event(ledger.cid, "keep", KEEP, sinks=["jira"])
    ledger.add_event(ledger.cid, "campaign_end", {"best": 0.91, "baseline": 0.93}, sinks=["jira"])
    release, arrived = threading.Event(), threading.Event()
    fake.inject("POST issue", Fault(release=release, arrived=arrived))
    first: list = []

    def first_pass():
        led = Ledger(ledger.path)
        first.append(deliver_pending(led, None, [sink_for(fake, led, timeout=60)]))
    t = threading.Thread(target=first_pass)
    t.start()
    try:
        assert arrived.wait(60), "the first pass never tried to create the issue"
        led = Ledger(ledger.path)                                   # a second process's pass, meanwhile
        second = deliver_pending(led, None, [JiraSink(JiraConfig(server=fake.url, project="LW",
                                                                  auth="cloud" if fake.cloud else "token"), led,
                                                      token=TOKEN, email=EMAIL if fake.cloud else None)])
        assert second.delivered == 0 and second.failed == 0 and len(fake.calls("POST issue")) == 1
    finally:
        release.set()
        t.join(60)
    [(key, issue)] = fake.issues.items()
    assert first[0].delivered == 3 and issue["fields"]["status"]["name"] == "Done"
    assert len(fake.comments(key)) == 2 and "Campaign ended" in fake.comments(key)[-1]


def test_a_pass_that_died_mid_delivery_does_not_block_the_next(fake, ledger):
    """A server killed mid-pass leaves its lease; the next pass (the launcher's) voids it at once."""
    import subprocess
    import sys

    ledger.add_event(ledger.cid, "keep", KEEP, sinks=["jira"])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    from mcp_server.notify.outbox import HOST
    assert ledger.claim_delivery("jira", f"{HOST}:{dead}:1:abc", lease_s=3600) is not None
    rep = deliver_pending(ledger, None, [sink_for(fake, ledger)])
    assert rep.delivered == 1 and len(fake.issues) == 1


def test_a_second_issue_key_never_replaces_the_first(ledger):
    ledger.kv_setdefault("jira.issue.LW.1", "LW-1")
    assert ledger.kv_setdefault("jira.issue.LW.1", "LW-2") == "LW-1"


def test_agent_written_text_cannot_make_links_or_mentions_in_a_comment():
    from mcp_server.notify.jira import comment_text

    evil = "done [Approve|https://evil.example] [~accountid:5b10ac] {color:red}x{color} {noformat}out"
    for kind, p in (("keep", {**KEEP, "description": evil}),
                    ("approval_requested", {"approval_id": 3, "kind": "keep", "description": evil})):
        text = comment_text(kind, p)
        block = text[text.index("{noformat}"):]
        assert block.count("{noformat}") == 2 and "[Approve|https://evil.example]" in block, text
        assert "[Approve" not in text[:text.index("{noformat}")]
