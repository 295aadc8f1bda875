"""The Slack sink with the real slack_sdk clients against a loopback fake of the Slack API."""
from __future__ import annotations

import logging
import time

import pytest

from mcp_server.ledger.store import Ledger
from mcp_server.loop.config import LoopwrightConfig, SlackConfig
from mcp_server.notify.outbox import deliver_pending
from mcp_server.notify.slack import SlackSink, render

from fakes import Fault
from fakes.fake_slack import FakeSlack

TOKEN = "xoxb-test-token"
KEEP = {"experiment_id": 12, "commit": "abcdef1234567890", "description": "raise LR to 3e-3 <!channel> & warmup",
        "val_bpb": 0.9123, "previous_best": 0.9165, "baseline": 0.9300, "delta_vs_best": -0.0042,
        "delta_vs_baseline": -0.0177, "sigma": 0.0006, "threshold": 0.0012, "test_bpb": 0.9150,
        "test_divergence": False, "tag": "main"}


@pytest.fixture
def fake():
    with FakeSlack(TOKEN) as fs:
        yield fs


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(tmp_path / "state.db")
    led.cid = led.create_campaign("main", "loopwright/main", "abc123")
    return led


def sink_for(fake, ledger, channel="C0RESEARCH", **kw):
    return SlackSink(SlackConfig(channel=channel, base_url=fake.api_url), ledger, token=TOKEN, timeout=0.5, **kw)


def drain(ledger, sink, passes=12):
    """Run delivery passes with the clock far enough ahead that every retry is due."""
    reports, now = [], time.time()
    for i in range(passes):
        reports.append(deliver_pending(ledger, None, [sink], now=now + i * 7200))
    return reports


def test_keep_message_blocks_and_plot_upload(fake, ledger, tmp_path):
    png = tmp_path / "progress.png"
    png.write_bytes(b"\x89PNG\r\n fake plot")
    eid = ledger.add_event(ledger.cid, "keep", {**KEEP, "plot_path": str(png)}, sinks=["slack"])
    rep = deliver_pending(ledger, None, [sink_for(fake, ledger)])
    assert rep.delivered == 1, rep
    [msg] = fake.messages
    header, fields, desc, ctx = msg["blocks"]
    assert header["text"]["text"] == "New best val_bpb 0.9123 (-0.0042) · main"
    text = " ".join(f["text"] for f in fields["fields"])
    for part in ("0.912300", "-0.004200", "was 0.916500", "-0.017700", "baseline 0.930000", "σ 0.00060",
                 "threshold 0.00120", "`abcdef123456`", "test_bpb 0.9150 · consistent"):
        assert part in text, part
    assert desc["text"]["text"] == "raise LR to 3e-3 &lt;!channel&gt; &amp; warmup"   # no mass mention
    assert "experiment #12" in ctx["elements"][0]["text"]
    assert msg["metadata"]["event_payload"]["id"].endswith(f":{eid}")
    # the plot: three requests (get URL, upload bytes, complete) into the message's thread
    assert [fake.route(r) for r in fake.requests[1:]] == [
        "files.getUploadURLExternal", "upload", "files.completeUploadExternal"]
    [f] = fake.shared_files()
    assert f["data"] == png.read_bytes() and f["thread_ts"] == msg["ts"] and f["channel"] == "C0RESEARCH"
    assert ledger.deliveries("slack")[0]["external_ref"] == f"C0RESEARCH:{msg['ts']}:file:F0001"


def test_divergence_flag_and_long_header(fake, ledger):
    text, blocks = render("keep", {**KEEP, "test_divergence": True, "test_bpb": 0.95}, "t" * 300)
    assert len(blocks[0]["text"]["text"]) == 150 and blocks[0]["text"]["text"].endswith("…")
    assert ":warning: test_bpb 0.9500 diverges" in blocks[1]["fields"][5]["text"]
    # missing payload keys do not break rendering
    text, blocks = render("keep", {"val_bpb": 0.9, "previous_best": 0.95}, "main")
    assert text == "New best val_bpb 0.9000 (-0.0500) · main"


