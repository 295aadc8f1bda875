"""Approvals from Slack buttons and Jira comments: the real slack_sdk against the loopback Slack fake,
signed interaction payloads shaped like Slack's, and the outcome in the ledger and in git."""
from __future__ import annotations

import copy
import json
import time
from urllib.parse import urlencode

import pytest
from starlette.testclient import TestClient
from test_approvals import held_keep

from mcp_server.ledger.store import Ledger
from mcp_server.loop import approvals, decisions, gitops
from mcp_server.loop import settings as setmod
from mcp_server.loop.engine import Engine
from mcp_server.notify.outbox import deliver_pending
from mcp_server.triggers.webhook import create_app, github_signature, slack_signature

from conftest import make_workspace
from fakes.fake_slack import FakeSlack

TOKEN, SECRET, JIRA_SECRET = "xoxb-test-token", "slack-signing-secret", "jira-secret"
ANA, EVE = "U0ANA", "U0EVE"


@pytest.fixture()
def env(tmp_path, small_corpus):
    with FakeSlack(TOKEN) as fake:
        ws = make_workspace(tmp_path / "ws", small_corpus)
        data = setmod.data_of(ws.settings())
        data["campaign"].update(autonomy="approve-keeps", slack_approvers=[ANA], jira_approvers=["acc-ana"])
        data["slack"] = {"channel": "C0RESEARCH", "base_url": fake.api_url}
        data["jira"] = {"server": "https://jira.invalid", "project": "RES"}
        setmod.save(ws.settings_path, setmod.validate(data))
        secrets = {"SLACK_SIGNING_SECRET": SECRET, "SLACK_BOT_TOKEN": TOKEN, "LOOPWRIGHT_JIRA_SECRET": JIRA_SECRET}
        app = create_app(ws.root, start_session=lambda detail: None, env=secrets)
        exp, _, best_before = held_keep(ws)
        with Ledger(ws.state_dir / "state.db") as led:
            # the keep message with its buttons goes out through the real sink (slack_sdk)
            rep = deliver_pending(led, ws.cfg, env={"SLACK_BOT_TOKEN": TOKEN})
            assert rep.delivered >= 1, rep
        yield type("Env", (), {"ws": ws, "fake": fake, "client": TestClient(app), "app": app, "exp": exp,
                               "best_before": best_before, "request": copy.deepcopy(request_msg(fake))})


def request_msg(fake) -> dict:
    [m] = [m for m in fake.messages if m["text"].startswith("Awaiting approval #1")]
    return m


def click(e, action: str, user: str = ANA, ts: int | None = None, secret: str = SECRET, sig: str | None = None):
    """A signed Slack interactivity request for a button of the request message, as Slack sends it (from
    the message as first posted: a second click can come from a client that has not seen the update)."""
    msg = e.request
    [buttons] = [b for b in msg["blocks"] if b["type"] == "actions"]
    [button] = [b for b in buttons["elements"] if b["action_id"] == f"loopwright_{action}"]
    payload = {"type": "block_actions", "user": {"id": user, "username": user.lower()}, "api_app_id": "A0APP",
               "trigger_id": "1.2.3", "team": {"id": "T000"}, "channel": {"id": msg["channel"], "name": "research"},
               "container": {"type": "message", "message_ts": msg["ts"], "channel_id": msg["channel"]},
               "message": {"type": "message", "ts": msg["ts"], "text": msg["text"], "blocks": msg["blocks"]},
               "response_url": "https://hooks.slack.invalid/actions/T000/1/x",
               "actions": [{"type": "button", "action_id": button["action_id"], "block_id": buttons["block_id"],
                            "value": button["value"], "action_ts": str(time.time())}]}
    body = urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(time.time()) if ts is None else ts)
    return body, {"Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": ts,
                  "X-Slack-Signature": sig or slack_signature(secret, ts, body)}


def post(e, body, headers):
    r = e.client.post("/slack/interactive", content=body, headers=headers)
    for t in e.app.state.appliers:
        t.join(60)
    return r


def state(e):
    with Engine(e.ws.root) as eng:
        return eng.ledger.approval(1), eng.campaign, eng.ledger.experiment(e.exp["id"])


def test_the_keep_message_carries_the_buttons(env):
    msg = request_msg(env.fake)
    [buttons] = [b for b in msg["blocks"] if b["type"] == "actions"]
    assert [b["action_id"] for b in buttons["elements"]] == ["loopwright_approve", "loopwright_reject"]
    assert "loopwright-pending/t/1" in json.dumps(msg["blocks"])


def test_approve_from_slack_applies_and_updates_the_message(env):
    r = post(env, *click(env, "approve"))
    assert r.status_code == 200 and r.json()["status"] == "decided", r.json()
    a, c, exp = state(env)
    assert a["status"] == "applied" and a["decided_by"] == f"slack:{ANA}" and a["decided_via"] == "slack"
    assert c["best_commit"] == env.exp["commit_sha"] and exp["verdict"] == "keep"
    assert gitops.head_sha(env.ws.root) == env.exp["commit_sha"]
    [msg] = [m for m in env.fake.messages if m.get("edited")]
    assert not [b for b in msg["blocks"] if b["type"] == "actions"]          # buttons gone
    assert f"Approved by <@{ANA}>" in json.dumps(msg["blocks"]) and len(env.fake.updates) == 1


