"""How a campaign's end reaches Slack and Jira (issue 24 items 5 and 6), with the real slack_sdk and
jira clients against the loopback fakes: `loopwright stop` ends it, and the keep that spent the budget
is announced, with its plot, before the budget_spent and campaign_end it caused."""
from __future__ import annotations

import pytest

from mcp_server.cli.main import main as cli_main
from mcp_server.common.locks import FileLock
from mcp_server.loop.engine import Engine
from mcp_server.notify.outbox import notify_workspace

from conftest import make_workspace, set_constant
from e2e_support import fast_workspace, seed_baseline
from fakes.fake_jira import FakeJira
from fakes.fake_slack import FakeSlack

SLACK_TOKEN, JIRA_TOKEN = "xoxb-test-token", "jira-secret-token"


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.setenv("SLACK_BOT_TOKEN", SLACK_TOKEN)
    monkeypatch.setenv("JIRA_API_TOKEN", JIRA_TOKEN)
    with FakeSlack(SLACK_TOKEN) as slack, FakeJira(cloud=False, token=JIRA_TOKEN) as jira:
        yield slack, jira


def connectors(slack, jira) -> dict:
    return {"slack": {"channel": "C0RESEARCH", "base_url": slack.api_url},
            "jira": {"server": jira.url, "project": "LW", "auth": "token"}}


def headers(slack) -> list[str]:
    return [m["text"].split(" · ")[0] for m in slack.messages]


def test_stop_ends_the_campaign_in_slack_and_jira(fakes, tmp_path, small_corpus, capsys):
    slack, jira = fakes
    ws = make_workspace(tmp_path / "ws", small_corpus, **connectors(slack, jira))
    assert cli_main(["stop", "--reason", "lunch", "-w", str(ws.root)]) == 0
    assert "the campaign ended" in capsys.readouterr().out
    assert headers(slack) == ["Campaign t started", "Budget spent", "Campaign t ended"]
    assert "stop requested: lunch" in slack.messages[1]["blocks"][1]["text"]["text"]
    [(key, issue)] = jira.issues.items()
    assert issue["fields"]["status"]["name"] == "Done"                 # docs/connectors.md: the issue closes
    assert "Campaign ended: stop requested: lunch" in jira.comments(key)[-1]
    assert cli_main(["stop", "--reason", "again", "-w", str(ws.root)]) == 0
    assert len(slack.messages) == 3 and len(jira.comments(key)) == 2  # announced once


def test_stop_during_a_run_ends_the_campaign_after_it(fakes, tmp_path, small_corpus, capsys):
    slack, jira = fakes
    ws = make_workspace(tmp_path / "ws", small_corpus, **connectors(slack, jira))
    with Engine(ws.root) as eng:
        run = eng.ledger.start_experiment(eng.campaign["id"], "in flight")    # status running
    with FileLock(ws.state_dir / "server.lock").try_acquire():              # held by the live run
        assert cli_main(["stop", "-w", str(ws.root)]) == 0
    assert "a run is in flight" in capsys.readouterr().out
    with Engine(ws.root) as eng:
        assert not eng.ledger.events(kind="campaign_end")
        eng.ledger.update_experiment(run, status="crash")
        assert eng.end_if_spent()                          # what the run's end (or budget_check) does
        assert [e["kind"] for e in eng.ledger.events()][-2:] == ["budget_spent", "campaign_end"]


def test_clearing_a_stop_lets_the_next_end_be_announced(fakes, tmp_path, small_corpus):
    slack, jira = fakes
    ws = make_workspace(tmp_path / "ws", small_corpus, **connectors(slack, jira))
    assert cli_main(["stop", "-w", str(ws.root)]) == 0
    assert cli_main(["stop", "--clear", "-w", str(ws.root)]) == 0
    assert cli_main(["stop", "--reason", "for real", "-w", str(ws.root)]) == 0
    assert headers(slack)[-2:] == ["Budget spent", "Campaign t ended"] and len(slack.messages) == 5


def test_the_keep_that_spends_the_budget_goes_first_with_its_plot(fakes, tmp_path, small_corpus):
    """A real run spends the budget; its keep, the budget_spent and the campaign_end reach Slack in that
    order, the keep with a freshly drawn plot, through the pass the launcher runs at a session's end."""
    slack, jira = fakes
    root = fast_workspace(tmp_path, small_corpus, max_experiments=2, **connectors(slack, jira))
    seed_baseline(root, val_bpb=30.0)                     # one run of the budget; any trained model beats it
    set_constant(root / "train.py", "LR", "0.004")
    with Engine(root) as eng:
        res = eng.run_experiment("LR 0.0002 -> 0.004", "a higher LR learns faster")
        assert res.status == "ok" and eng.budget().should_stop
        assert not eng.ledger.events(kind="budget_spent")           # the end waits for the verdict
        assert eng.score(res.experiment_id).verdict == "keep"
        kinds = [e["kind"] for e in eng.ledger.events()]
        assert kinds.index("keep") < kinds.index("budget_spent") < kinds.index("campaign_end")
        progress = eng.ws.reports_dir / "progress.png"
    assert not progress.exists()                                     # no pass has drawn it yet
    rep = notify_workspace(root)
    assert rep.failed == 0, rep
    first, keep, *closing = headers(slack)
    assert first == "Campaign t started" and keep.startswith("New best val_bpb") and \
        closing == ["Budget spent", "Campaign t ended"], headers(slack)
    [plot] = slack.shared_files()
    assert plot["thread_ts"] == slack.messages[1]["ts"] and plot["data"] == progress.read_bytes()
    assert plot["data"].startswith(b"\x89PNG")
    [(key, issue)] = jira.issues.items()
    assert issue["fields"]["status"]["name"] == "Done" and "New best" in jira.comments(key)[0]


def test_a_stop_requested_elsewhere_ends_the_campaign_at_the_agents_budget_check(fakes, tmp_path, small_corpus):
    """The webhook's /loopwright stop only records the request: the agent's next budget_check ends it."""
    slack, jira = fakes
    ws = make_workspace(tmp_path / "ws", small_corpus, **connectors(slack, jira))
    with Engine(ws.root) as eng:
        eng.ledger.request_stop("from Slack")
        assert eng.budget_check().should_stop
        assert [e["kind"] for e in eng.ledger.events()][-2:] == ["budget_spent", "campaign_end"]
        eng.budget_check()
        assert len(eng.ledger.events(kind="campaign_end")) == 1