def test_a_keep_waits_for_its_plot_and_goes_with_it(fake, ledger, tmp_path):
    """Issue 24 item 6: a pass that finds no plot must not post the keep bare and mark it done."""
    png = tmp_path / "progress.png"
    ledger.add_event(ledger.cid, "keep", {**KEEP, "plot_path": str(png)}, sinks=["slack"])
    rep = deliver_pending(ledger, None, [sink_for(fake, ledger)])
    assert rep.delivered == 0 and "waits for its plot" in rep.sinks["slack"].errors[0]
    assert fake.requests == [] and ledger.deliveries("slack")[0]["status"] == "pending"
    png.write_bytes(b"png")                                                # the report is written
    assert drain(ledger, sink_for(fake, ledger), passes=2)[1].delivered == 1
    [msg] = fake.messages
    [f] = fake.shared_files()
    assert f["thread_ts"] == msg["ts"] and f["data"] == b"png"


def test_the_closing_messages_wait_for_the_keep_that_spent_the_budget(fake, ledger, tmp_path):
    """Issue 24 item 6: Slack showed "budget spent" and "campaign ended" before the keep that caused them."""
    png = tmp_path / "progress.png"
    keep = ledger.add_event(ledger.cid, "keep", {**KEEP, "plot_path": str(png)}, sinks=["slack"])
    ledger.add_event(ledger.cid, "budget_spent", {"reasons": ["max_experiments 3 reached"]}, sinks=["slack"])
    ledger.add_event(ledger.cid, "campaign_end", {"best": 0.91, "baseline": 0.93}, sinks=["slack"])
    other = ledger.create_campaign("next", "loopwright/next", "abc123")
    ledger.add_event(other, "campaign_end", {}, sinks=["slack"])             # another campaign's: not held
    rep = deliver_pending(ledger, None, [sink_for(fake, ledger)])
    assert rep.delivered == 1 and [m["text"] for m in fake.messages] == ["Campaign next ended"]
    png.write_bytes(b"png")
    drain(ledger, sink_for(fake, ledger), passes=2)
    assert [m["text"].split(" · ")[0] for m in fake.messages[1:]] == [
        "New best val_bpb 0.9123 (-0.0042)", "Budget spent", "Campaign main ended"]
    [f] = fake.shared_files()
    assert f["thread_ts"] == fake.messages[1]["ts"]
    assert ledger.deliveries("slack")[0]["event_id"] == keep and ledger.deliveries("slack")[0]["attempts"] == 2


def test_a_plot_drawn_before_the_keep_is_not_its_plot(fake, ledger, tmp_path):
    from mcp_server.notify.events import plot_marker_key

    png = tmp_path / "progress.png"
    png.write_bytes(b"old plot")
    eid = ledger.add_event(ledger.cid, "keep", {**KEEP, "plot_path": str(png)}, sinks=["slack"])
    ledger.kv_set(plot_marker_key(png), str(eid - 1))                     # the report drew up to the event before
    assert deliver_pending(ledger, None, [sink_for(fake, ledger)]).delivered == 0 and fake.requests == []
    png.write_bytes(b"new plot")
    ledger.kv_set(plot_marker_key(png), str(eid))
    assert drain(ledger, sink_for(fake, ledger), passes=2)[1].delivered == 1
    assert [f["data"] for f in fake.shared_files()] == [b"new plot"]


def test_a_plot_that_never_comes_is_said_not_hidden(fake, ledger, tmp_path, caplog):
    from mcp_server.notify.slack import PLOT_WAIT_ATTEMPTS

    ledger.add_event(ledger.cid, "keep", {**KEEP, "plot_path": str(tmp_path / "missing.png")}, sinks=["slack"])
    reports = drain(ledger, sink_for(fake, ledger), passes=PLOT_WAIT_ATTEMPTS)
    assert [r.delivered for r in reports] == [0] * (PLOT_WAIT_ATTEMPTS - 1) + [1]
    assert len(fake.messages) == 1 and fake.files == {}                    # after the wait: the message alone
    assert ledger.deliveries("slack")[0]["external_ref"].endswith(":plot-missing")
    assert "without its plot" in caplog.text


