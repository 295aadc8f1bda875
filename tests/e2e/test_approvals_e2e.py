"""approve-keeps inside the real Claude Code (plugin loaded, scripted fake model, real training over MCP):
the agent's keep waits for a person, the agent goes on from the best, and the human's CLI applies it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_approvals import set_setting

from mcp_server.loop import gitops
from mcp_server.loop.engine import Engine

from e2e_support import REPO, experiments, git, h, seed_baseline
from realclients.fake_anthropic import ToolUse

pytestmark = [pytest.mark.realclient, pytest.mark.slow]

PLUGIN_TOOL = "mcp__plugin_loopwright_loopwright__"
OLD_LR, NEW_LR = "LR = 0.0002", "LR = 0.004"


def _workspace(tmp, corpus):
    """fast_workspace's one-block GPT, with a short warm-up so that 6 steps show the LR fix clearly."""
    from conftest import hobbled_bench, make_workspace, set_constant

    bench = hobbled_bench(tmp / "bench", max_steps=6)
    for name, value in (("DEPTH", "1"), ("D_MODEL", "64"), ("WARMUP_STEPS", "1")):
        set_constant(bench / "train.py", name, value)
    return make_workspace(tmp / "ws", corpus, bench_dir=bench,
                          benchmark={"time_budget": 30.0, "grace_seconds": 60.0, "eval_tokens": 2048},
                          noise={"baseline_seeds": 1},
                          budget={"max_experiments": 10, "max_hours": 10.0, "max_cost_usd": 10.0}).root


@pytest.mark.timeout(480)
def test_claude_code_keep_waits_the_agent_continues_and_the_cli_approves(tmp_path, small_corpus):
    h.require_binary("claude")
    root = _workspace(tmp_path, small_corpus)
    seed_baseline(root)
    set_setting(root, "campaign.autonomy", "approve-keeps")
    set_setting(root, "campaign.max_waiting", "1")     # one waiting keep: the agent may stop
    train = root / "train.py"
    pinned = gitops.head_sha(root)
    seen: dict = {}

    def after_run(req):
        res = req.last_tool_results()[0]
        assert not res.is_error, res.text
        seen["run"] = json.loads(res.text)
        return ToolUse(PLUGIN_TOOL + "score", {"experiment_id": seen["run"]["experiment_id"]})

    def after_score(req):
        res = req.last_tool_results()[0]
        assert not res.is_error, res.text
        seen["score"] = json.loads(res.text)
        # Claude Code notices the loop's revert of train.py on its own and tells the model with this turn
        seen["noticed"] = req.user_texts_after_last_assistant()
        return ToolUse("Read", {"file_path": str(train)})       # the agent goes on: what is train.py now?

    def after_read(req):
        seen["read"] = req.last_tool_results()[0].text
        return ToolUse(PLUGIN_TOOL + "budget_check", {})

    def after_budget(req):
        seen["budget"] = json.loads(req.last_tool_results()[0].text)
        return "The keep waits for a person; stopping."

    script = [
        ToolUse("Read", {"file_path": str(train)}),
        ToolUse("Edit", {"file_path": str(train), "old_string": OLD_LR, "new_string": NEW_LR}),
        ToolUse(PLUGIN_TOOL + "run_experiment", {"description": "normal learning rate",
                                                  "hypothesis": "LR 2e-4 is far too low"}),
        after_run,
        after_score,
        after_read,
        after_budget,
    ]
    run = h.run_claude(root, script, plugin_dir=REPO, timeout=420,
                       extra_env={"LOOPWRIGHT_PYTHON": sys.executable, "CLAUDE_CODE_STOP_HOOK_BLOCK_CAP": "0",
                                 "MCP_CONNECT_TIMEOUT_MS": "60000"}).check()

    # budget remains, yet the Stop hook lets the agent stop: everything waits on a person
    assert seen["budget"]["should_stop"] is False
    stops = run.hook_events("Stop")
    assert len(stops) == 1 and "block" not in (stops[0].get("stdout") or ""), stops
    assert run.final_text == "The keep waits for a person; stopping."
    # the verifier's keep became a pending approval: told to the agent, the best unmoved
    assert seen["run"]["status"] == "ok", seen["run"]
    assert seen["score"]["verdict"] == "pending_approval", seen["score"]
    assert "approval #1" in seen["score"]["next_step"] and "current best" in seen["score"]["next_step"]
    # it works on from the best: the file is back at it, and the agent is told so (by Claude Code's note of
    # the change when it noticed the revert -- then its Read is deduplicated -- or by the Read itself)
    assert OLD_LR in train.read_text() and NEW_LR not in train.read_text()
    if "unchanged since your last Read" in seen["read"]:
        assert "train.py was modified" in seen["noticed"] and OLD_LR in seen["noticed"], seen["noticed"][:500]
    else:
        assert OLD_LR in seen["read"] and NEW_LR not in seen["read"], seen["read"][:500]
    cand = experiments(root)[-1]
    assert cand["verdict"] == "pending_approval" and NEW_LR in git(root, "show", f"{cand['commit_sha']}:train.py")
    with Engine(root) as eng:
        assert eng.campaign["best_commit"] == pinned
    assert git(root, "rev-parse", "loopwright-pending/t/1").strip() == cand["commit_sha"]

    # the person approves from the CLI (a separate process, as at a terminal): the change is applied
    out = subprocess.run([sys.executable, "-m", "mcp_server.cli", "approve", "1", "-w", str(root), "--by", "ana"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "approval #1 approved by ana" in out.stdout and "#1: applied" in out.stdout
    with Engine(root) as eng:
        c = eng.campaign
        assert c["best_commit"] == cand["commit_sha"] == gitops.head_sha(root)
        assert eng.ledger.experiment(cand["id"])["verdict"] == "keep"
        a = eng.ledger.approval(1)
        assert (a["status"], a["decided_by"], a["decided_via"]) == ("applied", "ana", "cli")
    assert NEW_LR in train.read_text()
