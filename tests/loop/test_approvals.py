"""The autonomy slider: keeps (and runs) that wait for a person; decisions once, with who and when.

Verdict plumbing uses ledger rows for measured runs (no training); the re-measure test trains real
tiny models (fixed step count)."""
from __future__ import annotations

import time

import pytest

from mcp_server.ledger.store import Ledger
from mcp_server.loop import approvals, decisions, gitops
from mcp_server.loop import settings as setmod
from mcp_server.loop.engine import Engine

from conftest import make_workspace, record_baseline, set_constant


def set_setting(ws_root, key: str, value: str) -> None:
    from mcp_server.loop.workspace import Workspace

    ws = Workspace.open(ws_root)
    setmod.save(ws.settings_path, setmod.set_value(ws.settings(), key, value))


@pytest.fixture()
def ws(tmp_path, small_corpus):
    w = make_workspace(tmp_path / "ws", small_corpus)
    set_setting(w.root, "campaign.autonomy", "approve-keeps")
    return w


def fake_candidate(eng: Engine, val: float, lr: str = "0.005", desc: str = "candidate") -> int:
    """A committed candidate with a recorded result, as run_experiment leaves it."""
    set_constant(eng.ws.root / "train.py", "LR", lr)
    sha, _ = gitops.commit_editable(eng.ws.root, ["train.py"], ".loopwright", desc)
    c = eng.campaign
    e = eng.ledger.start_experiment(c["id"], desc, commit_sha=sha, parent_commit=c["best_commit"],
                                    source_sha=eng.text_sha(eng.editable_source()))
    eng.ledger.update_experiment(e, status="ok", val_bpb=val, finished_at=time.time())
    return e


def held_keep(ws, val=1.80, lr="0.005", desc="candidate"):
    with Engine(ws.root) as eng:
        if not eng.ledger.baseline_samples(eng.campaign["id"]):
            record_baseline(eng)
        best_before = eng.campaign["best_commit"]
        eid = fake_candidate(eng, val, lr, desc)
        res = eng.score(eid)
        return eng.ledger.experiment(eid), res, best_before


def test_keep_waits_on_its_branch_and_the_best_does_not_move(ws):
    exp, res, best_before = held_keep(ws)
    assert res.verdict == "pending_approval" and "approval #1" in res.next_step
    assert "try the next idea from the current best" in res.next_step
    with Engine(ws.root) as eng:
        c = eng.campaign
        assert c["best_commit"] == best_before and c["best_experiment_id"] is None
        assert gitops.head_sha(ws.root) == best_before and not gitops.is_dirty(ws.root)
        [a] = eng.ledger.approvals(c["id"])
        assert a["status"] == "pending" and a["kind"] == "keep" and a["experiment_id"] == exp["id"]
        assert a["branch"] == "loopwright-pending/t/1"
        assert gitops.repo(ws.root).commit(a["branch"]).hexsha == exp["commit_sha"]
        assert eng.ledger.experiment(exp["id"])["verdict"] == "pending_approval"
        assert a["expires_at"] == pytest.approx(a["created_at"] + 24 * 3600)
        ev = eng.ledger.events(c["id"], kind="approval_requested")[-1]["payload"]
        assert ev["approval_id"] == 1 and ev["val_bpb"] == pytest.approx(1.80)
        assert eng.summary().pending_score == []   # nothing left for the agent to score


