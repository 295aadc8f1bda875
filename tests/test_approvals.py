"""The autonomy slider: keeps (and runs) that wait for a person; decisions once, with who and when.

Verdict plumbing uses ledger rows for measured runs (no training); the re-measure test trains real
tiny models (fixed step count)."""
from __future__ import annotations

import time

import pytest

from conftest import make_workspace, set_constant
from mcp_server.ledger.store import Ledger
from mcp_server.loop import approvals, gitops
from mcp_server.loop import settings as setmod
from mcp_server.loop.engine import Engine


def set_setting(ws_root, key: str, value: str) -> None:
    from mcp_server.loop.workspace import Workspace

    ws = Workspace.open(ws_root)
    setmod.save(ws.settings_path, setmod.set_value(ws.settings(), key, value))


@pytest.fixture()
def ws(tmp_path, small_corpus):
    w = make_workspace(tmp_path / "ws", small_corpus)
    set_setting(w.root, "campaign.autonomy", "approve-keeps")
    return w


def fake_baseline(eng: Engine, values=(2.00, 2.01)):
    c = eng.campaign
    for i, v in enumerate(values):
        e = eng.ledger.start_experiment(c["id"], f"baseline {i}", is_baseline=1, commit_sha=c["best_commit"],
                                        seed=1000 + i)
        eng.ledger.update_experiment(e, status="ok", val_bpb=v, verdict="baseline", finished_at=time.time())


def fake_candidate(eng: Engine, val: float, lr: str = "0.005", desc: str = "candidate") -> int:
    """A committed candidate with a recorded result, as run_experiment leaves it."""
    set_constant(eng.ws.root / "train.py", "LR", lr)
    sha, _ = gitops.commit_editable(eng.ws.root, ["train.py"], ".loopwright", desc)
    c = eng.campaign
    e = eng.ledger.start_experiment(c["id"], desc, commit_sha=sha, parent_commit=c["best_commit"],
                                    source_sha=eng._sha(eng._editable_source()))
    eng.ledger.update_experiment(e, status="ok", val_bpb=val, finished_at=time.time())
    return e


def held_keep(ws, val=1.80, lr="0.005", desc="candidate"):
    with Engine(ws.root) as eng:
        if not eng.ledger.baseline_samples(eng.campaign["id"]):
            fake_baseline(eng)
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
    a, decided = approvals.decide(ws.root, 1, True, "ana", "cli")
    assert decided and a["status"] == "approved" and a["decided_by"] == "ana" and a["decided_via"] == "cli"
    assert approvals.apply_approved(ws.root) == [f"#1: applied: the best is now {exp['commit_sha'][:10]}"]
    # a second decision (a double click, a late reject) changes nothing
    a2, decided2 = approvals.decide(ws.root, 1, False, "bob", "slack", "changed my mind")
    assert not decided2 and a2["decided_by"] == "ana" and a2["status"] == "applied"
    with Engine(ws.root) as eng:
        c = eng.campaign
        assert c["best_commit"] == exp["commit_sha"] and c["best_experiment_id"] == exp["id"]
        assert gitops.head_sha(ws.root) == exp["commit_sha"]
        assert eng.ledger.experiment(exp["id"])["verdict"] == "keep"
        assert [e["payload"]["approved_by"] for e in eng.ledger.events(c["id"], kind="keep")] == ["ana"]
        assert [e["payload"]["decision"] for e in eng.ledger.events(c["id"], kind="approval_decided")] == ["approved"]


def test_reject_discards_and_the_branch_stays(ws):
    exp, _, best_before = held_keep(ws)
    a, decided = approvals.decide(ws.root, 1, False, "ana", "cli", "overfits the val split")
    assert decided and a["status"] == "rejected" and a["decision_note"] == "overfits the val split"
    assert approvals.apply_approved(ws.root) == []
    with Engine(ws.root) as eng:
        assert eng.campaign["best_commit"] == best_before
        row = eng.ledger.experiment(exp["id"])
        assert row["verdict"] == "discard" and "rejected by ana via cli: overfits" in row["verdict_reason"]


def test_timeout_rejects_as_timeout(ws):
    exp, _, best_before = held_keep(ws)
    with Engine(ws.root) as eng:
        assert approvals.expire_due(eng, now=time.time() + 23 * 3600) == []
        assert approvals.expire_due(eng, now=time.time() + 25 * 3600) == [1]
        a = eng.ledger.approval(1)
        assert a["status"] == "expired" and a["decided_by"] == "timeout"
        assert eng.ledger.experiment(exp["id"])["verdict"] == "discard"
    # a person's approval after the timeout decides nothing
    a, decided = approvals.decide(ws.root, 1, True, "ana", "cli")
    assert not decided and a["status"] == "expired"
    with Engine(ws.root) as eng:
        assert eng.campaign["best_commit"] == best_before


def test_agent_edit_survives_an_applied_approval(ws):
    exp, _, best_before = held_keep(ws, lr="0.005")
    train = ws.root / "train.py"
    set_constant(train, "DEPTH", "3")          # the agent works on the next idea meanwhile
    approvals.decide(ws.root, 1, True, "ana", "cli")
    assert approvals.apply_approved(ws.root)[0].startswith("#1: applied")
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
        approvals.decide(ws.root, 7, True, "ana", "cli")
    held_keep(ws)
    with pytest.raises(approvals.ApprovalError, match="who decides"):
        approvals.decide(ws.root, 1, True, "  ", "cli")


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
    approvals.decide(ws.root, 2, False, "ana", "cli", "no")
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
