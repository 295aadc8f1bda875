"""The webhook receiver: signatures, replay and size limits, dedupe across restarts, one session at a time."""
from __future__ import annotations

import json
import threading
import time

import pytest
from starlette.testclient import TestClient

from mcp_server.ledger.store import Ledger
from mcp_server.loop.config import LoopwrightConfig, WebhookConfig
from mcp_server.triggers.common import SESSION_LOCK, SessionLock
from mcp_server.triggers.webhook import create_app, generic_signature, github_signature, slack_signature

SECRETS = {"LOOPWRIGHT_GITHUB_SECRET": "gh-secret", "SLACK_SIGNING_SECRET": "slack-secret",
           "LOOPWRIGHT_JIRA_SECRET": "jira-secret", "LOOPWRIGHT_WEBHOOK_SECRET": "hook-secret"}
NOW = 1_800_000_000.0


class Sessions:
    """A start_session that records calls; `gate` lets a test hold a session open."""

    def __init__(self):
        self.calls: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, detail: str) -> None:
        self.calls.append(detail)
        self.gate.wait(10)


@pytest.fixture
def env(tmp_path):
    ledger = Ledger(tmp_path / "state.db")
    sessions = Sessions()

    def make(secrets=SECRETS, preflight=None, start=None, **webhook):
        cfg = LoopwrightConfig(webhook=WebhookConfig(**webhook))
        app = create_app(cfg, start or sessions, ledger=ledger, clock=lambda: NOW, state_dir=tmp_path, env=secrets,
                         status_text=lambda: "campaign main: 7 experiments", preflight=preflight)
        return TestClient(app), app

    client, app = make()
    yield type("Env", (), {"client": client, "app": app, "ledger": ledger, "sessions": sessions,
                           "make": staticmethod(make), "dir": tmp_path})
    sessions.gate.set()
    app.state.runner.wait(5)


def gh(client, body: bytes, event="push", delivery="d-1", secret="gh-secret", sig=None, **headers):
    h = {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "Content-Type": "application/json",
         "X-Hub-Signature-256": sig if sig is not None else github_signature(secret, body), **headers}
    return client.post("/github", content=body, headers={k: v for k, v in h.items() if v is not None})


PUSH = json.dumps({"ref": "refs/heads/main", "after": "0123456789abcdef",
                   "repository": {"full_name": "me/research"}}).encode()


def started(e, n: int) -> None:
    assert e.app.state.runner.wait(5)
    assert len(e.sessions.calls) == n, e.sessions.calls


def test_github_published_test_vector():
    assert github_signature("It's a Secret to Everybody", b"Hello, World!") == \
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def test_github_valid_push_starts_exactly_one_session(env):
    r = gh(env.client, PUSH)
    assert r.status_code == 202 and r.json()["status"] == "started"
    started(env, 1)
    assert "github push me/research refs/heads/main 0123456789ab" in env.sessions.calls[0]
    # the same delivery again (GitHub's redelivery): acknowledged, nothing started
    r = gh(env.client, PUSH)
    assert r.status_code == 200 and r.json()["status"] == "duplicate"
    started(env, 1)


def test_github_dedupe_survives_a_restart(env):
    assert gh(env.client, PUSH).status_code == 202
    started(env, 1)
    client2, app2 = env.make()           # a new receiver on the same state dir
    assert gh(client2, PUSH).json()["status"] == "duplicate"
    assert gh(client2, PUSH, delivery="d-2").status_code == 202
    assert app2.state.runner.wait(5)
    assert len(env.sessions.calls) == 2


@pytest.mark.parametrize("sig", ["sha256=" + "0" * 64, "", None, "sha1=abc"])
def test_github_wrong_or_missing_signature_rejected(env, sig):
    r = gh(env.client, PUSH, sig=sig) if sig is not None else env.client.post(
        "/github", content=PUSH, headers={"X-GitHub-Event": "push", "X-GitHub-Delivery": "d-9"})
    assert r.status_code == 401
    started(env, 0)