def test_approve_applies_once_and_records_who(ws):
    exp, _, best_before = held_keep(ws)
    a, decided = decisions.decide(ws.root, 1, True, "ana", "cli")
    assert decided and a["status"] == "approved" and a["decided_by"] == "ana" and a["decided_via"] == "cli"
    assert decisions.apply_approved(ws.root) == [f"#1: applied: the best is now {exp['commit_sha'][:10]}"]
    # a second decision (a double click, a late reject) changes nothing
    a2, decided2 = decisions.decide(ws.root, 1, False, "bob", "slack", "changed my mind")
    assert not decided2 and a2["decided_by"] == "ana" and a2["status"] == "applied"
    with Engine(ws.root) as eng:
        c = eng.campaign
        assert c["best_commit"] == exp["commit_sha"] and c["best_experiment_id"] == exp["id"]
        assert gitops.head_sha(ws.root) == exp["commit_sha"]
        assert eng.ledger.experiment(exp["id"])["verdict"] == "keep"
        assert [e["payload"]["approved_by"] for e in eng.ledger.events(c["id"], kind="keep")] == ["ana"]
        assert [e["payload"]["decision"] for e in eng.ledger.events(c["id"], kind="approval_decided")] == ["approved"]
        report = "\n".join(approvals.Approvals(eng).report_section(c["id"]))   # report.md's audit trail
        assert "| 1 | keep |" in report and "| applied | ana | cli |" in report and "Nothing waits." in report


def test_reject_discards_and_the_branch_stays(ws):
    exp, _, best_before = held_keep(ws)
    a, decided = decisions.decide(ws.root, 1, False, "ana", "cli", "overfits the val split")
    assert decided and a["status"] == "rejected" and a["decision_note"] == "overfits the val split"
    assert decisions.apply_approved(ws.root) == []
    with Engine(ws.root) as eng:
        assert eng.campaign["best_commit"] == best_before
        row = eng.ledger.experiment(exp["id"])
        assert row["verdict"] == "discard" and "rejected by ana via cli: overfits" in row["verdict_reason"]


def test_timeout_rejects_as_timeout(ws):
    exp, _, best_before = held_keep(ws)
    with Engine(ws.root) as eng:
        assert approvals.Approvals(eng).expire_due(now=time.time() + 23 * 3600) == []
        assert approvals.Approvals(eng).expire_due(now=time.time() + 25 * 3600) == [1]
        a = eng.ledger.approval(1)
        assert a["status"] == "expired" and a["decided_by"] == "timeout"
        assert eng.ledger.experiment(exp["id"])["verdict"] == "discard"
    # a person's approval after the timeout decides nothing
    a, decided = decisions.decide(ws.root, 1, True, "ana", "cli")
    assert not decided and a["status"] == "expired"
    with Engine(ws.root) as eng:
        assert eng.campaign["best_commit"] == best_before


def test_agent_edit_survives_an_applied_approval(ws):
    exp, _, best_before = held_keep(ws, lr="0.005")
    train = ws.root / "train.py"
    set_constant(train, "DEPTH", "3")          # the agent works on the next idea meanwhile
    decisions.decide(ws.root, 1, True, "ana", "cli")
    assert decisions.apply_approved(ws.root)[0].startswith("#1: applied")
    src = train.read_text()
    assert "LR = 0.005" in src and "DEPTH = 3" in src      # both: the approved change and the agent's edit
    assert gitops.head_sha(ws.root) == exp["commit_sha"]


def test_closed_mode_keeps_at_once(ws):
    set_setting(ws.root, "campaign.autonomy", "closed")
    exp, res, _ = held_keep(ws)
    assert res.verdict == "keep"
    with Ledger(ws.state_dir / "state.db") as led:
        assert led.approvals() == []


def test_unknown_approval_and_nameless_decision(ws):
    with pytest.raises(approvals.ApprovalError, match="no approval #7"):
        decisions.decide(ws.root, 7, True, "ana", "cli")
    held_keep(ws)
    with pytest.raises(approvals.ApprovalError, match="who decides"):
        decisions.decide(ws.root, 1, True, "  ", "cli")


def test_the_agent_may_stop_when_enough_keeps_wait(ws):
    from mcp_server.loop.status import loop_status

    set_setting(ws.root, "campaign.max_waiting", "2")
    held_keep(ws, lr="0.005", desc="a")
    st = loop_status(ws.root)
    assert st["should_stop"] is False and st["waiting_approvals"] == [1]
    _, res, _ = held_keep(ws, lr="0.006", desc="b")
    assert "you may stop now" in res.next_step
    st = loop_status(ws.root)
    assert st["should_stop"] is True and "wait for a person" in st["reason"] and st["waiting_approvals"] == [1, 2]
    from mcp_server.loop.status import session_summary

    summary = session_summary(ws.root)                     # a new session is told what waits
    assert "Waiting for a person (autonomy approve-keeps): #1 pending" in summary and "#2 pending" in summary
    decisions.decide(ws.root, 2, False, "ana", "cli", "no")
    assert loop_status(ws.root)["should_stop"] is False