def test_faults_everywhere_still_deliver_each_message_exactly_once(fake, ledger, tmp_path):
    png = tmp_path / "progress.png"
    png.write_bytes(b"png")
    ids = [ledger.add_event(ledger.cid, "keep", {**KEEP, "experiment_id": i, "plot_path": str(png)},
                            sinks=["slack"]) for i in range(3)]
    ids.append(ledger.add_event(ledger.cid, "tamper", {"files": ["prepare.py"], "action": "restored"},
                                sinks=["slack"]))
    fake.inject("chat.postMessage",
                Fault(status=429, retry_after=1), Fault(status=500), Fault(stall_s=0.8),  # stall: posted, reply lost
                Fault(status=503), Fault(stall_s=0.8))
    fake.inject("files.completeUploadExternal", Fault(status=503), Fault(stall_s=0.8, status=0))
    fake.inject("upload", Fault(status=500))
    reports = drain(ledger, sink_for(fake, ledger))
    assert sum(r.delivered for r in reports) == 4
    assert all(d["status"] == "delivered" for d in ledger.deliveries("slack"))
    posted = [m["metadata"]["event_payload"]["id"].split(":")[1] for m in fake.messages]
    assert sorted(map(int, posted)) == ids                                 # each message exactly once
    assert len(fake.calls("conversations.history")) >= 2     # the stalled posts were found, not re-posted
    assert sum(r.status == 429 for r in fake.calls("chat.postMessage")) == 1
    # every keep has its plot in its own thread; a plot may be shared twice only if the
    # completion reply itself was lost (the stalled completeUploadExternal above)
    threads = {f["thread_ts"] for f in fake.shared_files()}
    assert threads == {m["ts"] for m in fake.messages if m["text"].startswith("New best")}


def test_rate_limit_schedules_the_retry_after_retry_after(fake, ledger):
    eid = ledger.add_event(ledger.cid, "plateau", {"experiments_since_keep": 9}, sinks=["slack"])
    fake.inject("chat.postMessage", Fault(status=429, retry_after=5000))
    now = time.time()
    rep = deliver_pending(ledger, None, [sink_for(fake, ledger)], now=now)
    assert rep.failed == 1 and "HTTP 429" in rep.sinks["slack"].errors[0]
    d = ledger.deliveries("slack")[0]
    assert d["event_id"] == eid and d["next_attempt_at"] >= now + 5000
    assert deliver_pending(ledger, None, [sink_for(fake, ledger)], now=now + 4000).delivered == 0
    assert deliver_pending(ledger, None, [sink_for(fake, ledger)], now=now + 5001).delivered == 1
    assert len(fake.messages) == 1


def test_upload_retry_does_not_post_the_message_again(fake, ledger, tmp_path):
    png = tmp_path / "p.png"
    png.write_bytes(b"png")
    ledger.add_event(ledger.cid, "keep", {**KEEP, "plot_path": str(png)}, sinks=["slack"])
    fake.inject("files.getUploadURLExternal", Fault(status=500), Fault(status=502))
    # without channels:history the saved ts alone must prevent a second post
    fake.inject("conversations.history", *[Fault(status=200, body={"ok": False, "error": "missing_scope"})] * 3)
    drain(ledger, sink_for(fake, ledger), passes=4)
    assert len(fake.calls("chat.postMessage")) == 1 and len(fake.messages) == 1
    assert len(fake.shared_files()) == 1


def test_alerts_and_session_summary(fake, ledger):
    events = [("crash_streak", {"count": 2, "last_reason": "OOM"}),       # below [slack] crash_streak = 3
              ("crash_streak", {"count": 4, "last_reason": "CUDA out of memory"}),
              ("tamper", {"files": ["prepare.py", ".loopwright/data/val.bin"], "action": "restored; not scored"}),
              ("plateau", {"experiments_since_keep": 15}),
              ("budget_spent", {"reasons": ["max_experiments 50 reached"]}),
              ("session_end", {"agent": "claude", "trigger": "cron", "exit_code": 0, "cost_usd": 1.234,
                               "turns": 40, "experiments": 9, "kept": 2}),
              ("discard", {})]                                              # not announced
    for kind, payload in events:
        ledger.add_event(ledger.cid, kind, payload, sinks=["slack"])
    rep = deliver_pending(ledger, None, [sink_for(fake, ledger)])
    assert rep.delivered == 6 and rep.sinks["slack"].skipped == 1
    texts = [m["text"] for m in fake.messages]
    assert texts == ["4 crashes in a row · main", "Tamper attempt on frozen files · main", "Plateau · main",
                     "Budget spent · main", "Session ended (claude, cron) · main"]
    bodies = [m["blocks"][1]["text"]["text"] for m in fake.messages]
    assert "CUDA out of memory" in bodies[0] and "prepare.py, .loopwright/data/val.bin" in bodies[1]
    assert "15 experiments since the last keep" in bodies[2] and "max_experiments 50 reached" in bodies[3]
    assert "cost $1.23" in bodies[4] and "9 experiments" in bodies[4] and "2 kept" in bodies[4]


