"""Campaign events from the engine: one crash alert per streak with its real length, campaign_end
recorded and delivered (the Jira closing comment shows the real baseline), a comment-only change refused
as such, tiny time budgets refused with the minimum."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from mcp_server.loop import outcome
from mcp_server.loop.config import JiraConfig, SlackConfig
from mcp_server.loop.engine import Engine, LoopError
from mcp_server.notify.jira import JiraSink
from mcp_server.notify.outbox import deliver_pending
from mcp_server.notify.slack import SlackSink

from conftest import make_workspace, record_baseline, set_constant
from fakes.fake_jira import FakeJira
from fakes.fake_slack import FakeSlack


@pytest.fixture()
def eng(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus)   # crash_streak threshold: the default, 3
    e = Engine(ws.root)
    yield e
    e.ledger.close()


def _finish(eng: Engine, status: str, **fields) -> dict:
    c = eng.campaign
    e = eng.ledger.start_experiment(c["id"], f"try {status}", commit_sha=c["best_commit"])
    eng.ledger.update_experiment(e, status=status, finished_at=time.time(),
                                 reason=fields.pop("reason", f"{status} reason"), **fields)
    return eng.ledger.experiment(e)


def test_crash_alert_once_per_streak_with_the_real_count(eng):
    record_baseline(eng)
    c = eng.campaign
    for i in range(5):                                   # 5 crashes in a row: one alert, at the 3rd
        eng._after_failure(c, _finish(eng, "crash", reason=f"OOM {i}"), None)
    alerts = eng.ledger.events(kind="crash_streak")
    assert [a["payload"]["count"] for a in alerts] == [3]
    assert alerts[0]["payload"]["last_reason"] == "OOM 2"
    _finish(eng, "ok", val_bpb=2.1)                      # the streak ends
    for i in range(4):                                   # a new streak: a new alert
        eng._after_failure(c, _finish(eng, "timeout", reason=f"slow {i}"), None)
    assert [a["payload"]["count"] for a in eng.ledger.events(kind="crash_streak")] == [3, 3]


def test_alert_counts_the_whole_streak_when_the_threshold_is_reached_late(eng):
    record_baseline(eng)
    c = eng.campaign
    for i in range(4):                                   # crashes recorded before the engine judged them
        _finish(eng, "crash")
    eng._after_failure(c, _finish(eng, "rejected", reason="edits prepare.py"), None)
    [alert] = eng.ledger.events(kind="crash_streak")
    assert alert["payload"]["count"] == 5 and alert["payload"]["threshold"] == 3


def test_budget_end_records_campaign_end_and_jira_closes_with_the_real_baseline(eng):
    record_baseline(eng, (2.00, 2.02))
    c = eng.campaign
    for _ in range(3):
        _finish(eng, "crash")
    outcome.record_if_budget_spent(eng, c)
    assert eng.ledger.events(kind="campaign_end") == []     # budget left: the campaign goes on
    eng.ledger.kv_set("stop_requested", "enough for tonight")   # what `/loopwright stop` records
    outcome.record_if_budget_spent(eng, c)
    outcome.record_if_budget_spent(eng, c)                       # once, however often it is checked
    [end] = eng.ledger.events(kind="campaign_end")
    assert end["payload"]["baseline"] == pytest.approx(2.01)
    assert end["payload"]["reasons"] == ["stop requested: enough for tonight"]
    assert end["payload"]["experiments"] == 3 and end["payload"]["crashed"] == 3
    assert len(eng.ledger.events(kind="budget_spent")) == 1
    with FakeJira(token="t") as fj:
        sink = JiraSink(JiraConfig(server=fj.url, project="LW", auth="token"), eng.ledger, token="t", timeout=2)
        rep = deliver_pending(eng.ledger, None, [sink])
        assert rep.failed == 0, rep
        [(key, issue)] = fj.issues.items()
        closing = fj.comments(key)[-1]
        assert "Campaign ended" in closing and "baseline 2.010000" in closing and "n/a" not in closing
        assert issue["fields"]["status"]["name"] == "Done"
    with FakeSlack("xoxb-t") as fs:
        sink = SlackSink(SlackConfig(channel="C0RESEARCH", base_url=fs.api_url), eng.ledger, token="xoxb-t",
                         timeout=2)
        deliver_pending(eng.ledger, None, [sink])
        ends = [m for m in fs.messages if m["text"].endswith("ended")]
        assert len(ends) == 1 and "baseline 2.0100" in ends[0]["blocks"][1]["text"]["text"]


def test_comment_only_change_is_refused_as_such(eng):
    record_baseline(eng)
    train = eng.ws.root / "train.py"
    src = train.read_text()
    import re
    commented = re.sub(r"^(LR = .*)$", r"\n\n\1    # try a schedule next", src, count=1, flags=re.M)
    train.write_text("# notes\n" + commented + "\n# done\n")
    with pytest.raises(LoopError, match=r"only comments/whitespace changed") as e:
        eng.run_experiment("a comment")
    assert "seed" not in str(e.value)
    train.write_text(src)
    set_constant(train, "LR", "0.00123")                 # a real change is not caught by it
    from mcp_server.loop import verdict
    assert not verdict.comments_only_change(src, train.read_text())


@pytest.mark.parametrize("budget", ["10", "0.5", "29"])
def test_tiny_time_budget_is_refused_with_the_minimum(tmp_path, budget):
    r = subprocess.run([sys.executable, "-m", "mcp_server.cli", "init", str(tmp_path / "w"), "--time-budget", budget],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "at least 30 s" in r.stderr and "start-up included" in r.stderr
    assert not (tmp_path / "w").exists()


def test_time_budget_help_says_what_counts():
    r = subprocess.run([sys.executable, "-m", "mcp_server.cli", "init", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert "start-up" in r.stdout and "wall-clock" in r.stdout and "training seconds" not in r.stdout