@pytest.mark.parametrize("command", ["loopwright approve 1", "loopwright -w . reject 1 --why no",
                                     "python -m mcp_server.cli approve --apply", "uv run loopwright approve 2"])
def test_the_agent_cannot_decide(tmp_path, command):
    from mcp_server.guard.policy import policy_from_config
    from mcp_server.guard.pretooluse import decide_pre_tool_use
    from mcp_server.loop.config import PathsConfig

    (tmp_path / "loopwright.toml").write_text("")
    policy = policy_from_config(tmp_path, PathsConfig())
    d = decide_pre_tool_use({"hook_event_name": "PreToolUse", "tool_name": "Bash", "cwd": str(tmp_path),
                             "tool_input": {"command": command}}, policy)
    assert not d.allow and "never decides" in d.reason, d.reason


async def test_no_mcp_tool_decides(ws):
    from mcp import Client

    from mcp_server.mcp.server import build_server

    async with Client(build_server(ws.root)) as client:
        names = [t.name for t in (await client.list_tools()).tools]
    assert names and not [n for n in names if any(w in n for w in ("approv", "reject", "decide"))], names


def test_cli_approve_reject_and_status(ws, capsys):
    from mcp_server.cli.main import main

    exp1, _, _ = held_keep(ws, lr="0.005", desc="first")
    held_keep(ws, lr="0.006", desc="second")
    assert main(["status", "-w", str(ws.root)]) == 0
    out = capsys.readouterr().out
    assert "waiting for a person" in out and "#1 pending" in out and "#2 pending" in out
    assert main(["reject", "2", "-w", str(ws.root), "--why", "too risky", "--by", "ana"]) == 0
    assert main(["approve", "1", "-w", str(ws.root), "--by", "ana"]) == 0
    out = capsys.readouterr().out
    assert "approval #2 rejected by ana: too risky" in out and "#1: applied" in out
    assert main(["approve", "1", "-w", str(ws.root), "--by", "bob"]) == 1          # decided once
    assert "already decided: applied by ana via cli" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["reject", "1", "-w", str(ws.root)])                                   # --why is required
    assert main(["approve", "9", "-w", str(ws.root)]) == 2
    with Engine(ws.root) as eng:
        assert eng.campaign["best_commit"] == exp1["commit_sha"]
        assert [(a["id"], a["status"], a["decided_by"]) for a in eng.ledger.approvals()] == [
            (1, "applied", "ana"), (2, "rejected", "ana")]


