"""The ledger's storage: WAL and migrations, schema guard, field checks, the outbox's lifecycle."""
import sqlite3
import time

import pytest

from mcp_server.ledger.store import MIGRATIONS, Ledger, LedgerError

# -- ledger -------------------------------------------------------------------

def test_ledger_wal_and_migrations(tmp_path):
    led = Ledger(tmp_path / "state.db")
    assert led.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert led.schema_version == len(MIGRATIONS)
    cid = led.create_campaign("t", "loopwright/t", "abc")
    with pytest.raises(LedgerError, match="already exists"):
        led.create_campaign("t", "loopwright/t", "abc")
    led.close()
    # a ledger at version 1 is upgraded in place without losing rows
    raw = sqlite3.connect(tmp_path / "state.db")
    raw.execute("DROP TABLE kv")   # undo migrations 2 and 3: what a version-1 ledger looks like
    for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type='index' AND name IN "
                               "('experiments_stats','experiments_confirm','experiments_baseline',"
                               "'notes_campaign','sessions_campaign','experiments_verdict')").fetchall():
        raw.execute(f"DROP INDEX {name}")
    raw.execute("ALTER TABLE deliveries DROP COLUMN claimed_by")    # undo migration 5
    raw.execute("ALTER TABLE deliveries DROP COLUMN lease_until")
    raw.execute("DROP TABLE replays")                                # undo migration 6 (paired runs)
    raw.execute("DROP INDEX experiments_commit")
    for col in ("role", "paired_with", "seed_set"):
        raw.execute(f"ALTER TABLE experiments DROP COLUMN {col}")
    raw.execute("DROP TABLE mechanism_trials")                       # undo migration 7 (mechanisms)
    raw.execute("DROP TABLE mechanisms")
    raw.execute("DROP TABLE approvals")                              # undo migration 8 (9 is a no-op here)
    raw.execute("DROP TABLE submissions")                            # undo migrations 11 and 12 (async runs)
    raw.execute("DROP TABLE inflight")
    raw.execute("DROP TABLE seed_set_seeds")                         # undo migration 13 (seed sets)
    raw.execute("DROP TABLE seed_sets")
    for col in ("change_name", "change_old", "change_new"):           # undo migration 14 (structured changes)
        raw.execute(f"ALTER TABLE experiments DROP COLUMN {col}")
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    led = Ledger(tmp_path / "state.db")
    assert led.schema_version == len(MIGRATIONS)
    assert led.campaign(cid)["tag"] == "t"
    led.kv_set("k", "v")
    assert led.kv_get("k") == "v"


def test_ledger_refuses_a_newer_schema(tmp_path):
    Ledger(tmp_path / "s.db").close()
    raw = sqlite3.connect(tmp_path / "s.db")
    raw.execute("PRAGMA user_version = 99")
    raw.commit()
    raw.close()
    with pytest.raises(LedgerError, match="newer than this loopwright"):
        Ledger(tmp_path / "s.db")


def test_ledger_rejects_unknown_fields_and_missing_rows(tmp_path):
    led = Ledger(tmp_path / "s.db")
    cid = led.create_campaign("t", "b", "abc")
    with pytest.raises(LedgerError, match="unknown experiment fields"):
        led.start_experiment(cid, "x", val_bpbb=1.0)
    with pytest.raises(LedgerError, match="does not exist"):
        led.update_experiment(12345, status="ok")


def test_outbox_delivery_lifecycle(tmp_path):
    led = Ledger(tmp_path / "s.db")
    cid = led.create_campaign("t", "b", "abc")
    e1 = led.add_event(cid, "keep", {"val_bpb": 1.5}, sinks=["slack"])
    e2 = led.add_event(cid, "tamper", {"files": ["prepare.py"]}, sinks=["slack"])
    assert [d["event_id"] for d in led.due_deliveries("slack")] == [e1, e2]
    led.mark_attempt_failed(e1, "slack", "HTTP 500", next_attempt_at=time.time() + 60)
    assert [d["event_id"] for d in led.due_deliveries("slack")] == [e2]
    led.mark_delivered(e2, "slack", external_ref="ts-1")
    assert led.due_deliveries("slack") == []
    assert [d["event_id"] for d in led.due_deliveries("slack", now=time.time() + 61)] == [e1]
    # a sink configured later gets the backlog once
    assert led.ensure_deliveries("jira", kinds=["keep"]) == 1
    assert led.ensure_deliveries("jira", kinds=["keep"]) == 0
    assert [d["kind"] for d in led.due_deliveries("jira")] == ["keep"]
