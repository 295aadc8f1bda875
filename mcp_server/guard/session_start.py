"""SessionStart: tell a new, resumed or compacted session where the loop stands (fails open)."""
from __future__ import annotations

import json
import sys

from mcp_server.guard.payload import session_root
from mcp_server.guard.policy import load_policy, note


def session_start_context(payload: dict, root: str) -> str:
    """The text given to a starting, resumed or compacted session."""
    try:
        from mcp_server.loop.status import session_summary  # lazy: the hook stays light until it needs the ledger

        return str(session_summary(root))
    except Exception as e:                      # a broken ledger or install must not stop the session starting
        note(f"loopwright guard: session summary failed ({type(e).__name__}: {e})")
        return _fallback_context(root)


def _fallback_context(root: str) -> str:
    try:
        editable = ", ".join(load_policy(root).editable)
    except Exception:
        editable = "train.py"
    return (f"This is a loopwright workspace ({root}). Read program.md first: it is the spec for this "
            f"research loop. Only {editable} may be edited; prepare.py, loopwright.toml and the state "
            f"directory are frozen and guarded. Work through the loopwright MCP tools: state_read, "
            f"suggest_next, run_experiment, score, budget_check. Do not stop while budget remains.")


# --------------------------------------------------------------------------- entry point

def main_session_start(raw: str, exit_code_format: bool) -> int:
    try:
        payload = json.loads(raw)
        root = session_root(payload)
        if root is None:
            return 0
        context = session_start_context(payload, root)
    except Exception as e:
        note(f"loopwright guard: session-start failed ({type(e).__name__}: {e})")
        return 0
    sys.stdout.write(json.dumps({"hookSpecificOutput": {
        "hookEventName": "SessionStart", "additionalContext": context}}) + "\n")
    return 0