@pytest.mark.slow
def test_an_approved_change_behind_the_best_is_remeasured_on_it(tmp_path, small_corpus):
    """Two keeps wait; the first is approved (the best moves); the second, approved later, no longer sits on
    the best: it is carried onto it and trained again there (tiny fixed-step runs) before anything moves."""
    from conftest import hobbled_bench

    w = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench", max_steps=16))
    set_setting(w.root, "campaign.autonomy", "approve-keeps")
    train = w.root / "train.py"
    with Engine(w.root) as eng:
        eng.run_experiment("baseline")
        set_constant(train, "LR", "0.004")                 # the hobbled LR fixed: a large, real gain
        a = eng.run_experiment("normal learning rate")
        assert eng.score(a.experiment_id).verdict == "pending_approval"
        # a second waiting keep, built on the old best (its recorded result stands in for a measured one)
        b = fake_candidate(eng, 1.0, lr="0.0002", desc="long warm-up")
        set_constant(train, "WARMUP_STEPS", "15")          # lines away from LR: it merges cleanly
        sha, _ = gitops.commit_editable(w.root, ["train.py"], ".loopwright", "long warm-up")
        eng.ledger.update_experiment(b, commit_sha=sha, source_sha=eng.text_sha(eng.editable_source()))
        assert eng.score(b).verdict == "pending_approval"
        a_commit = eng.ledger.experiment(a.experiment_id)["commit_sha"]
    decisions.decide(w.root, 1, True, "ana", "cli")
    assert decisions.apply_approved(w.root)[0].startswith("#1: applied")
    set_constant(train, "DEPTH", "3")                      # the agent's uncommitted next idea
    decisions.decide(w.root, 2, True, "ana", "cli")
    [line] = decisions.apply_approved(w.root)
    with Engine(w.root) as eng:
        ap = eng.ledger.approval(2)
        assert ap["status"] in ("stale", "applied"), (line, ap)
        [re] = [r for r in eng.ledger.experiments(eng.campaign["id"])
                if r["description"].startswith("re-measure of approved #2")]
        # the re-measure ran the change carried onto the new best, as a normal experiment
        assert re["parent_commit"] == a_commit and re["status"] == "ok"
        src = gitops.blob_bytes(w.root, re["commit_sha"], "train.py").decode()
        assert "LR = 0.004" in src and "WARMUP_STEPS = 15" in src
        if ap["status"] == "stale":          # not a gain on top of the new best: nothing moved
            assert eng.campaign["best_commit"] == a_commit and line.startswith("#2: stale")
        else:                                # a gain there too: the re-measured commit is the best
            assert ap["status"] == "applied" and eng.campaign["best_commit"] == re["commit_sha"]
        assert f"re-measured as #{re['id']}" in ap["outcome"]
        assert eng.ledger.experiment(b)["verdict"] == "discard"        # superseded by its re-measure
    now = train.read_text()
    assert "DEPTH = 3" in now and "LR = 0.004" in now                   # the agent's edit survived


def test_an_approved_change_that_no_longer_merges_is_a_conflict(ws):
    exp1, _, _ = held_keep(ws, lr="0.005", desc="a")
    with Engine(ws.root) as eng:          # a second keep on the old best, editing the very same line
        eid = fake_candidate(eng, 1.7, lr="0.006", desc="b")
        assert eng.score(eid).verdict == "pending_approval"
    for aid in (1, 2):
        decisions.decide(ws.root, aid, True, "ana", "cli")
    lines = decisions.apply_approved(ws.root)
    assert lines[0].startswith("#1: applied") and lines[1].startswith("#2: conflict"), lines
    with Engine(ws.root) as eng:
        assert eng.ledger.approval(2)["status"] == "conflict"
        assert eng.campaign["best_commit"] == exp1["commit_sha"] == gitops.head_sha(ws.root)
        assert eng.ledger.experiment(eid)["verdict"] == "discard"
        assert not [r for r in eng.ledger.experiments(eng.campaign["id"]) if r["description"].startswith("re-measure")]


