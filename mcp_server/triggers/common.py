"""What the cron and webhook triggers share: the session lock and the call into the launcher."""
from __future__ import annotations

import fcntl
import inspect
import os
from pathlib import Path
from typing import Optional

# One file for every trigger, so a cron session and a webhook session never overlap either.
SESSION_LOCK = "session.lock"


class SessionLock:
    """A non-blocking, exclusive flock. The kernel drops it if the holder dies, so a crashed
    session never leaves a stale lock; holders in other processes *and* threads conflict
    (each acquire opens its own file description)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def try_acquire(self) -> Optional["_Held"]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())   # for a person wondering who holds it
        return _Held(fd)


class _Held:
    def __init__(self, fd: int):
        self._fd: Optional[int] = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "_Held":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def launch(root: Path | str, *, agent: str, trigger: str, detail: str,
           max_session_minutes: Optional[float] = None) -> None:
    """Start one headless agent session with the launcher (mcp_server.agents.launch), passing the
    optional arguments only where the launcher accepts them."""
    from mcp_server.agents.launch import launch_session   # lazily: the triggers work (and test) without it

    optional = {"detail": detail, "max_session_minutes": max_session_minutes}
    params = inspect.signature(launch_session).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    extra = {k: v for k, v in optional.items() if v is not None and (takes_any or k in params)}
    launch_session(Path(root), agent=agent, trigger=trigger, **extra)
