"""One kind of lock for the whole package: a non-blocking, exclusive flock on a file.

The kernel drops it if the holder dies, so a crash never leaves a stale lock; holders in other
processes *and* threads conflict (each acquire opens its own file description)."""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Optional


class FileLock:
    def __init__(self, path: Path | str):
        self.path = Path(path)

    def try_acquire(self) -> Optional[HeldLock]:
        """The held lock, or None when someone else holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())   # for a person wondering who holds it
        return HeldLock(fd)


class HeldLock:
    def __init__(self, fd: int):
        self._fd: Optional[int] = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
