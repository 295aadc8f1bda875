"""The loop's errors (one home, below the engine and the modules it drives)."""
from __future__ import annotations


class LoopError(RuntimeError):
    """An error an agent can act on: the message says what to do next."""


class Busy(LoopError):
    pass


class Interrupted(LoopError):
    """The loop was told to stop (Ctrl-C, SIGTERM/SIGHUP, its server shutting down) while a run was in flight:
    the run is recorded as interrupted and its experiment is discarded; nothing is held against the change."""
