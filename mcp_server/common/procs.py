"""Process groups: the loop starts train.py and agent sessions with start_new_session=True, so a
whole group (dataloader workers, MCP servers, hooks) is stopped together."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

# Set when this process was told to end (SIGTERM/SIGHUP/SIGINT in the CLI, an MCP server shutting down):
# a training run that dies from then on was stopped by the loop, not by the change it measures.
_STOPPING = threading.Event()
_SIGNALS: list[int] = []


def note_stopping(signum: int | None = None) -> None:
    """This process is ending (on signal `signum`, if one): runs it kills or loses from now on are
    interrupted, never a change's crash."""
    if signum is not None:
        _SIGNALS.append(signum)
    _STOPPING.set()


def stopping() -> bool:
    return _STOPPING.is_set()


def stop_exit_code() -> int:
    """The exit status of a command that ends because it was told to: 128 + the signal (130 for Ctrl-C)."""
    return 128 + (_SIGNALS[-1] if _SIGNALS else int(signal.SIGINT))


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(0) also succeeds for zombies; look for a live member where /proc exists
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            return True
    return False


def kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, the process group led by proc (started with start_new_session)."""
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not group_alive(pgid):
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and group_alive(pgid):
            time.sleep(0.05)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
        pass


def kill_group_now(pgid: int) -> bool:
    """SIGKILL the whole group at once; False when it is gone already (or not ours)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True