def test_reject_from_slack(env):
    r = post(env, *click(env, "reject"))
    assert r.json()["status"] == "decided"
    a, c, exp = state(env)
    assert a["status"] == "rejected" and a["decided_by"] == f"slack:{ANA}"
    assert c["best_commit"] == env.best_before and exp["verdict"] == "discard"
    assert gitops.head_sha(env.ws.root) == env.best_before
    assert "Rejected by" in json.dumps([m for m in env.fake.messages if m.get("edited")][0]["blocks"])


def test_double_click_decides_once(env):
    first = post(env, *click(env, "approve", ts=int(time.time())))
    second = post(env, *click(env, "reject", ts=int(time.time()) + 1))     # a second, different request
    assert first.json()["status"] == "decided" and second.json()["status"] == "already decided"
    a, c, _ = state(env)
    assert a["status"] == "applied" and c["best_commit"] == env.exp["commit_sha"]
    with Ledger(env.ws.state_dir / "state.db") as led:
        assert len(led.events(kind="approval_decided")) == 1 and len(led.events(kind="keep")) == 1
    # the message shows the one decision that counts
    assert "Approved by" in json.dumps([m for m in env.fake.messages if m.get("edited")][0]["blocks"])


def test_forged_signature_and_stale_timestamp_decide_nothing(env):
    body, headers = click(env, "approve", secret="not-the-secret")
    assert post(env, body, headers).status_code == 401
    body, headers = click(env, "approve", ts=int(time.time()) - 600)
    assert post(env, body, headers).status_code == 401
    a, c, _ = state(env)
    assert a["status"] == "pending" and c["best_commit"] == env.best_before and env.fake.updates == []


def test_replayed_request_does_nothing(env):
    body, headers = click(env, "reject")
    assert post(env, body, headers).json()["status"] == "decided"
    assert post(env, body, headers).json() == {"status": "duplicate"}
    with Ledger(env.ws.state_dir / "state.db") as led:
        assert len(led.events(kind="approval_decided")) == 1
    assert len(env.fake.updates) == 1


def test_user_not_on_the_allow_list(env):
    r = post(env, *click(env, "approve", user=EVE))
    assert r.status_code == 200 and r.json()["status"] == "forbidden" and EVE in r.json()["reason"]
    a, c, _ = state(env)
    assert a["status"] == "pending" and a["decided_by"] is None and c["best_commit"] == env.best_before
    assert env.fake.updates == []


def test_timeout_then_a_late_click(env):
    with Engine(env.ws.root) as eng:
        assert approvals.Approvals(eng).expire_due(now=time.time() + 25 * 3600) == [1]
    r = post(env, *click(env, "approve"))
    assert r.json()["status"] == "already decided" and r.json()["decision"] == "expired"
    a, c, exp = state(env)
    assert a["decided_by"] == "timeout" and c["best_commit"] == env.best_before and exp["verdict"] == "discard"
    assert gitops.head_sha(env.ws.root) == env.best_before
    assert "Expired by timeout" in json.dumps([m for m in env.fake.messages if m.get("edited")][0]["blocks"])


def test_a_cli_decision_updates_the_slack_message_through_the_outbox(env):
    decisions.decide(env.ws.root, 1, True, "ana", "cli")
    with Ledger(env.ws.state_dir / "state.db") as led:
        assert deliver_pending(led, env.ws.cfg, env={"SLACK_BOT_TOKEN": TOKEN}).delivered == 1
    [m] = [m for m in env.fake.messages if m.get("edited")]
    assert "Approved by ana" in json.dumps(m["blocks"]) and not [b for b in m["blocks"] if b["type"] == "actions"]


def jira_post(e, body_text, issue="RES-7", author=None, ident="j-1", secret=JIRA_SECRET):
    payload = {"webhookEvent": "comment_created", "issue": {"key": issue},
               "comment": {"body": body_text, "author": author or {"accountId": "acc-ana", "displayName": "Ana"}}}
    body = json.dumps(payload).encode()
    r = e.client.post("/jira", content=body, headers={
        "Content-Type": "application/json", "X-Atlassian-Webhook-Identifier": ident,
        "X-Hub-Signature": github_signature(secret, body)})
    for t in e.app.state.appliers:
        t.join(60)
    return r


def test_jira_approval_through_a_signed_webhook(env):
    with Engine(env.ws.root) as eng:
        eng.ledger.kv_set(f"jira.issue.RES.{eng.campaign['id']}", "RES-7")   # the campaign's issue
    assert jira_post(env, "/approve 1", secret="wrong").status_code == 401
    assert jira_post(env, "/approve 1", issue="RES-99", ident="j-2").json()["status"] == "ignored"
    r = jira_post(env, "/approve 1", author={"accountId": "acc-eve", "displayName": "Eve"}, ident="j-3")
    assert r.json()["status"] == "forbidden"
    assert state(env)[0]["status"] == "pending"
    r = jira_post(env, "/approve 1", ident="j-4")
    assert r.json()["status"] == "decided", r.json()
    assert jira_post(env, "/approve 1", ident="j-4").json() == {"status": "duplicate"}
    a, c, _ = state(env)
    assert a["status"] == "applied" and a["decided_by"] == "jira:acc-ana" and a["decided_via"] == "jira"
    assert c["best_commit"] == env.exp["commit_sha"] == gitops.head_sha(env.ws.root)