def test_github_signature_over_a_different_body_rejected(env):
    r = env.client.post("/github", content=PUSH + b" ", headers={
        "X-GitHub-Event": "push", "X-GitHub-Delivery": "d-3", "X-Hub-Signature-256": github_signature("gh-secret", PUSH)})
    assert r.status_code == 401
    started(env, 0)


def test_github_ping_and_ignored_events(env):
    assert gh(env.client, b'{"zen": "hi"}', event="ping").json() == {"status": "pong"}
    own = json.dumps({"ref": "refs/heads/loopwright/main"}).encode()
    assert gh(env.client, own, delivery="d-4").json()["status"] == "ignored"
    assert gh(env.client, b'{"action": "opened"}', event="issues", delivery="d-5").json()["status"] == "ignored"
    comment = json.dumps({"action": "created", "comment": {"body": "looks good"}}).encode()
    assert gh(env.client, comment, event="issue_comment", delivery="d-6").json()["status"] == "ignored"
    started(env, 0)


def test_github_comment_commands_only_from_collaborators(env):
    def comment(body, role):
        return json.dumps({"action": "created", "comment": {"body": body, "author_association": role},
                           "sender": {"login": "ana"}, "repository": {"full_name": "me/r"}}).encode()

    r = gh(env.client, comment("/loopwright start", "NONE"), event="issue_comment", delivery="c-0")
    assert r.json()["status"] == "ignored" and "not an owner" in r.json()["reason"]
    started(env, 0)
    assert gh(env.client, comment("/loopwright start", "MEMBER"), event="issue_comment", delivery="c-1").status_code == 202
    started(env, 1)
    stop = comment("/loopwright stop enough for today", "OWNER")
    assert gh(env.client, stop, event="issue_comment", delivery="c-2").status_code == 202
    assert env.ledger.stop_request() == "enough for today"


def test_missing_secret_disables_the_endpoint(env):
    client, app = env.make(secrets={})
    for path in ("/github", "/slack", "/jira", "/hook"):
        r = client.post(path, content=PUSH, headers={"X-Hub-Signature-256": github_signature("", PUSH)})
        assert r.status_code == 503 and "is not set" in r.json()["error"]
    assert len(env.sessions.calls) == 0


def test_oversized_body_rejected_by_length_and_while_reading(env):
    client, app = env.make(max_body_bytes=2048)
    big = b"x" * 5000
    r = gh(client, big)
    assert r.status_code == 413
    # no Content-Length (chunked): counted while reading
    r = client.post("/github", content=iter([b"x" * 1500, b"x" * 1500]), headers={
        "X-GitHub-Event": "push", "X-GitHub-Delivery": "d-7", "X-Hub-Signature-256": github_signature("gh-secret", big)})
    assert r.status_code == 413
    assert len(env.sessions.calls) == 0


def test_second_start_while_one_runs_is_busy_and_can_be_redelivered(env):
    env.sessions.gate.clear()                          # hold the first session open
    assert gh(env.client, PUSH, delivery="a").status_code == 202
    r = gh(env.client, PUSH, delivery="b")
    assert r.status_code == 409 and r.json()["status"] == "busy"
    env.sessions.gate.set()
    started(env, 1)
    assert gh(env.client, PUSH, delivery="b").status_code == 202   # b was not remembered as seen
    started(env, 2)


def test_session_lock_is_shared_with_cron(env):
    held = SessionLock(env.dir / SESSION_LOCK).try_acquire()    # e.g. a cron session
    try:
        assert gh(env.client, PUSH).status_code == 409
    finally:
        held.release()
    assert gh(env.client, PUSH).status_code == 202
    started(env, 1)


def slack_post(client, text, ts=None, secret="slack-secret", sig=None):
    body = f"command=%2Floopwright&text={text}&user_name=ana&user_id=U1".encode()
    ts = str(int(NOW)) if ts is None else ts
    return client.post("/slack", content=body, headers={
        "Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": sig or slack_signature(secret, ts, body)})