def test_incoming_webhook_mode(fake, ledger):
    ledger.add_event(ledger.cid, "keep", KEEP, sinks=["slack"])
    ledger.add_event(ledger.cid, "budget_spent", {"reasons": ["max_hours"]}, sinks=["slack"])
    cfg = LoopwrightConfig(slack=SlackConfig())
    fake.inject("webhook", Fault(status=429, retry_after=1), Fault(status=500))
    env = {"SLACK_WEBHOOK_URL": fake.webhook_url}
    now = time.time()
    for i in range(4):
        deliver_pending(ledger, cfg, env=env, now=now + i * 7200)
    assert [m["text"] for m in fake.messages] == ["New best val_bpb 0.9123 (-0.0042) · main", "Budget spent · main"]
    assert all(m["via"] == "webhook" for m in fake.messages)
    assert {d["external_ref"] for d in ledger.deliveries("slack")} == {"webhook"}


def test_bad_token_stops_the_pass_and_never_leaks(fake, ledger, caplog):
    caplog.set_level(logging.DEBUG)
    for i in range(3):
        ledger.add_event(ledger.cid, "plateau", {"experiments_since_keep": i}, sinks=["slack"])
    sink = SlackSink(SlackConfig(channel="C0RESEARCH", base_url=fake.api_url), ledger,
                     token="xoxb-wrong-secret-value", timeout=0.5)
    rep = deliver_pending(ledger, None, [sink])
    assert rep.failed == 1 and "invalid_auth" in rep.sinks["slack"].errors[0]
    assert [d["attempts"] for d in ledger.deliveries("slack")] == [1, 0, 0]
    assert "xoxb-wrong-secret-value" not in caplog.text
    assert all("xoxb-wrong" not in (d["last_error"] or "") for d in ledger.deliveries("slack"))


def test_unreachable_slack_is_recorded_not_raised(ledger):
    ledger.add_event(ledger.cid, "plateau", {}, sinks=["slack"])
    sink = SlackSink(SlackConfig(channel="C0RESEARCH", base_url="http://127.0.0.1:9/api/"), ledger,
                     token=TOKEN, timeout=0.5)
    rep = deliver_pending(ledger, None, [sink])
    assert rep.failed == 1
    assert ledger.deliveries("slack")[0]["last_error"].startswith("Slack chat.postMessage: URLError")


def test_missing_token_keeps_events_pending(fake, ledger):
    ledger.add_event(ledger.cid, "keep", KEEP, sinks=["slack"])
    cfg = LoopwrightConfig(slack=SlackConfig(channel="C0RESEARCH", base_url=fake.api_url, upload_plot=False))
    rep = deliver_pending(ledger, cfg, env={})
    assert "SLACK_BOT_TOKEN" in rep.notes[0] and fake.requests == []
    rep = deliver_pending(ledger, cfg, env={"SLACK_BOT_TOKEN": TOKEN})
    assert rep.delivered == 1 and len(fake.messages) == 1


