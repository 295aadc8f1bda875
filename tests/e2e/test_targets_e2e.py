"""The real Claude Code on a non-GPT target (issue 27), with the plugin loaded and its sandbox on, driven offline
by the scripted fake model (tests/realclients): a write to the frozen evaluator is denied (file unchanged), an
edit of the editable compressor goes through, run_experiment measures the baseline and the candidate over MCP
(the gate, the run and the frozen scorer, each sandboxed), score keeps it, and the ledger holds the keep."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from e2e_support import REPO, experiments, git, h
from realclients.fake_anthropic import ToolUse

pytestmark = [pytest.mark.realclient, pytest.mark.slow]

PLUGIN_TOOL = "mcp__plugin_loopwright_loopwright__"


@pytest.mark.timeout(420)
def test_claude_code_keeps_a_change_on_the_squeeze_target(tmp_path):
    h.require_binary("claude")
    from mcp_server.loop import settings as setmod
    from mcp_server.loop.setup import init_workspace

    ws = init_workspace(tmp_path / "ws", target="squeeze")
    root = ws.root
    # the baseline's two runs and the candidate's two: then the budget is spent and the stop is let through
    setmod.save(ws.settings_path, setmod.set_value(ws.settings(), "budget.max_experiments", "4"))
    evaluate, compressor = root / "evaluate.py", root / "compressor.py"
    before = evaluate.read_bytes()
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
        return "The budget is spent; done."

    script = [
        ToolUse("Read", {"file_path": str(compressor)}),
        ToolUse("Read", {"file_path": str(evaluate)}),
        ToolUse("Write", {"file_path": str(evaluate), "content": "print('{\"ok\": true, \"metric\": 0}')\n"}),
        ToolUse("Edit", {"file_path": str(compressor), "old_string": "\nLEVEL = 1\n", "new_string": "\nLEVEL = 6\n"}),
        ToolUse(PLUGIN_TOOL + "run_experiment", {"description": "LEVEL 1 -> 6",
                                                 "hypothesis": "a higher level finds longer matches"}),
        after_run,
        after_score,
    ]
    sandbox = json.loads((root / ".claude" / "settings.json").read_text())["sandbox"]
    assert sandbox["enabled"] and sandbox["failIfUnavailable"]
    run = h.run_claude(root, script, plugin_dir=REPO, timeout=360, settings={"sandbox": sandbox},
                       run_dir=tempfile.mkdtemp(prefix="lw-", dir="/tmp"),
                       extra_env={"LOOPWRIGHT_PYTHON": sys.executable, "CLAUDE_CODE_STOP_HOOK_BLOCK_CAP": "0",
                                  "MCP_CONNECT_TIMEOUT_MS": "60000"}).check()
    init = run.of_type("system", "init")[0]
    assert {"name": "plugin:loopwright:loopwright", "status": "connected"} in init["mcp_servers"], init["mcp_servers"]
    denied = run.tool_result("toolu_lw_02_0")
    assert denied.is_error and "evaluate.py is frozen" in denied.text, denied.text
    assert evaluate.read_bytes() == before
    assert not run.tool_result("toolu_lw_03_0").is_error
    assert seen["run"]["status"] == "ok", seen["run"]
    assert seen["score"]["verdict"] == "keep", seen["score"]
    rows = experiments(root)
    cand = [r for r in rows if not r["is_baseline"] and r["role"] != "reference"]
    base = [r["val_bpb"] for r in rows if r["is_baseline"]]
    assert base and all(b == 113130.0 for b in base), rows
    assert cand and cand[0]["verdict"] == "keep" and cand[0]["val_bpb"] < 113130.0 - 1
    assert "LEVEL = 6" in git(root, "show", f"{cand[0]['commit_sha']}:compressor.py")
    assert run.final_text == "The budget is spent; done."
    assert "\nLEVEL = 6\n" in Path(root / "compressor.py").read_text()
    brief = run.hook_events("SessionStart")[0].get("stdout") or ""
    assert "compressed_bytes" in brief and "compressor.py" in brief, brief
