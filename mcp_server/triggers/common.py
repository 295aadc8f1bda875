"""What the cron and webhook triggers share: the session lock and the call into the launcher."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Optional

from mcp_server.common.locks import FileLock

# One file for every trigger, so a cron session and a webhook session never overlap either.
SESSION_LOCK = "session.lock"


SessionLock = FileLock   # the session lock is the package's one file lock


def launch(root: Path | str, *, agent: str, trigger: str, detail: str,
           max_session_minutes: Optional[float] = None, level: Optional[str] = None) -> None:
    """Start one headless agent session with the launcher (mcp_server.agents.launch), passing the
    optional arguments only where the launcher accepts them."""
    from mcp_server.agents.launch import launch_session  # lazily: the triggers work (and test) without it

    optional: dict[str, Any] = {"detail": detail, "max_session_minutes": max_session_minutes, "level": level}
    params = inspect.signature(launch_session).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    extra = {k: v for k, v in optional.items() if v is not None and (takes_any or k in params)}
    launch_session(Path(root), agent=agent, trigger=trigger, **extra)
