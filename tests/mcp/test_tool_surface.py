"""The tools an agent sees: the reviewer is granted every tool it is told to call, the skill says to retry
a missing tool, and listing tools imports none of the heavy modules."""
from __future__ import annotations

import subprocess
import sys


# -- item 6 and 7: the reviewer may call the tools it is told to use; the skill says to retry -------
def _front_matter(path):
    text = path.read_text()
    head = text.split("---", 2)[1]
    return dict(line.split(":", 1) for line in head.strip().splitlines()), text.split("---", 2)[2]


def test_reviewer_is_granted_every_loopwright_tool_it_is_told_to_call():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    meta, body = _front_matter(root / "agents" / "reviewer.md")
    granted = {t.strip() for t in meta["tools"].split(",")}
    loop_tools = {"run_experiment", "score", "revert", "budget_check", "state_read", "note", "suggest_next"}
    told = {name for name in re.findall(r"`(\w+)\(", body) if name in loop_tools}
    forbidden = {"run_experiment", "score", "revert"}          # "never call run_experiment, score or revert"
    told -= forbidden
    assert told >= {"state_read"}
    for tool in told:   # under both wirings: the plugin's server name and the workspace's
        assert f"mcp__plugin_loopwright_loopwright__{tool}" in granted, tool
        assert f"mcp__loopwright__{tool}" in granted, tool
    assert not any(g.endswith(f"__{t}") for g in granted for t in forbidden)   # read-only stays read-only
    assert not {"Edit", "Write", "MultiEdit", "NotebookEdit"} & granted


def test_skill_tells_the_agent_to_retry_a_missing_tool_once():
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[2] / "skills" / "research-loop" / "SKILL.md")
                    .read_text().split())
    assert "No such tool available" in text and "retry it once" in text and "unsupported call" in text


# -- item 7: listing the tools needs none of the heavy modules -----------------------------------
def test_listing_tools_imports_no_engine_torch_matplotlib_or_connectors(tmp_path):
    code = ("import sys, asyncio\n"
            "from mcp_server.mcp.server import build_server\n"
            f"srv = build_server({str(tmp_path / 'not-yet')!r}, strict=False)\n"
            "from mcp import Client\n"
            "async def main():\n"
            "    async with Client(srv) as c:\n"
            "        print(len((await c.list_tools()).tools))\n"
            "asyncio.run(main())\n"
            "print(sorted(m for m in ('torch', 'matplotlib', 'slack_sdk', 'jira', 'git', 'numpy',\n"
            "                         'mcp_server.loop.engine', 'mcp_server.loop.gitops') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    n, heavy = r.stdout.strip().splitlines()[-2:]
    assert int(n) >= 6 and heavy == "[]"
