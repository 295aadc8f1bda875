"""The guard's command line: one program behind both clients' hooks (Claude Code and Codex).

    python -m mcp_server.guard pre-tool-use   < payload.json
    python -m mcp_server.guard stop           < payload.json
    python -m mcp_server.guard session-start  < payload.json
"""
from __future__ import annotations

import json
import os
import sys
from typing import Optional

from mcp_server.guard.pretooluse import main_pre_tool_use
from mcp_server.guard.session_start import main_session_start
from mcp_server.guard.stop import main_stop

_EVENTS = {"pre-tool-use": main_pre_tool_use, "pretooluse": main_pre_tool_use,
           "stop": main_stop, "session-start": main_session_start, "sessionstart": main_session_start}


def main(argv: Optional[list] = None) -> int:
    """python -m mcp_server.guard <pre-tool-use|stop|session-start> [--exit-code] < payload.

    --exit-code (or LOOPWRIGHT_GUARD_FORMAT=exit-code) denies with exit 2 + stderr instead of
    the JSON; without an event argument the payload's hook_event_name decides."""
    args = list(sys.argv[1:] if argv is None else argv)
    exit_code_format = "--exit-code" in args or os.environ.get("LOOPWRIGHT_GUARD_FORMAT") == "exit-code"
    events = [a for a in args if not a.startswith("--")]
    try:
        raw = sys.stdin.read()
    except Exception as e:
        sys.stderr.write(f"loopwright guard: cannot read the hook payload ({e}); blocked.\n")
        return 2
    event = events[0] if events else _event_from_payload(raw)
    handler = _EVENTS.get(event.lower().replace("_", "-"))
    if handler is None:
        sys.stderr.write(f"loopwright guard: unknown event {event!r}; use pre-tool-use, stop or "
                         f"session-start. Blocked.\n")
        return 2
    from mcp_server.agents.clients import record_hook_heartbeat

    record_hook_heartbeat(raw, event)   # lets the launcher and doctor tell hooks that never run (untrusted)
    return handler(raw, exit_code_format)


def _event_from_payload(raw: str) -> str:
    try:
        name = json.loads(raw).get("hook_event_name", "")
    except Exception:
        return "pre-tool-use"                    # unreadable: fail closed through the strictest path
    return {"PreToolUse": "pre-tool-use", "Stop": "stop", "SessionStart": "session-start"}.get(name, name)


if __name__ == "__main__":
    sys.exit(main())