def test_notify_workspace_with_the_reports_plot(fake, tmp_path, monkeypatch, small_corpus):
    """`loopwright notify` end to end: settings from the state dir, the token from the environment; the
    plot defaults to the workspace's .loopwright/reports/progress.png when the payload names none, and the
    pass draws it afresh before delivering a keep (issue 24 item 6: the launcher's pass did not)."""
    from mcp_server.loop import settings as setmod
    from mcp_server.notify.outbox import notify_workspace

    from conftest import make_workspace

    ws = make_workspace(tmp_path / "ws", small_corpus)
    s = setmod.load(ws.settings_path)
    for key, value in (("slack.channel", "C0RESEARCH"), ("slack.base_url", fake.api_url)):
        s = setmod.set_value(s, key, value)
    setmod.save(ws.settings_path, s)
    ws.reports_dir.mkdir(parents=True, exist_ok=True)
    (ws.reports_dir / "progress.png").write_bytes(b"a stale plot")
    with ws.ledger() as led:
        led.add_event(led.campaign()["id"], "keep", KEEP, sinks=["slack"])
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    rep = notify_workspace(ws.root)
    assert rep.delivered == 2, rep                            # campaign_start (from init) and the keep
    [f] = fake.shared_files()
    assert len(fake.messages) == 2 and f["data"] == (ws.reports_dir / "progress.png").read_bytes()
    assert f["data"].startswith(b"\x89PNG") and f["thread_ts"] == fake.messages[1]["ts"]


def test_background_passes_say_why_nothing_goes_out(tmp_path, small_corpus, monkeypatch, caplog):
    """Issue 24 item 6: the MCP server's passes sent nothing for a whole session and said so at debug."""
    from mcp_server.mcp.server import _deliver_events
    from mcp_server.notify.outbox import deliver_in_background

    from conftest import make_workspace

    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    monkeypatch.delenv("SLACK_WEBHOOK_URL", raising=False)
    ws = make_workspace(tmp_path / "ws", small_corpus, slack={"channel": "C0RESEARCH"})
    caplog.set_level(logging.WARNING)
    deliver_in_background(ws.root).join(60)
    assert "SLACK_BOT_TOKEN" in caplog.text and str(ws.root) in caplog.text
    caplog.clear()
    _deliver_events(tmp_path / "not-a-workspace")
    assert "could not start event delivery" in caplog.text and "not-a-workspace" in caplog.text


def test_plot_upload_without_files_write_still_delivers_the_message(fake, ledger, tmp_path):
    png = tmp_path / "p.png"
    png.write_bytes(b"png")
    ledger.add_event(ledger.cid, "keep", {**KEEP, "plot_path": str(png)}, sinks=["slack"])
    fake.inject("files.getUploadURLExternal", Fault(status=200, body={"ok": False, "error": "missing_scope"}))
    rep = deliver_pending(ledger, None, [sink_for(fake, ledger)])
    assert rep.delivered == 1 and len(fake.messages) == 1 and fake.shared_files() == []
    assert "plot-failed:Slack files.getUploadURLExternal: HTTP 200 missing_scope" in ledger.deliveries("slack")[0]["external_ref"]


