"""Webhook delivery ids already acted on (replay protection), in a small SQLite table with expiry.
Its own file beside the receiver's state, not the ledger: the receiver must answer within seconds even while
an experiment holds the ledger busy."""
from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable

SEEN_TTL_S = 30 * 86400   # a delivery id is remembered for 30 days


class SeenStore:
    """Delivery ids already acted on, in a small SQLite table with expiry."""

    def __init__(self, path: Path | str, clock: Callable[[], float] = time.time, ttl_s: float = SEEN_TTL_S):
        self.clock, self.ttl_s = clock, ttl_s
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=10)
        self._db.execute("CREATE TABLE IF NOT EXISTS seen (source TEXT, id TEXT, at REAL, PRIMARY KEY (source, id))")
        self._lock = threading.Lock()

    def add(self, source: str, delivery_id: str) -> bool:
        """True if the id is new (and is now recorded), False for a duplicate."""
        now = self.clock()
        with self._lock:
            self._db.execute("DELETE FROM seen WHERE at < ?", (now - self.ttl_s,))
            return self._db.execute("INSERT OR IGNORE INTO seen VALUES (?,?,?)",
                                    (source, delivery_id, now)).rowcount == 1

    def forget(self, source: str, delivery_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM seen WHERE source=? AND id=?", (source, delivery_id))
