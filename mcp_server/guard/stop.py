"""Stop: block the agent from stopping while the campaign budget remains.

`stop_hook_active` alone does not release the agent; LOOPWRIGHT_STOP_MAX_IDLE_BLOCKS (default
20) consecutive blocks without progress do. Claude Code ends a turn after 8 consecutive Stop
blocks unless CLAUDE_CODE_STOP_HOOK_BLOCK_CAP=0, which headless launchers set. A loop that cannot
be imported (a broken install) keeps the agent going, released by the same cap (fail closed); a status
that raises lets it stop (a broken ledger must not trap the agent).
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import TYPE_CHECKING, Optional

from mcp_server.guard.payload import session_root
from mcp_server.guard.policy import Policy, load_policy, note

if TYPE_CHECKING:   # the type only: at run time the loop is imported lazily, in load_status
    from mcp_server.loop.status import LoopStatus

DEFAULT_MAX_IDLE_STOP_BLOCKS = 20


def stop_decision(payload: dict, status: LoopStatus, idle_blocks: int = 0,
                  max_idle_blocks: int = DEFAULT_MAX_IDLE_STOP_BLOCKS) -> Optional[dict]:
    """{"decision": "block", "reason": next step} while budget remains, else None (let it stop).

    status: what mcp_server.loop.status.loop_status returns (a LoopStatus).
    stop_hook_active (Claude Code and Codex: this stop follows one we blocked) does not by itself
    release the agent — the budget is the stop condition — but idle_blocks (consecutive blocks
    with no progress in between) at max_idle_blocks does, so a stuck agent cannot loop forever.
    max_idle_blocks 0 disables that cap.
    """
    if status["should_stop"]:
        return None
    if max_idle_blocks and idle_blocks >= max_idle_blocks:
        return None
    return {"decision": "block", "reason": status["next_step"]}


UNAVAILABLE_PROGRESS = -1   # the progress mark while the loop cannot be imported: never moves, so the cap applies


def load_status(root) -> LoopStatus:
    """The loop's budget status from mcp_server.loop.status.loop_status. Fails closed: when the loop
    cannot be imported, a status that blocks with the fix (the idle-block cap still releases the agent)."""
    try:
        from mcp_server.loop.status import loop_status
    except ImportError as e:
        note(f"loopwright guard: loop status unavailable ({e}); blocking the stop")
        return {"should_stop": False, "reason": f"the loop's status cannot be read ({e})",
                "progress": UNAVAILABLE_PROGRESS,
                "next_step": (f"loopwright cannot read the campaign's budget: importing mcp_server.loop.status "
                              f"failed ({e}). Do not stop: ask for the install to be repaired (`pip install "
                              "loopwright`, then `loopwright doctor`), or keep working with the MCP tools.")}
    return loop_status(root)


def _stop_counter_path(policy: Policy, session_id: str) -> Optional[str]:
    if not os.path.isdir(policy.state_abs):
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", session_id or "default")[:100]
    return os.path.join(policy.state_abs, "guard", f"stop-{safe}.json")


def run_stop(payload: dict, root: str) -> Optional[dict]:
    """Stop hook for one workspace: the decision, with the idle-block counter kept on disk."""
    if os.environ.get("LOOPWRIGHT_SESSION_LEVEL") == "outer":
        return None   # an outer-loop session (launch --level outer) runs no experiments: the budget is not its cue
    status = load_status(root)
    counter = _stop_counter_path(load_policy(root), str(payload.get("session_id") or ""))
    mark = status["progress"]   # changes when the loop made progress (an experiment ran)
    saved = _read_json(counter) if counter else {}
    idle = 0
    if payload.get("stop_hook_active") and saved.get("mark") == mark:
        idle = int(saved.get("blocks", 0))
    cap = _int_env("LOOPWRIGHT_STOP_MAX_IDLE_BLOCKS", DEFAULT_MAX_IDLE_STOP_BLOCKS)
    decision = stop_decision(payload, status, idle, cap)
    if decision is None and not status["should_stop"]:
        note(f"loopwright guard: {idle} stop attempts in a row without progress; letting the agent stop")
    if counter:
        _write_json(counter, {"mark": mark, "blocks": idle + 1} if decision else {})
    return decision


# --------------------------------------------------------------------------- SessionStart

def main_stop(raw: str, exit_code_format: bool) -> int:
    try:
        payload = json.loads(raw)
        root = session_root(payload)
        decision = run_stop(payload, root) if root else None
    except Exception as e:
        # fail open here: blocking on a broken status could keep an agent spinning forever
        note(f"loopwright guard: stop check failed ({type(e).__name__}: {e}); letting the agent stop")
        return 0
    if decision:
        sys.stdout.write(json.dumps(decision) + "\n")
    return 0


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_json(path: str, data: dict):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError as e:
        note(f"loopwright guard: cannot record the stop counter ({e})")

