"""The loop's errors (one home, below the engine and the modules it drives)."""
from __future__ import annotations


class LoopError(RuntimeError):
    """An error an agent can act on: the message says what to do next."""


class Busy(LoopError):
    pass