def test_an_agent_session_never_holds_the_approval_signing_secrets(ws, tmp_path, monkeypatch):
    """A launched agent with SLACK_SIGNING_SECRET could sign its own button click, and with a connector token post
    as the bot (or as a Jira approver): the launcher passes neither."""
    from mcp_server.agents.launch import launch_session

    dump = tmp_path / "env.txt"
    fake = tmp_path / "claude"
    fake.write_text(f"#!/bin/sh\nenv > {dump}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("LOOPWRIGHT_CLAUDE_BIN", str(fake))
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s3cret-slack")
    monkeypatch.setenv("LOOPWRIGHT_JIRA_SECRET", "s3cret-jira")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-the-launcher-keeps-it")
    launch_session(ws.root, "claude", max_session_minutes=1)
    seen = dump.read_text()
    assert "s3cret-slack" not in seen and "s3cret-jira" not in seen
    assert "LOOPWRIGHT_SESSION_ID=" in seen and "xoxb-the-launcher-keeps-it" not in seen


def test_the_jira_comment_says_how_to_decide():
    from mcp_server.notify.jira import JiraSink, comment_text

    text = comment_text("approval_requested", {"approval_id": 3, "kind": "keep", "experiment_id": 5, "val_bpb": 1.2,
                                               "delta_vs_best": -0.1, "branch": "loopwright-pending/t/3",
                                               "description": "warm-up 5"})
    assert "Approval #3 waits" in text and "/approve 3" in text and "/reject 3" in text and "warm-up 5" in text
    # and the webhook's command pattern reads exactly what the comment suggests
    from mcp_server.triggers.approval_routes import JIRA_COMMAND

    assert JIRA_COMMAND.match("/approve 3").groups()[:2] == ("approve", "3")
    assert JIRA_COMMAND.match("/loopwright reject #3 overfits").groups() == ("reject", "3", "overfits")
    assert JIRA_COMMAND.match("please /approve 3") is None and "approval_requested" in JiraSink.kinds


@pytest.mark.slow
def test_approve_runs_holds_a_change_before_it_runs(tmp_path, small_corpus):
    from mcp_server.loop.status import loop_status

    from e2e_support import fast_workspace

    root = fast_workspace(tmp_path, small_corpus, max_experiments=10)
    set_setting(root, "campaign.autonomy", "approve-runs")
    train = root / "train.py"
    with Engine(root) as eng:
        eng.run_experiment("baseline")                       # the pinned code runs without a person
        c = eng.campaign
        n_before = eng.ledger.count_experiments(c["id"])
        set_constant(train, "LR", "0.004")
        held = eng.run_experiment("normal learning rate")
        assert held.status == "pending_approval" and held.experiment_id is None and held.approval_id == 1
        assert "Nothing ran" in held.next_step
        assert eng.ledger.count_experiments(c["id"]) == n_before            # nothing trained, nothing counted
        assert gitops.head_sha(root) == c["best_commit"] and "LR = 0.0002" in train.read_text()
        a = eng.ledger.approval(1)
        assert a["kind"] == "run" and "LR = 0.004" in gitops.blob_bytes(root, a["commit_sha"], "train.py").decode()
        assert "+LR = 0.004" in eng.ledger.events(c["id"], kind="approval_requested")[-1]["payload"]["diff"]
        set_constant(train, "LR", "0.004")                   # the same change again: the same approval
        assert eng.run_experiment("again").approval_id == 1 and len(eng.ledger.approvals()) == 1
    st = loop_status(root)                                   # nothing to do but wait: the agent may stop
    assert st["should_stop"] is True and "wait for a person" in st["reason"]
    decisions.decide(root, 1, True, "ana", "cli")
    assert loop_status(root)["should_stop"] is False
    with Engine(root) as eng:                                # train.py at the best: the approved change runs
        res = eng.run_experiment("approved: normal learning rate")
        assert res.status == "ok", res
        row = eng.ledger.experiment(res.experiment_id)
        assert "LR = 0.004" in gitops.blob_bytes(root, row["commit_sha"], "train.py").decode()
        assert eng.ledger.approval(1)["status"] == "ran"


def test_the_verdict_migration_keeps_every_row_index_and_link(tmp_path):
    """Migration 9 rebuilds the experiments table (SQLite cannot widen a CHECK): an old ledger loses nothing."""
    import sqlite3

    from mcp_server.ledger import store

    saved = list(store.MIGRATIONS)
    try:
        store.MIGRATIONS[:] = saved[:8]                      # a ledger from before the autonomy slider
        with Ledger(tmp_path / "s.db") as led:
            cid = led.create_campaign("t", "loopwright/t", "abc")
            e1 = led.start_experiment(cid, "a", commit_sha="c1", status="ok", val_bpb=1.5)
            e2 = led.start_experiment(cid, "b", confirm_of=e1, role="confirm")
            led.update_experiment(e1, verdict="keep")
            led.add_note(cid, "lesson", "x", e1)
            with pytest.raises(sqlite3.IntegrityError):
                led.update_experiment(e2, verdict="pending_approval")
            before = [dict(r) for r in led.conn.execute("SELECT * FROM experiments ORDER BY id")]
            indexes = sorted(r[0] for r in led.conn.execute(
                "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='experiments'"))
    finally:
        store.MIGRATIONS[:] = saved
    with Ledger(tmp_path / "s.db") as led:
        assert led.schema_version == len(saved)
        after = [dict(r) for r in led.conn.execute("SELECT * FROM experiments ORDER BY id")]
        # every old column kept as it was (later migrations only add columns, e.g. 14's structured change)
        assert [{k: r[k] for k in before[0]} for r in after] == before
        assert sorted(r[0] for r in led.conn.execute(
            "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='experiments'")) == indexes
        led.update_experiment(e2, verdict="pending_approval")
        assert led.conn.execute("PRAGMA foreign_key_check").fetchall() == []
        with pytest.raises(sqlite3.IntegrityError):          # foreign keys still enforced after the rebuild
            led.start_experiment(cid, "c", confirm_of=999)
        with pytest.raises(sqlite3.IntegrityError):          # and the CHECK still refuses other verdicts
            led.update_experiment(e2, verdict="maybe")


@pytest.mark.slow
def test_the_builtin_agent_stops_when_its_change_waits_for_a_person(tmp_path, small_corpus):
    """approve-runs with the built-in agent over MCP stdio: baseline, one change held, and the session
    ends saying why, instead of proposing change after change that nobody has looked at."""
    from mcp_server.agents.builtin import run_builtin

    from e2e_support import fast_workspace

    root = fast_workspace(tmp_path, small_corpus, max_experiments=10)
    set_setting(root, "campaign.autonomy", "approve-runs")
    res = run_builtin(root, n=5, mechanisms=False, seed=0)
    assert res.stopped_because == "the change waits for a person's approval before it runs"
    assert [a.status for a in res.attempts] == ["pending_approval"]
    with Engine(root) as eng:
        [a] = eng.ledger.approvals()
        assert a["kind"] == "run" and a["status"] == "pending"
        assert not eng.ledger.recent_non_baseline(eng.campaign["id"], limit=1)


def test_a_deferred_approval_is_applied_by_the_next_run(ws):
    """Approved while the loop was busy (recorded only): the agent's next run_experiment applies it first,
    under the loop's lock, and the agent's edit is then built on the new best."""
    exp, _, best_before = held_keep(ws, lr="0.005")
    decisions.decide(ws.root, 1, True, "ana", "cli")          # `loopwright approve 1 --no-apply`
    set_constant(ws.root / "train.py", "DEPTH", "3")           # the agent's next idea
    with Engine(ws.root) as eng:
        c = eng.campaign
        assert c["best_commit"] == best_before
        with eng.exclusive():                                 # what run_experiment does before anything runs
            assert approvals.Approvals(eng).before_run(c, None) is None  # (closed/approve-keeps: then it runs as usual)
        assert eng.campaign["best_commit"] == exp["commit_sha"] == gitops.head_sha(ws.root)
        assert eng.ledger.approval(1)["status"] == "applied"
    src = (ws.root / "train.py").read_text()
    assert "LR = 0.005" in src and "DEPTH = 3" in src


def test_a_held_run_renders_its_diff_with_the_buttons():
    from mcp_server.notify.approval_blocks import parse_value, render_request
    from mcp_server.notify.slack import _keep

    text, blocks = render_request({"approval_id": 4, "kind": "run", "branch": "loopwright-pending/t/4",
                                   "diff": "-LR = 0.0002\n+LR = 0.004 <!channel>", "expires_at": 1.8e9}, "t", "u1", _keep)
    assert text == "Run awaiting approval #4 · t"
    body = blocks[1]["text"]["text"]
    assert "+LR = 0.004" in body and "<!channel>" not in body            # agent text cannot mention @channel
    [actions] = [b for b in blocks if b["type"] == "actions"]
    assert [parse_value(e["value"]) for e in actions["elements"]] == [("u1", 4), ("u1", 4)]