def test_slack_slash_command_start_status_stop(env):
    r = slack_post(env.client, "start")
    assert r.status_code == 200 and r.json()["text"].startswith("Starting")
    started(env, 1)
    assert slack_post(env.client, "status").json()["text"] == "campaign main: 7 experiments"
    r = slack_post(env.client, "stop+too+slow")
    assert "Stop requested" in r.json()["text"]
    assert env.ledger.stop_request() == "too slow"
    assert "usage" in slack_post(env.client, "dance").json()["text"]


def test_slack_bad_stale_and_replayed_requests_rejected(env):
    assert slack_post(env.client, "start", sig="v0=" + "1" * 64).status_code == 401
    assert slack_post(env.client, "start", secret="other").status_code == 401
    assert slack_post(env.client, "start", ts=str(int(NOW) - 301)).status_code == 401
    assert slack_post(env.client, "start", ts=str(int(NOW) + 301)).status_code == 401
    assert slack_post(env.client, "start", ts="soon").status_code == 401
    started(env, 0)
    assert slack_post(env.client, "start").status_code == 200
    started(env, 1)
    r = slack_post(env.client, "start")                     # the same signed request, replayed
    assert "Duplicate" in r.json()["text"]
    started(env, 1)


def jira_post(client, payload, ident="j-1", secret="jira-secret", sig=None):
    body = json.dumps(payload).encode()
    return client.post("/jira", content=body, headers={
        "Content-Type": "application/json", "X-Atlassian-Webhook-Identifier": ident,
        "X-Hub-Signature": sig or github_signature(secret, body)})


def test_jira_comment_starts_once_and_signature_checked(env):
    payload = {"webhookEvent": "comment_created", "issue": {"key": "LW-1"},
               "comment": {"body": "/loopwright start", "author": {"displayName": "Ana"}}}
    assert jira_post(env.client, payload, secret="wrong").status_code == 401
    assert jira_post(env.client, payload).status_code == 202
    started(env, 1)
    assert jira_post(env.client, payload).json()["status"] == "duplicate"
    # our own comments (kept improvements) and issue updates never start sessions
    own = {"webhookEvent": "comment_created", "comment": {"body": "New best val_bpb 0.91"}}
    assert jira_post(env.client, own, ident="j-2").json()["status"] == "ignored"
    assert jira_post(env.client, {"webhookEvent": "jira:issue_updated"}, ident="j-3").json()["status"] == "ignored"
    started(env, 1)


def hook_post(client, payload=None, ts=None, delivery="h-1", secret="hook-secret", sign_ts=None):
    body = json.dumps(payload).encode() if payload is not None else b""
    ts = str(int(NOW)) if ts is None else ts
    return client.post("/hook", content=body, headers={
        "X-Loopwright-Timestamp": ts, "X-Loopwright-Delivery": delivery,
        "X-Loopwright-Signature": generic_signature(secret, sign_ts or ts, body)})


def test_generic_hook(env):
    assert hook_post(env.client, secret="nope").status_code == 401
    assert hook_post(env.client, ts=str(int(NOW) - 1000)).status_code == 401
    # a signature made for another timestamp does not verify with this one
    assert hook_post(env.client, ts=str(int(NOW) - 5), sign_ts=str(int(NOW) - 6)).status_code == 401
    assert hook_post(env.client).status_code == 202
    started(env, 1)
    assert hook_post(env.client).json()["status"] == "duplicate"
    r = hook_post(env.client, {"action": "status"}, delivery="h-2")
    assert r.json()["text"] == "campaign main: 7 experiments"
    assert hook_post(env.client, {"action": "stop", "reason": "r"}, delivery="h-3").status_code == 202
    assert env.ledger.stop_request() == "r"
    assert hook_post(env.client, {"action": "explode"}, delivery="h-4").status_code == 400
    started(env, 1)


def test_a_start_that_cannot_start_is_refused_and_a_redelivery_after_the_fix_starts(env):
    """New-user trial: `claude` missing, the receiver still answered 202 "started" and then remembered the
    delivery id, so the sender's retry after the fix was a "duplicate" that never started anything."""
    problem = ["cannot start a claude session: `claude` is not on PATH"]
    client, app = env.make(preflight=lambda: problem[0] if problem else None)
    r = hook_post(client)
    assert r.status_code == 503 and "`claude` is not on PATH" in r.json()["error"]
    assert slack_post(client, "start").json()["text"].startswith("Not done: not starting a session: cannot start")
    assert not env.sessions.calls
    problem.clear()                                             # the client installed
    assert hook_post(client).status_code == 202                 # the same delivery id: now it starts
    assert app.state.runner.wait(5) and len(env.sessions.calls) == 1