# -- issue 15 items 10-12: exclusive passes, idempotent upload, Retry-After per method -------------
def test_two_concurrent_passes_post_each_message_exactly_once(fake, ledger, tmp_path):
    import threading

    png = tmp_path / "p.png"
    png.write_bytes(b"png")
    ids = [ledger.add_event(ledger.cid, "keep", {**KEEP, "experiment_id": i, "plot_path": str(png)},
                            sinks=["slack"]) for i in range(4)]
    ids.append(ledger.add_event(ledger.cid, "campaign_end", {"best": 0.9, "baseline": 0.93}, sinks=["slack"]))
    # every post is slow, so the two passes overlap for their whole length
    fake.inject("chat.postMessage", *[Fault(stall_s=0.15)] * 10)
    barrier, reports = threading.Barrier(2), []

    def one_pass():
        led = Ledger(ledger.path)               # its own connection, as a second process would have
        barrier.wait()
        reports.append(deliver_pending(led, None, [SlackSink(SlackConfig(channel="C0RESEARCH",
                                                                         base_url=fake.api_url), led,
                                                             token=TOKEN, timeout=2)]))
    threads = [threading.Thread(target=one_pass) for _ in range(2)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    posted = sorted(int(m["metadata"]["event_payload"]["id"].split(":")[1]) for m in fake.messages)
    assert posted == ids                                            # each once, none twice
    assert sum(r.delivered for r in reports) == 5 and all(r.failed == 0 for r in reports)
    assert len(fake.calls("files.completeUploadExternal")) == 4 and len(fake.shared_files()) == 4
    assert all(d["status"] == "delivered" and d["attempts"] == 1 for d in ledger.deliveries("slack"))


def test_a_delivered_row_never_goes_back_to_pending(ledger):
    eid = ledger.add_event(ledger.cid, "keep", {}, sinks=["slack"])
    first = ledger.claim_delivery("slack", "pass-a", now=100.0, lease_s=10)
    assert first["event_id"] == eid
    assert ledger.claim_delivery("slack", "pass-b", now=101.0, lease_s=10) is None       # leased to a
    taken = ledger.claim_delivery("slack", "pass-b", now=111.0, lease_s=10)               # a's lease expired
    assert taken["event_id"] == eid
    assert not ledger.mark_delivered(eid, "slack", "late", owner="pass-a")   # a lost the row: no effect
    assert ledger.mark_delivered(eid, "slack", "C:1", owner="pass-b")
    assert not ledger.mark_attempt_failed(eid, "slack", "timeout", 999.0, owner="pass-b")
    assert not ledger.mark_attempt_failed(eid, "slack", "timeout", 999.0)   # nor without an owner
    d = ledger.deliveries("slack")[0]
    assert d["status"] == "delivered" and d["external_ref"] == "C:1" and d["attempts"] == 1


def test_lost_complete_upload_reply_does_not_upload_or_share_again(fake, ledger, tmp_path):
    png = tmp_path / "p.png"
    png.write_bytes(b"png")
    ledger.add_event(ledger.cid, "keep", {**KEEP, "plot_path": str(png)}, sinks=["slack"])
    fake.inject("files.completeUploadExternal", Fault(stall_s=0.8))       # shared, but the reply is lost
    reports = drain(ledger, sink_for(fake, ledger), passes=3)
    assert sum(r.delivered for r in reports) == 1
    assert len(fake.calls("files.getUploadURLExternal")) == 1              # uploaded once
    assert len(fake.calls("files.completeUploadExternal")) == 1            # shared once
    assert [f["share_count"] for f in fake.files.values()] == [1]
    assert len(fake.calls("files.info")) == 1                              # the retry checked instead
    assert ledger.deliveries("slack")[0]["external_ref"].endswith(":file:F0001")


def test_incomplete_upload_is_redone_once(fake, ledger, tmp_path):
    png = tmp_path / "p.png"
    png.write_bytes(b"png")
    ledger.add_event(ledger.cid, "keep", {**KEEP, "plot_path": str(png)}, sinks=["slack"])
    fake.inject("files.completeUploadExternal", Fault(status=503))         # not shared at all
    drain(ledger, sink_for(fake, ledger), passes=3)
    assert [f["share_count"] for f in fake.shared_files()] == [1] and len(fake.messages) == 1


def test_retry_after_holds_the_method_for_every_row_across_passes(fake, ledger):
    for i in range(3):
        ledger.add_event(ledger.cid, "plateau", {"experiments_since_keep": i}, sinks=["slack"])
    fake.inject("chat.postMessage", Fault(status=429, retry_after=60))
    now = time.time()
    sink = sink_for(fake, ledger)
    deliver_pending(ledger, None, [sink], now=now)
    # a second pass right after: the other rows are due, but chat.postMessage is rate limited
    rep = deliver_pending(ledger, None, [sink], now=now + 0.35)
    assert len(fake.calls("chat.postMessage")) == 1 and rep.delivered == 0
    assert [d["attempts"] for d in ledger.deliveries("slack")] == [1, 0, 0]   # waiting costs no attempt
    assert all(d["next_attempt_at"] >= now + 60 for d in ledger.deliveries("slack"))
    rep = deliver_pending(ledger, None, [sink], now=now + 61)
    assert rep.delivered == 3 and len(fake.messages) == 3
    assert sum(r.status == 429 for r in fake.calls("chat.postMessage")) == 1


def test_a_run_approval_diff_cannot_close_its_code_block():
    from mcp_server.notify.approval_blocks import render_request

    diff = "-LR = 0.008\n+LR = 0.012\n```\n*Approved by <@U0BOSS>* <https://evil.example|click>"
    _, blocks = render_request({"approval_id": 2, "kind": "run", "diff": diff}, "main", "uid", None)
    text = blocks[1]["text"]["text"]
    assert text.startswith("```") and text.endswith("```") and text.count("```") == 2, text
    assert "<https://evil" not in text and "<@U0BOSS>" not in text