def test_a_session_the_launcher_refuses_frees_its_delivery_id(env):
    from mcp_server.agents.launch import LaunchError

    refusals = []

    def refuse(detail):
        refusals.append(detail)
        raise LaunchError("budget spent")

    client, app = env.make(start=refuse)
    assert hook_post(client).status_code == 202                 # accepted: the refusal comes in the thread
    assert app.state.runner.wait(5) and len(refusals) == 1
    assert hook_post(client).status_code == 202                 # not a duplicate: it is tried again
    assert app.state.runner.wait(5) and len(refusals) == 2


def test_healthz(env):
    assert env.client.get("/healthz").json() == {"ok": True, "session_running": False}


def test_background_start_replies_before_the_session_ends(env):
    env.sessions.gate.clear()
    t0 = time.monotonic()
    assert gh(env.client, PUSH).status_code == 202
    assert time.monotonic() - t0 < 2 and env.client.get("/healthz").json()["session_running"]
    env.sessions.gate.set()
    started(env, 1)


@pytest.mark.parametrize("event,payload,field", [
    ("push", {"ref": "refs/heads/main", "repository": "me/research"}, "repository"),
    ("workflow_run", {"action": "completed", "repository": {"full_name": "a/b"}, "workflow_run": "ci"},
     "workflow_run"),
    ("issue_comment", {"action": "created", "comment": "/loopwright start"}, "comment"),
    ("issue_comment", {"action": "created", "comment": {"body": ["/loopwright", "start"]}}, "comment.body"),
    ("issue_comment", {"action": "created", "comment": {"body": "hi"}, "sender": 7}, "sender"),
])
def test_github_payload_of_the_wrong_shape_is_a_400_with_the_field(env, event, payload, field):
    r = gh(env.client, json.dumps(payload).encode(), event=event)
    assert r.status_code == 400, r.text
    assert f"payload field '{field}' must be" in r.json()["error"]
    assert env.sessions.calls == []


@pytest.mark.parametrize("payload,field", [
    ({"webhookEvent": "comment_created", "comment": "/loopwright start"}, "comment"),
    ({"webhookEvent": "comment_created", "comment": {"body": "/loopwright start"}, "issue": "RES-1"}, "issue"),
    ({"webhookEvent": "comment_created", "comment": {"body": "/loopwright start", "author": "me"}},
     "comment.author"),
])
def test_jira_payload_of_the_wrong_shape_is_a_400_with_the_field(env, payload, field):
    r = jira_post(env.client, payload)
    assert r.status_code == 400, r.text
    assert f"payload field '{field}' must be an object" in r.json()["error"]
    assert env.sessions.calls == []


def test_the_default_preflight_names_a_missing_client_and_a_spent_budget(tmp_path, small_corpus, monkeypatch):
    from mcp_server.triggers.webhook import default_preflight

    from conftest import make_workspace

    ws = make_workspace(tmp_path / "ws", small_corpus)
    monkeypatch.setenv("LOOPWRIGHT_CLAUDE_BIN", str(tmp_path / "no-bin" / "claude"))
    problem = default_preflight(ws.root, ws.cfg)()               # [webhook] agent = claude (the default)
    assert problem and "LOOPWRIGHT_CLAUDE_BIN" in problem and "not an executable file" in problem
    builtin = ws.cfg.model_copy(update={"webhook": ws.cfg.webhook.model_copy(update={"agent": "builtin"})})
    assert default_preflight(ws.root, builtin)() is None
    with Ledger(ws.state_dir / "state.db") as led:
        led.request_stop("enough for today")
    problem = default_preflight(ws.root, builtin)()
    assert problem and "budget says stop" in problem and "enough for today" in problem
