"""The ledger: everything the loop remembers, in SQLite (WAL).

One file per workspace (.loopwright/state.db). Schema changes are numbered
migrations applied in order and tracked with PRAGMA user_version, so an old
ledger is upgraded in place and nothing recorded is lost.
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional

EXPERIMENT_STATUSES = ("running", "ok", "crash", "timeout", "rejected", "interrupted", "lost")
VERDICTS = ("baseline", "keep", "discard", "retest", "pending_approval")
STOP_KEY = "stop_requested"      # kv key of the person's stop request (one home: Ledger.request_stop)

MIGRATIONS: list = [
    # 1: the initial schema
    """
    CREATE TABLE campaigns (
        id INTEGER PRIMARY KEY,
        tag TEXT NOT NULL UNIQUE,
        branch TEXT NOT NULL,
        pinned_commit TEXT NOT NULL,
        best_commit TEXT,
        best_experiment_id INTEGER,
        status TEXT NOT NULL DEFAULT 'active',
        created_at REAL NOT NULL,
        ended_at REAL
    );
    CREATE TABLE experiments (
        id INTEGER PRIMARY KEY,
        campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
        commit_sha TEXT,
        parent_commit TEXT,
        description TEXT NOT NULL,
        hypothesis TEXT,
        status TEXT NOT NULL CHECK (status IN ('running','ok','crash','timeout','rejected','interrupted')),
        verdict TEXT CHECK (verdict IN ('baseline','keep','discard','retest')),
        verdict_reason TEXT,
        is_baseline INTEGER NOT NULL DEFAULT 0,
        confirm_of INTEGER REFERENCES experiments(id),
        seed INTEGER,
        val_bpb REAL,
        test_bpb REAL,
        training_seconds REAL,
        total_seconds REAL,
        eval_seconds REAL,
        memory_gb REAL,
        num_steps INTEGER,
        num_params_m REAL,
        lines_added INTEGER,
        lines_removed INTEGER,
        source_sha TEXT,
        reason TEXT,
        log_tail TEXT,
        metrics_json TEXT,
        session_id INTEGER,
        started_at REAL NOT NULL,
        finished_at REAL
    );
    CREATE INDEX experiments_campaign ON experiments(campaign_id, id);
    CREATE INDEX experiments_source ON experiments(campaign_id, source_sha);
    CREATE TABLE sessions (
        id INTEGER PRIMARY KEY,
        campaign_id INTEGER REFERENCES campaigns(id),
        trigger TEXT NOT NULL,
        agent TEXT NOT NULL,
        started_at REAL NOT NULL,
        ended_at REAL,
        exit_code INTEGER,
        turns INTEGER,
        cost_usd REAL NOT NULL DEFAULT 0,
        detail TEXT
    );
    CREATE TABLE notes (
        id INTEGER PRIMARY KEY,
        campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
        kind TEXT NOT NULL,
        text TEXT NOT NULL,
        experiment_id INTEGER REFERENCES experiments(id),
        created_at REAL NOT NULL
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        campaign_id INTEGER REFERENCES campaigns(id),
        kind TEXT NOT NULL,
        payload TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE TABLE deliveries (
        event_id INTEGER NOT NULL REFERENCES events(id),
        sink TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending','delivered','failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at REAL NOT NULL DEFAULT 0,
        last_error TEXT,
        external_ref TEXT,
        delivered_at REAL,
        PRIMARY KEY (event_id, sink)
    );
    CREATE INDEX deliveries_due ON deliveries(sink, status, next_attempt_at);
    """,
    # 2: small key/value state (e.g. the Jira issue key of a campaign)
    "CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # 3: covering indexes so summaries and budgets stay fast with 10,000s of experiments
    """
    CREATE INDEX experiments_stats ON experiments(campaign_id, status, is_baseline, verdict, confirm_of,
                                                  started_at, finished_at, val_bpb);
    CREATE INDEX experiments_confirm ON experiments(confirm_of);
    CREATE INDEX experiments_baseline ON experiments(campaign_id, is_baseline, status, val_bpb);
    CREATE INDEX notes_campaign ON notes(campaign_id, id);
    CREATE INDEX sessions_campaign ON sessions(campaign_id)
    """,
    # 4: verdict counts as index seeks
    "CREATE INDEX experiments_verdict ON experiments(campaign_id, verdict, confirm_of, status)",
    # 5: a delivery row is claimed by one pass at a time (a lease that expires if the pass dies)
    """
    ALTER TABLE deliveries ADD COLUMN claimed_by TEXT;
    ALTER TABLE deliveries ADD COLUMN lease_until REAL NOT NULL DEFAULT 0
    """,
    # 6: paired verdicts: each run's role and the reference run it is paired with (same seed); replay runs
    """
    ALTER TABLE experiments ADD COLUMN role TEXT;
    ALTER TABLE experiments ADD COLUMN paired_with INTEGER REFERENCES experiments(id);
    ALTER TABLE experiments ADD COLUMN seed_set INTEGER;
    CREATE INDEX experiments_commit ON experiments(campaign_id, commit_sha, status);
    CREATE TABLE replays (
        id INTEGER PRIMARY KEY,
        campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
        replay INTEGER NOT NULL,
        experiment_id INTEGER NOT NULL REFERENCES experiments(id),
        side TEXT NOT NULL CHECK (side IN ('parent','child')),
        commit_sha TEXT NOT NULL,
        seed INTEGER NOT NULL,
        status TEXT NOT NULL,
        val_bpb REAL,
        num_steps INTEGER,
        reason TEXT,
        started_at REAL NOT NULL,
        finished_at REAL
    );
    CREATE INDEX replays_campaign ON replays(campaign_id, replay, experiment_id)
    """,
    # 7: search mechanisms written at run time (code in <state_dir>/mechanisms/, versioned) and their trials
    """
    CREATE TABLE mechanisms (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        version INTEGER NOT NULL,
        kind TEXT NOT NULL,
        code_sha256 TEXT NOT NULL,
        path TEXT NOT NULL,
        rationale TEXT NOT NULL DEFAULT '',
        author TEXT NOT NULL DEFAULT '',
        campaign_id INTEGER REFERENCES campaigns(id),
        status TEXT NOT NULL CHECK (status IN ('rejected','validated','active','kept','reverted')),
        reason TEXT,
        validation_json TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        UNIQUE (name, version)
    );
    CREATE TABLE mechanism_trials (
        id INTEGER PRIMARY KEY,
        mechanism_id INTEGER NOT NULL REFERENCES mechanisms(id),
        campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
        window INTEGER NOT NULL,
        start_experiment_id INTEGER NOT NULL,
        end_experiment_id INTEGER,
        outcome TEXT NOT NULL DEFAULT 'running' CHECK (outcome IN ('running','kept','reverted','failed')),
        reason TEXT,
        stats_json TEXT,
        started_at REAL NOT NULL,
        ended_at REAL
    );
    CREATE INDEX mechanism_trials_campaign ON mechanism_trials(campaign_id, outcome)
    """,
    # 8: the autonomy slider: changes that wait for a person (a keep, or a run before it starts)
    """
    CREATE TABLE approvals (
        id INTEGER PRIMARY KEY,
        campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
        kind TEXT NOT NULL CHECK (kind IN ('keep','run')),
        experiment_id INTEGER REFERENCES experiments(id),
        status TEXT NOT NULL DEFAULT 'pending'
            CHECK (status IN ('pending','approved','rejected','expired','applied','stale','conflict','ran')),
        commit_sha TEXT NOT NULL,
        base_commit TEXT NOT NULL,
        branch TEXT,
        source_sha TEXT,
        description TEXT NOT NULL,
        payload TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL,
        expires_at REAL,
        decided_by TEXT,
        decided_via TEXT,
        decided_at REAL,
        decision_note TEXT,
        applied_at REAL,
        outcome TEXT
    );
    CREATE INDEX approvals_status ON approvals(campaign_id, status)
    """,
]



def _widen_verdicts(c: sqlite3.Connection) -> None:
    """Allow verdict 'pending_approval'. SQLite cannot alter a CHECK constraint, so the table is rebuilt
    from its own current definition (columns other migrations added come along), every row and index
    kept (SQLite's documented 12-step procedure; foreign keys are off around it, see _migrate)."""
    sql = c.execute("SELECT sql FROM sqlite_master WHERE type='table' AND name='experiments'").fetchone()[0]
    if "'pending_approval'" in sql:
        return
    new, n = re.subn(r"(CHECK\s*\(\s*verdict\s+IN\s*\()([^)]*)\)", r"\1\2,'pending_approval')", sql, count=1)
    if n != 1:
        raise LedgerError("cannot find the verdict CHECK constraint of the experiments table to widen")
    _rebuild_experiments(c, new)


# 9: verdict 'pending_approval' (a keep that waits for a person under autonomy = approve-keeps)
MIGRATIONS.append(_widen_verdicts)


def _widen_statuses(c: sqlite3.Connection) -> None:
    """Allow status 'lost' (the worker or node running it died; it was re-queued once). The same table
    rebuild as _widen_verdicts."""
    sql = c.execute("SELECT sql FROM sqlite_master WHERE type='table' AND name='experiments'").fetchone()[0]
    if "'lost'" in sql:
        return
    new, n = re.subn(r"(CHECK\s*\(\s*status\s+IN\s*\()([^)]*)\)", r"\1\2,'lost')", sql, count=1)
    if n != 1:
        raise LedgerError("cannot find the status CHECK constraint of the experiments table to widen")
    _rebuild_experiments(c, new)


def _rebuild_experiments(c: sqlite3.Connection, new: str) -> None:
    new, n = re.subn(r"^CREATE TABLE\s+\"?experiments\"?", "CREATE TABLE experiments_new", new, count=1)
    if n != 1:
        raise LedgerError("unexpected definition of the experiments table")
    indexes = [r[0] for r in c.execute("SELECT sql FROM sqlite_master WHERE type='index' AND tbl_name='experiments' "
                                       "AND sql IS NOT NULL")]
    before = c.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]
    c.execute(new)
    c.execute("INSERT INTO experiments_new SELECT * FROM experiments")
    c.execute("DROP TABLE experiments")
    c.execute("ALTER TABLE experiments_new RENAME TO experiments")
    for stmt in indexes:
        c.execute(stmt)
    if c.execute("SELECT COUNT(*) FROM experiments").fetchone()[0] != before:
        raise LedgerError("rebuilding the experiments table lost rows; nothing was changed")


# 10: status 'lost' (asynchronous runs on an executor: a dead worker or node)
MIGRATIONS.append(_widen_statuses)
# 11: asynchronous experiments: what the agent submitted (its id -> the candidate row that now stands for it,
# re-measured or re-queued ones included) and the runs handed to an executor and not yet recorded
MIGRATIONS.append("""
    CREATE TABLE submissions (
        id INTEGER PRIMARY KEY REFERENCES experiments(id),
        campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
        current_id INTEGER NOT NULL REFERENCES experiments(id),
        submitted_at REAL NOT NULL,
        decided_at REAL
    );
    CREATE INDEX submissions_open ON submissions(campaign_id, decided_at);
    CREATE TABLE inflight (
        run_id INTEGER PRIMARY KEY REFERENCES experiments(id),
        campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
        attempt INTEGER NOT NULL DEFAULT 1,
        executor TEXT NOT NULL,
        submitted_at REAL NOT NULL
    )
""")
# 12: a decided submission's verdict handed to the agent by wait() (wait() without ids returns every decided
# submission not handed over yet, also one decided inside submit_experiment or state_read); those decided
# before this column existed count as handed over
MIGRATIONS.append("""
    ALTER TABLE submissions ADD COLUMN reported_at REAL;
    UPDATE submissions SET reported_at = decided_at WHERE decided_at IS NOT NULL
""")

def _seed_sets_table(c: sqlite3.Connection) -> None:
    """The campaign's seed sets get a table of their own (they were JSON under kv 'seedset:<campaign id>').
    Each one is moved over in the same transaction; a value that is not a seed set, or one of a campaign
    that does not exist, stays in kv where it was (nothing recorded is dropped)."""
    c.execute("""
        CREATE TABLE seed_sets (
            campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
            set_index INTEGER NOT NULL,
            since_candidates INTEGER NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (campaign_id, set_index)
        )""")
    c.execute("""
        CREATE TABLE seed_set_seeds (
            campaign_id INTEGER NOT NULL,
            set_index INTEGER NOT NULL,
            position INTEGER NOT NULL,
            seed INTEGER NOT NULL,
            PRIMARY KEY (campaign_id, set_index, position),
            FOREIGN KEY (campaign_id, set_index) REFERENCES seed_sets(campaign_id, set_index)
        )""")
    now = time.time()
    for key, value in c.execute("SELECT key, value FROM kv WHERE key LIKE 'seedset:%'").fetchall():
        cid = key.partition(":")[2]
        try:
            rec = json.loads(value)
            index, since, seeds = int(rec["index"]), int(rec["since"]), [int(x) for x in rec["seeds"]]
        except (ValueError, TypeError, KeyError):
            continue
        if not cid.isdigit() or c.execute("SELECT 1 FROM campaigns WHERE id=?", (int(cid),)).fetchone() is None:
            continue
        _insert_seed_set(c, int(cid), index, seeds, since, now)
        c.execute("DELETE FROM kv WHERE key=?", (key,))


def _insert_seed_set(c: sqlite3.Connection, campaign_id: int, index: int, seeds: list[int], since: int,
                     now: float) -> bool:
    """False (nothing written) when the campaign already has a set with this index."""
    if c.execute("INSERT OR IGNORE INTO seed_sets(campaign_id, set_index, since_candidates, created_at) "
                 "VALUES (?,?,?,?)", (campaign_id, index, since, now)).rowcount != 1:
        return False
    c.executemany("INSERT INTO seed_set_seeds(campaign_id, set_index, position, seed) VALUES (?,?,?,?)",
                  [(campaign_id, index, k, s) for k, s in enumerate(seeds)])
    return True


# 13: seed sets as rows (the set each candidate runs on; rotation starts a new one)
MIGRATIONS.append(_seed_sets_table)

# Descriptions the built-in agent wrote before a change was data ("LR 0.004 -> 0.008 ..."): migration 14
# reads them once so a resumed session still learns from its earlier experiments. Nothing else parses
# descriptions.
_OLD_BUILTIN_DESCRIPTION = re.compile(r"^([A-Z][A-Z0-9_]*) (\S+) -> (\S+)")


def _old_builtin_change(description: str) -> Optional[dict]:
    m = _OLD_BUILTIN_DESCRIPTION.match(description or "")
    if not m:
        return None
    try:
        old, new = (ast.literal_eval(v) for v in m.group(2, 3))
    except (ValueError, SyntaxError):
        return None
    if not all(isinstance(v, (bool, int, float)) for v in (old, new)) or (type(old) is type(new) and old == new):
        return None
    return {"name": m.group(1), "old": old, "new": new}


def _change_columns_migration(c: sqlite3.Connection) -> None:
    """A structured change (name, old, new) on each candidate row, JSON-typed values; candidates recorded
    before it that the built-in agent described get theirs from the description."""
    for col in ("change_name", "change_old", "change_new"):
        c.execute(f"ALTER TABLE experiments ADD COLUMN {col} TEXT")
    rows = c.execute("SELECT id, description FROM experiments WHERE is_baseline=0 AND confirm_of IS NULL").fetchall()
    for eid, description in rows:
        change = _old_builtin_change(description)
        if change is not None:
            cols = _change_columns(change)
            c.execute("UPDATE experiments SET change_name=?, change_old=?, change_new=? WHERE id=?",
                      (cols["change_name"], cols["change_old"], cols["change_new"], eid))


# 14: the structured change of an experiment (run_experiment's optional `change`)
MIGRATIONS.append(_change_columns_migration)


# Columns an experiment row may be updated with (guards against typos reaching SQL).
_EXPERIMENT_FIELDS = {
    "commit_sha", "parent_commit", "description", "hypothesis", "status", "verdict", "verdict_reason",
    "is_baseline", "confirm_of", "seed", "val_bpb", "test_bpb", "training_seconds", "total_seconds",
    "eval_seconds", "memory_gb", "num_steps", "num_params_m", "lines_added", "lines_removed",
    "source_sha", "reason", "log_tail", "metrics_json", "session_id", "finished_at",
    "role", "paired_with", "seed_set", "started_at",
}


class LedgerError(RuntimeError):
    pass


@dataclass(frozen=True)
class SeedSet:
    """One of a campaign's seed sets: its number, its seeds in order, and how many candidates the campaign
    had when it started (rotation counts candidates from there)."""
    index: int
    seeds: tuple[int, ...]
    since: int


def _rowid(cur: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just made (always set after one)."""
    assert cur.lastrowid is not None
    return int(cur.lastrowid)


def _row(r: Optional[sqlite3.Row]) -> Optional[dict]:
    return dict(r) if r is not None else None


def _experiment_row(r: sqlite3.Row) -> dict:
    """An experiments row as a dict; its change columns become one `change` entry: {name, old, new} or None."""
    d = dict(r)
    name, old, new = d.pop("change_name", None), d.pop("change_old", None), d.pop("change_new", None)
    d["change"] = None if name is None else {"name": name, "old": json.loads(old), "new": json.loads(new)}
    return d


def _change_columns(change: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """The change columns of a {name, old, new} mapping (values kept with their JSON type: 8 stays an int)."""
    if change is None:
        return {"change_name": None, "change_old": None, "change_new": None}
    if set(change) != {"name", "old", "new"}:
        raise LedgerError(f"a change is {{name, old, new}}, not {sorted(change)}")
    return {"change_name": str(change["name"]), "change_old": json.dumps(change["old"]),
            "change_new": json.dumps(change["new"])}


class Ledger:
    """Thin, explicit access to state.db. Each public method is one transaction."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        self.conn.execute("PRAGMA busy_timeout=30000")
        self._migrate()

    # -- plumbing -----------------------------------------------------------
    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        else:
            self.conn.execute("COMMIT")

    def _migrate(self) -> None:
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise LedgerError(f"{self.path} has schema version {version}, newer than this loopwright "
                              f"({len(MIGRATIONS)}); upgrade loopwright instead of downgrading the ledger")
        for number in range(version, len(MIGRATIONS)):
            step = MIGRATIONS[number]
            if callable(step):   # a table rebuild: foreign keys off (only possible outside a transaction)
                self.conn.execute("PRAGMA foreign_keys=OFF")
            try:
                with self.tx() as c:
                    if c.execute("PRAGMA user_version").fetchone()[0] > number:
                        continue   # another process applied it meanwhile
                    if callable(step):
                        step(c)
                        if c.execute("PRAGMA foreign_key_check").fetchone() is not None:
                            raise LedgerError(f"migration {number + 1} would break foreign keys; nothing changed")
                    else:
                        # executescript would COMMIT mid-transaction; run statements one by one
                        for stmt in step.split(";"):
                            if stmt.strip():
                                c.execute(stmt)
                    c.execute(f"PRAGMA user_version = {number + 1}")
            finally:
                if callable(step):
                    self.conn.execute("PRAGMA foreign_keys=ON")

    @property
    def schema_version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- campaigns ----------------------------------------------------------
    def create_campaign(self, tag: str, branch: str, pinned_commit: str) -> int:
        with self.tx() as c:
            if c.execute("SELECT 1 FROM campaigns WHERE tag=?", (tag,)).fetchone():
                raise LedgerError(f"campaign tag {tag!r} already exists; choose another --tag")
            cur = c.execute(
                "INSERT INTO campaigns(tag, branch, pinned_commit, best_commit, created_at) VALUES (?,?,?,?,?)",
                (tag, branch, pinned_commit, pinned_commit, time.time()))
            return _rowid(cur)

    def campaign(self, campaign_id: Optional[int] = None, tag: Optional[str] = None) -> Optional[dict]:
        if tag is not None:
            return _row(self.conn.execute("SELECT * FROM campaigns WHERE tag=?", (tag,)).fetchone())
        if campaign_id is not None:
            return _row(self.conn.execute("SELECT * FROM campaigns WHERE id=?", (campaign_id,)).fetchone())
        return _row(self.conn.execute("SELECT * FROM campaigns ORDER BY id DESC LIMIT 1").fetchone())

    def set_best(self, campaign_id: int, commit: str, experiment_id: Optional[int]) -> None:
        with self.tx() as c:
            c.execute("UPDATE campaigns SET best_commit=?, best_experiment_id=? WHERE id=?",
                      (commit, experiment_id, campaign_id))

    def end_campaign(self, campaign_id: int, status: str = "ended") -> None:
        with self.tx() as c:
            c.execute("UPDATE campaigns SET status=?, ended_at=? WHERE id=?", (status, time.time(), campaign_id))

    # -- experiments --------------------------------------------------------
    def start_experiment(self, campaign_id: int, description: str, **fields: Any) -> int:
        """A new row; `change` (a {name, old, new} mapping, or None) is stored in its own columns."""
        bad = set(fields) - _EXPERIMENT_FIELDS - {"change"}
        if bad:
            raise LedgerError(f"unknown experiment fields {sorted(bad)}")
        if "change" in fields:
            fields.update(_change_columns(fields.pop("change")))
        fields.setdefault("status", "running")
        cols = ["campaign_id", "description", "started_at", *fields]
        vals = [campaign_id, description, time.time(), *fields.values()]
        with self.tx() as c:
            cur = c.execute(f"INSERT INTO experiments({','.join(cols)}) VALUES ({','.join('?' * len(cols))})", vals)
            return _rowid(cur)

    def update_experiment(self, experiment_id: int, **fields: Any) -> None:
        bad = set(fields) - _EXPERIMENT_FIELDS
        if bad:
            raise LedgerError(f"unknown experiment fields {sorted(bad)}")
        if not fields:
            return
        sets = ", ".join(f"{k}=?" for k in fields)
        with self.tx() as c:
            cur = c.execute(f"UPDATE experiments SET {sets} WHERE id=?", (*fields.values(), experiment_id))
            if cur.rowcount != 1:
                raise LedgerError(f"experiment {experiment_id} does not exist")

    def experiment(self, experiment_id: int) -> Optional[dict]:
        r = self.conn.execute("SELECT * FROM experiments WHERE id=?", (experiment_id,)).fetchone()
        return None if r is None else _experiment_row(r)

    def recorded_experiment(self, experiment_id: int) -> dict:
        """The row of an experiment the loop itself recorded: a LedgerError, never None, if it is missing."""
        row = self.experiment(experiment_id)
        if row is None:
            raise LedgerError(f"experiment {experiment_id} is not in the ledger")
        return row

    def recorded_campaign(self, campaign_id: int) -> dict:
        """The row of a campaign known to exist: a LedgerError, never None, if it is missing."""
        row = self.campaign(campaign_id)
        if row is None:
            raise LedgerError(f"campaign {campaign_id} is not in the ledger")
        return row

    def experiments(self, campaign_id: int, limit: Optional[int] = None, newest_first: bool = False) -> list[dict]:
        """Every row of the campaign (candidates, baseline, reference, pair and confirm runs) in id order."""
        return self._experiments(campaign_id, "", (), limit, newest_first)

    def _experiments(self, campaign_id: int, cond: str, params: Iterable[Any] = (), limit: Optional[int] = None,
                     newest_first: bool = False) -> list[dict]:
        sql = "SELECT * FROM experiments WHERE campaign_id=?" + (f" AND ({cond})" if cond else "")
        sql += " ORDER BY id " + ("DESC" if newest_first else "ASC")
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_experiment_row(r) for r in self.conn.execute(sql, (campaign_id, *params))]

    def count_experiments(self, campaign_id: int) -> int:
        """Rows of the campaign, runs of every role included."""
        return int(self.conn.execute("SELECT COUNT(*) FROM experiments WHERE campaign_id=?",
                                     (campaign_id,)).fetchone()[0])

    # Named questions about a campaign's experiments: callers say what they ask, never how (no SQL outside
    # this package). A "candidate" is an agent's change (not the baseline, not a confirm/pair/reference run).
    def candidates(self, campaign_id: int, limit: Optional[int] = None, newest_first: bool = False) -> list[dict]:
        return self._experiments(campaign_id, "is_baseline=0 AND confirm_of IS NULL", (), limit, newest_first)

    def kept_candidates(self, campaign_id: int) -> list[dict]:
        return self._experiments(campaign_id, "verdict='keep' AND confirm_of IS NULL AND is_baseline=0")

    def prior_of_source(self, campaign_id: int, source_sha: str, skip_statuses: Iterable[str],
                        skip_reason_prefix: Optional[str] = None) -> Optional[dict]:
        """The first candidate that ran exactly this source (an exact repeat), ignoring rows whose status is
        one of `skip_statuses` or whose verdict reason starts with `skip_reason_prefix` (the loop was
        stopped, not the change)."""
        st = list(skip_statuses)
        cond = "source_sha=? AND confirm_of IS NULL"
        params: list[Any] = [source_sha]
        if st:
            cond += f" AND status NOT IN ({','.join('?' * len(st))})"
            params += st
        if skip_reason_prefix is not None:
            cond += " AND substr(COALESCE(verdict_reason, ''), 1, ?) != ?"
            params += [len(skip_reason_prefix), skip_reason_prefix]
        rows = self._experiments(campaign_id, cond, params, limit=1)
        return rows[0] if rows else None

    def pending_retests(self, campaign_id: int) -> list[dict]:
        """Candidates whose verdict is 'retest' (a confirm run is due)."""
        return self._experiments(campaign_id, "verdict='retest' AND confirm_of IS NULL")

    def unscored_candidates(self, campaign_id: int) -> list[dict]:
        """Candidates that ran ok and have no verdict yet."""
        return self._experiments(campaign_id, "status='ok' AND is_baseline=0 AND confirm_of IS NULL "
                                              "AND verdict IS NULL")

    def latest_scorable(self, campaign_id: int) -> Optional[dict]:
        """The newest candidate that ran ok and waits for score(): no verdict yet, or 'retest'."""
        rows = self._experiments(campaign_id, "status='ok' AND is_baseline=0 AND confirm_of IS NULL "
                                              "AND (verdict IS NULL OR verdict='retest')", limit=1, newest_first=True)
        return rows[0] if rows else None

    def recent_non_baseline(self, campaign_id: int, limit: int) -> list[dict]:
        """The newest `limit` rows that are not baseline runs (candidates and their pair/confirm/reference
        runs), newest first."""
        return self._experiments(campaign_id, "is_baseline=0", limit=limit, newest_first=True)

    def recent_finished(self, campaign_id: int, limit: int) -> list[dict]:
        """The newest `limit` rows that are no longer running, newest first."""
        return self._experiments(campaign_id, "status != 'running'", limit=limit, newest_first=True)

    def experiments_after(self, campaign_id: int, after_id: int) -> list[dict]:
        """Rows with an id above `after_id`, oldest first."""
        return self._experiments(campaign_id, "id > ?", (after_id,))

    def baseline_runs_with_test(self, campaign_id: int) -> list[dict]:
        """Baseline runs that ran ok and have a hidden-test score."""
        return self._experiments(campaign_id, "is_baseline=1 AND status='ok' AND test_bpb IS NOT NULL")

    def running_baseline_runs(self, campaign_id: int) -> list[dict]:
        return self._experiments(campaign_id, "is_baseline=1 AND status='running'")

    def running_runs_of_commit(self, campaign_id: int, commit: str) -> list[dict]:
        """Runs of one commit queued or running on a known seed (a reference run in flight), oldest first."""
        return self._experiments(campaign_id, "commit_sha=? AND status='running' AND seed IS NOT NULL", (commit,))

    def count_since_best(self, campaign_id: int) -> int:
        """Non-baseline rows recorded after the campaign's best experiment (all of them before any keep)."""
        return int(self.conn.execute(
            "SELECT COUNT(*) FROM experiments WHERE campaign_id=? AND is_baseline=0 AND id > "
            "COALESCE((SELECT best_experiment_id FROM campaigns WHERE id=?), 0)",
            (campaign_id, campaign_id)).fetchone()[0])

    # what a chart or table of every experiment needs: no logs or metrics (kilobytes a row in a long campaign)
    BRIEF_COLUMNS = ("id", "campaign_id", "commit_sha", "parent_commit", "description", "status", "verdict",
                     "verdict_reason", "is_baseline", "confirm_of", "seed", "val_bpb", "test_bpb", "num_steps",
                     "reason", "role", "paired_with", "seed_set", "started_at", "finished_at")

    def experiments_brief(self, campaign_id: int) -> list[dict]:
        """Every experiment of a campaign, oldest first, with BRIEF_COLUMNS only."""
        return [dict(r) for r in self.conn.execute(
            f"SELECT {', '.join(self.BRIEF_COLUMNS)} FROM experiments WHERE campaign_id=? ORDER BY id", (campaign_id,))]

    def campaign_counts(self, campaign_id: int) -> dict[str, int]:
        """The summary counts, each a seek on an index rather than a pass over every row."""
        q = {
            "experiments": "SELECT COUNT(*) FROM experiments INDEXED BY experiments_baseline WHERE campaign_id=? "
                           "AND is_baseline=0 AND confirm_of IS NULL",
            "kept": "SELECT COUNT(*) FROM experiments INDEXED BY experiments_verdict WHERE campaign_id=? "
                    "AND verdict='keep' AND confirm_of IS NULL",
            "discarded": "SELECT COUNT(*) FROM experiments INDEXED BY experiments_verdict WHERE campaign_id=? "
                         "AND verdict='discard' AND confirm_of IS NULL AND status='ok'",
            "crashed": "SELECT COUNT(*) FROM experiments INDEXED BY experiments_stats WHERE campaign_id=? "
                       "AND status IN ('crash','timeout','rejected')",
        }
        return {k: int(self.conn.execute(sql, (campaign_id,)).fetchone()[0]) for k, sql in q.items()}

    def campaign_names(self) -> list[tuple[str, str]]:
        """(tag, branch) of every campaign, oldest first."""
        return [(r[0], r[1]) for r in self.conn.execute("SELECT tag, branch FROM campaigns ORDER BY id")]

    def scored_rows_digest(self, except_experiment: int) -> str:
        """A digest of every recorded result and campaign pointer except one experiment's: what code running
        during that experiment must not be able to rewrite (the engine compares it before and after)."""
        h = hashlib.sha256()
        for row in self.conn.execute(
                "SELECT id, status, verdict, is_baseline, val_bpb, test_bpb, seed, commit_sha, confirm_of "
                "FROM experiments WHERE id != ? ORDER BY id", (except_experiment,)):
            h.update(repr(tuple(row)).encode())
        for row in self.conn.execute("SELECT id, pinned_commit, best_commit, best_experiment_id, status "
                                     "FROM campaigns ORDER BY id"):
            h.update(repr(tuple(row)).encode())
        return h.hexdigest()

    def counts_since(self, campaign_id: int, since: float) -> tuple[int, int]:
        """(experiments started, of them kept) in a campaign since a time: a session's yield. Candidates only:
        the reference and confirm runs their paired verdicts needed are runs, not experiments."""
        row = self.conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(verdict='keep'), 0) FROM experiments WHERE campaign_id=? "
            "AND started_at>=? AND is_baseline=0 AND confirm_of IS NULL", (campaign_id, since)).fetchone()
        return int(row[0]), int(row[1])

    def progress_mark(self) -> int:
        """A number that grows whenever the agent moves the loop: finished experiments, verdicts, notes."""
        return self.conn.execute(
            "SELECT (SELECT COUNT(*) FROM experiments WHERE status != 'running') + "
            "(SELECT COUNT(*) FROM experiments WHERE verdict IS NOT NULL) + (SELECT COUNT(*) FROM notes)").fetchone()[0]

    def running_experiments(self, campaign_id: Optional[int] = None) -> list[dict]:
        """Rows queued or running: of one campaign, or (None) of every campaign; oldest first."""
        if campaign_id is not None:
            return self._experiments(campaign_id, "status='running'")
        return [_experiment_row(r) for r in self.conn.execute("SELECT * FROM experiments WHERE status='running' ORDER BY id")]

    def interrupted_candidates(self) -> list[dict]:
        """Candidates (any campaign) still waiting for a score that can never come: one of their own seed runs
        was interrupted. Asynchronous submissions are not among them (loop/asyncrun.py re-queues and decides
        those)."""
        return [_experiment_row(r) for r in self.conn.execute(
            "SELECT * FROM experiments e WHERE e.status='ok' AND e.is_baseline=0 AND e.confirm_of IS NULL "
            "AND e.verdict IS NULL AND EXISTS (SELECT 1 FROM experiments r WHERE r.confirm_of=e.id "
            "AND r.status='interrupted') AND NOT EXISTS (SELECT 1 FROM submissions s WHERE s.id=e.id "
            "OR s.current_id=e.id) ORDER BY e.id")]

    def count_running(self, campaign_id: int) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM experiments WHERE campaign_id=? AND status='running'",
                                     (campaign_id,)).fetchone()[0])

    # -- asynchronous experiments (loop/asyncrun.py) ----------------------------------------------
    def add_submission(self, campaign_id: int, experiment_id: int) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO submissions(id, campaign_id, current_id, submitted_at) VALUES (?,?,?,?)",
                      (experiment_id, campaign_id, experiment_id, time.time()))

    def submission(self, submission_id: int) -> Optional[dict]:
        return _row(self.conn.execute("SELECT * FROM submissions WHERE id=?", (submission_id,)).fetchone())

    def submissions(self, campaign_id: int, open_only: bool = False) -> list[dict]:
        sql = "SELECT * FROM submissions WHERE campaign_id=?" + (" AND decided_at IS NULL" if open_only else "")
        return [dict(r) for r in self.conn.execute(sql + " ORDER BY id", (campaign_id,))]

    def set_submission(self, submission_id: int, current_id: Optional[int] = None, decided: bool = False) -> None:
        with self.tx() as c:
            if current_id is not None:
                c.execute("UPDATE submissions SET current_id=? WHERE id=?", (current_id, submission_id))
            if decided:
                c.execute("UPDATE submissions SET decided_at=? WHERE id=?", (time.time(), submission_id))

    def unreported_submissions(self, campaign_id: int) -> list[dict]:
        """Decided submissions whose verdict wait() has not handed over yet."""
        return [dict(r) for r in self.conn.execute(
            "SELECT * FROM submissions WHERE campaign_id=? AND decided_at IS NOT NULL AND reported_at IS NULL "
            "ORDER BY id", (campaign_id,))]

    def mark_submissions_reported(self, submission_ids: list[int]) -> None:
        with self.tx() as c:
            c.executemany("UPDATE submissions SET reported_at=? WHERE id=? AND reported_at IS NULL",
                          [(time.time(), i) for i in submission_ids])

    def add_inflight(self, run_id: int, campaign_id: int, executor: str, attempt: int = 1) -> None:
        with self.tx() as c:
            c.execute("INSERT OR REPLACE INTO inflight(run_id, campaign_id, attempt, executor, submitted_at) "
                      "VALUES (?,?,?,?,?)", (run_id, campaign_id, attempt, executor, time.time()))

    def inflight(self, campaign_id: Optional[int] = None) -> list[dict]:
        if campaign_id is None:
            return [dict(r) for r in self.conn.execute("SELECT * FROM inflight ORDER BY run_id")]
        return [dict(r) for r in self.conn.execute("SELECT * FROM inflight WHERE campaign_id=? ORDER BY run_id",
                                                   (campaign_id,))]

    def remove_inflight(self, run_id: int) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM inflight WHERE run_id=?", (run_id,))

    def repoint_runs(self, old_id: int, new_id: int) -> None:
        """A re-queued run replaces a lost one: runs paired with it, or confirming it, point at the new one."""
        with self.tx() as c:
            c.execute("UPDATE experiments SET paired_with=? WHERE paired_with=?", (new_id, old_id))
            c.execute("UPDATE experiments SET confirm_of=? WHERE confirm_of=? AND id != ?", (new_id, old_id, new_id))

    def baseline_samples(self, campaign_id: int) -> list[float]:
        # No ORDER BY: it would steer SQLite to the (campaign_id, id) index and a full scan.
        rows = self.conn.execute(
            "SELECT id, val_bpb FROM experiments INDEXED BY experiments_baseline WHERE campaign_id=? "
            "AND is_baseline=1 AND status='ok' AND val_bpb IS NOT NULL", (campaign_id,))
        return [v for _, v in sorted(tuple(r) for r in rows)]

    def runs_of_commit(self, campaign_id: int, commit: str) -> list[dict]:
        """Finished, scored-ok runs of one commit (the reference's samples), oldest first."""
        return [_experiment_row(r) for r in self.conn.execute(
            "SELECT * FROM experiments WHERE campaign_id=? AND commit_sha=? AND status='ok' AND val_bpb IS NOT NULL "
            "ORDER BY id", (campaign_id, commit))]

    def paired_differences(self, campaign_id: int) -> list[tuple[int, float]]:
        """(comparison id, d = candidate - reference) for every recorded seed-matched pair of the campaign."""
        return [(int(r[0]), float(r[1])) for r in self.conn.execute(
            "SELECT COALESCE(e.confirm_of, e.id), e.val_bpb - r.val_bpb FROM experiments e JOIN experiments r "
            "ON r.id = e.paired_with WHERE e.campaign_id=? AND e.status='ok' AND r.status='ok' "
            "AND e.val_bpb IS NOT NULL AND r.val_bpb IS NOT NULL ORDER BY e.id", (campaign_id,))]

    # -- replays (re-runs of kept changes against their parents; not campaign experiments) ----------
    def next_replay_number(self, campaign_id: int) -> int:
        r = self.conn.execute("SELECT COALESCE(MAX(replay), 0) FROM replays WHERE campaign_id=?",
                              (campaign_id,)).fetchone()
        return int(r[0]) + 1

    def add_replay_run(self, campaign_id: int, replay: int, experiment_id: int, side: str, commit: str,
                       seed: int, status: str, val_bpb: Optional[float], num_steps: Optional[int],
                       reason: Optional[str], started_at: float) -> int:
        with self.tx() as c:
            return _rowid(c.execute(
                "INSERT INTO replays(campaign_id, replay, experiment_id, side, commit_sha, seed, status, val_bpb, "
                "num_steps, reason, started_at, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (campaign_id, replay, experiment_id, side, commit, seed, status, val_bpb, num_steps, reason,
                 started_at, time.time())))

    def replay_runs(self, campaign_id: int, replay: Optional[int] = None) -> list[dict]:
        """Runs of one replay (default: the latest), oldest first."""
        if replay is None:
            replay = self.next_replay_number(campaign_id) - 1
        return [dict(r) for r in self.conn.execute(
            "SELECT * FROM replays WHERE campaign_id=? AND replay=? ORDER BY id", (campaign_id, replay))]

    def seed_set(self, campaign_id: int) -> Optional[SeedSet]:
        """The campaign's current (highest-numbered) seed set; None before its first."""
        r = self.conn.execute("SELECT set_index, since_candidates FROM seed_sets WHERE campaign_id=? "
                              "ORDER BY set_index DESC LIMIT 1", (campaign_id,)).fetchone()
        if r is None:
            return None
        seeds = self.conn.execute("SELECT seed FROM seed_set_seeds WHERE campaign_id=? AND set_index=? "
                                  "ORDER BY position", (campaign_id, r[0]))
        return SeedSet(int(r[0]), tuple(int(x[0]) for x in seeds), int(r[1]))

    def start_seed_set(self, campaign_id: int, index: int, seeds: Iterable[int], since: int) -> SeedSet:
        """Record seed set `index` and return the current set: this one, or the one another process
        recorded under the same number first (two processes rotating at once agree on one set)."""
        seeds = [int(s) for s in seeds]
        if not seeds:
            raise LedgerError("a seed set needs at least one seed")
        with self.tx() as c:
            _insert_seed_set(c, campaign_id, index, seeds, since, time.time())
        cur = self.seed_set(campaign_id)
        assert cur is not None
        return cur

    def used_seeds(self, campaign_id: int) -> set[int]:
        """Every seed any run of the campaign (experiments and replays) has used."""
        rows = self.conn.execute("SELECT seed FROM experiments WHERE campaign_id=? AND seed IS NOT NULL UNION "
                                 "SELECT seed FROM replays WHERE campaign_id=?", (campaign_id, campaign_id))
        return {int(r[0]) for r in rows}

    def confirm_runs(self, experiment_id: int) -> list[dict]:
        return [_experiment_row(r) for r in self.conn.execute(
            "SELECT * FROM experiments WHERE confirm_of=? ORDER BY id", (experiment_id,))]

    def usage(self, campaign_id: int) -> tuple[int, float]:
        """(finished experiments, compute hours) in one pass over the covering index. A run that was lost or
        interrupted (the loop was stopped, not the change) is not an experiment: its time counts, it does not."""
        r = self.conn.execute(
            "SELECT COALESCE(SUM(status NOT IN ('running','lost','interrupted')), 0), "
            "COALESCE(SUM(COALESCE(finished_at, ?) - started_at), 0) FROM experiments WHERE campaign_id=?",
            (time.time(), campaign_id)).fetchone()
        return int(r[0]), float(r[1]) / 3600.0

    # -- sessions -----------------------------------------------------------
    def start_session(self, campaign_id: Optional[int], trigger: str, agent: str, detail: str = "") -> int:
        with self.tx() as c:
            cur = c.execute("INSERT INTO sessions(campaign_id, trigger, agent, started_at, detail) VALUES (?,?,?,?,?)",
                            (campaign_id, trigger, agent, time.time(), detail))
            return _rowid(cur)

    def end_session(self, session_id: int, exit_code: Optional[int], turns: Optional[int] = None,
                    cost_usd: float = 0.0, detail: Optional[str] = None) -> None:
        with self.tx() as c:
            c.execute("UPDATE sessions SET ended_at=?, exit_code=?, turns=?, cost_usd=?, "
                      "detail=COALESCE(?, detail) WHERE id=?",
                      (time.time(), exit_code, turns, float(cost_usd or 0.0), detail, session_id))

    def session(self, session_id: int) -> Optional[dict]:
        return _row(self.conn.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone())

    def sessions(self, campaign_id: Optional[int] = None) -> list[dict]:
        if campaign_id is None:
            return [dict(r) for r in self.conn.execute("SELECT * FROM sessions ORDER BY id")]
        return [dict(r) for r in self.conn.execute("SELECT * FROM sessions WHERE campaign_id=? ORDER BY id",
                                                   (campaign_id,))]

    def total_cost(self, campaign_id: int) -> float:
        row = self.conn.execute("SELECT COALESCE(SUM(cost_usd),0) FROM sessions WHERE campaign_id=?",
                                (campaign_id,)).fetchone()
        return float(row[0])

    # -- notes --------------------------------------------------------------
    def add_note(self, campaign_id: int, kind: str, text: str, experiment_id: Optional[int] = None) -> int:
        with self.tx() as c:
            cur = c.execute("INSERT INTO notes(campaign_id, kind, text, experiment_id, created_at) VALUES (?,?,?,?,?)",
                            (campaign_id, kind, text, experiment_id, time.time()))
            return _rowid(cur)

    def notes(self, campaign_id: int, limit: Optional[int] = None) -> list[dict]:
        sql = "SELECT * FROM notes WHERE campaign_id=? ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        return [dict(r) for r in self.conn.execute(sql, (campaign_id,))]

    # -- events and the connector outbox ------------------------------------
    def add_event(self, campaign_id: Optional[int], kind: str, payload: dict,
                  sinks: Iterable[str] = ()) -> int:
        """Record an event; one pending delivery per sink is created in the same transaction."""
        with self.tx() as c:
            cur = c.execute("INSERT INTO events(campaign_id, kind, payload, created_at) VALUES (?,?,?,?)",
                            (campaign_id, kind, json.dumps(payload, sort_keys=True), time.time()))
            event_id = _rowid(cur)
            for sink in sinks:
                c.execute("INSERT INTO deliveries(event_id, sink) VALUES (?,?)", (event_id, sink))
            return event_id

    def events(self, campaign_id: Optional[int] = None, kind: Optional[str] = None,
               since_id: int = 0) -> list[dict]:
        sql = "SELECT * FROM events WHERE id>?"
        args: list[Any] = [since_id]
        if campaign_id is not None:
            sql += " AND campaign_id=?"
            args.append(campaign_id)
        if kind is not None:
            sql += " AND kind=?"
            args.append(kind)
        return self._with_payload(sql, args)

    def _with_payload(self, sql: str, args: list) -> list[dict]:
        """The rows in id order, their JSON payload decoded (payload columns are NOT NULL)."""
        out = []
        for r in self.conn.execute(sql + " ORDER BY id", args):
            d = dict(r)
            d["payload"] = json.loads(d["payload"] or "{}")
            out.append(d)
        return out

    def ensure_deliveries(self, sink: str, kinds: Optional[Iterable[str]] = None) -> int:
        """Create pending deliveries for `sink` for events that have none (a sink added later)."""
        sql = ("INSERT OR IGNORE INTO deliveries(event_id, sink) SELECT id, ? FROM events e WHERE NOT EXISTS "
               "(SELECT 1 FROM deliveries d WHERE d.event_id=e.id AND d.sink=?)")
        args: list[Any] = [sink, sink]
        if kinds is not None:
            kinds = list(kinds)
            sql += f" AND e.kind IN ({','.join('?' * len(kinds))})"
            args += kinds
        with self.tx() as c:
            return c.execute(sql, args).rowcount

    def has_due_deliveries(self, now: Optional[float] = None, kind: Optional[str] = None) -> bool:
        """Is any (event, sink) delivery (of `kind`) pending and due? Cheap: one index probe."""
        now = time.time() if now is None else now
        if kind is None:
            return self.conn.execute("SELECT 1 FROM deliveries WHERE status='pending' AND next_attempt_at<=? "
                                     "AND lease_until<=? LIMIT 1", (now, now)).fetchone() is not None
        return self.conn.execute(
            "SELECT 1 FROM deliveries d JOIN events e ON e.id=d.event_id WHERE d.status='pending' "
            "AND d.next_attempt_at<=? AND e.kind=? LIMIT 1", (now, kind)).fetchone() is not None

    def last_event_id(self) -> int:
        return int(self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])

    def due_deliveries(self, sink: str, now: Optional[float] = None, limit: int = 50) -> list[dict]:
        now = time.time() if now is None else now
        rows = self.conn.execute(
            "SELECT d.*, e.kind, e.payload, e.campaign_id, e.created_at FROM deliveries d JOIN events e "
            "ON e.id=d.event_id WHERE d.sink=? AND d.status='pending' AND d.next_attempt_at<=? "
            "ORDER BY d.event_id LIMIT ?", (sink, now, limit))
        out = []
        for r in rows:
            d = dict(r)
            d["payload"] = json.loads(d["payload"])
            out.append(d)
        return out

    def claim_delivery(self, sink: str, owner: str, now: Optional[float] = None, lease_s: float = 300.0,
                       after_event_id: int = 0, ordered_kinds: Iterable[str] = ()) -> Optional[dict]:
        """Claim the next due pending row of `sink` (event id > after_event_id) for `owner`, atomically:
        no other pass can take it until the lease expires or the owner records an outcome.

        One row of a sink is in flight at a time: while another owner holds a live lease on one, nothing is
        claimed, so two passes never work on the same campaign at once (one Jira issue, messages in event
        order). A row of `ordered_kinds` (a campaign's closing events) also waits until every earlier row of
        its campaign for this sink is settled: a keep is announced before the budget_spent it caused."""
        now = time.time() if now is None else now
        kinds = list(ordered_kinds)
        ordered = (f"AND NOT (e.kind IN ({','.join('?' * len(kinds))}) AND EXISTS (SELECT 1 FROM deliveries p "
                   "JOIN events pe ON pe.id=p.event_id WHERE p.sink=d.sink AND p.status='pending' "
                   "AND p.event_id<d.event_id AND pe.campaign_id IS e.campaign_id)) ") if kinds else ""
        with self.tx() as c:   # BEGIN IMMEDIATE: the select and the claim are one write transaction
            r = c.execute(
                "SELECT d.*, e.kind, e.payload, e.campaign_id, e.created_at FROM deliveries d JOIN events e "
                "ON e.id=d.event_id WHERE d.sink=? AND d.status='pending' AND d.next_attempt_at<=? "
                "AND d.lease_until<=? AND d.event_id>? "
                "AND NOT EXISTS (SELECT 1 FROM deliveries o WHERE o.sink=d.sink AND o.status='pending' "
                "AND o.lease_until>? AND o.claimed_by IS NOT ?) " + ordered +
                "ORDER BY d.event_id LIMIT 1",
                (sink, now, now, after_event_id, now, owner, *kinds)).fetchone()
            if r is None:
                return None
            c.execute("UPDATE deliveries SET claimed_by=?, lease_until=? WHERE event_id=? AND sink=?",
                      (owner, now + lease_s, r["event_id"], sink))
        d = dict(r)
        d["payload"] = json.loads(d["payload"])
        return d

    def delivery_leases(self, sink: str, now: Optional[float] = None) -> list[dict]:
        """The live leases on `sink`'s pending rows: (event_id, claimed_by, lease_until)."""
        now = time.time() if now is None else now
        return [dict(r) for r in self.conn.execute(
            "SELECT event_id, claimed_by, lease_until FROM deliveries WHERE sink=? AND status='pending' "
            "AND lease_until>? ORDER BY event_id", (sink, now))]

    def break_lease(self, event_id: int, sink: str, owner: str) -> bool:
        """Void `owner`'s lease on a row (its process is gone); the row is due again, no attempt counted."""
        with self.tx() as c:
            return c.execute("UPDATE deliveries SET claimed_by=NULL, lease_until=0 WHERE event_id=? AND sink=? "
                             "AND status='pending' AND claimed_by=?", (event_id, sink, owner)).rowcount == 1

    def release_delivery(self, event_id: int, sink: str, owner: str, next_attempt_at: float) -> bool:
        """Give a claimed row back without counting an attempt (e.g. its method is rate limited)."""
        with self.tx() as c:
            return c.execute("UPDATE deliveries SET claimed_by=NULL, lease_until=0, next_attempt_at=? "
                             "WHERE event_id=? AND sink=? AND status='pending' AND claimed_by IS ?",
                             (next_attempt_at, event_id, sink, owner)).rowcount == 1

    # The outcome updates below only touch a pending row, and with `owner` only one this pass still holds:
    # a delivered row never goes back to pending, and a pass whose lease expired cannot overwrite another's.
    def mark_delivered(self, event_id: int, sink: str, external_ref: Optional[str] = None,
                       owner: Optional[str] = None) -> bool:
        with self.tx() as c:
            return c.execute(
                "UPDATE deliveries SET status='delivered', attempts=attempts+1, delivered_at=?, "
                "external_ref=COALESCE(?, external_ref), last_error=NULL, claimed_by=NULL, lease_until=0 "
                "WHERE event_id=? AND sink=? AND status='pending' AND (? IS NULL OR claimed_by=?)",
                (time.time(), external_ref, event_id, sink, owner, owner)).rowcount == 1

    def mark_attempt_failed(self, event_id: int, sink: str, error: str, next_attempt_at: float,
                            give_up: bool = False, owner: Optional[str] = None) -> bool:
        with self.tx() as c:
            return c.execute(
                "UPDATE deliveries SET attempts=attempts+1, last_error=?, next_attempt_at=?, status=?, "
                "claimed_by=NULL, lease_until=0 "
                "WHERE event_id=? AND sink=? AND status='pending' AND (? IS NULL OR claimed_by=?)",
                (error[:500], next_attempt_at, "failed" if give_up else "pending", event_id, sink,
                 owner, owner)).rowcount == 1

    def set_delivery_ref(self, event_id: int, sink: str, external_ref: str) -> None:
        """Remember a partial result (e.g. a posted message ts) so a retry does not duplicate it."""
        with self.tx() as c:
            c.execute("UPDATE deliveries SET external_ref=? WHERE event_id=? AND sink=? AND status='pending'",
                      (external_ref, event_id, sink))

    def deliveries(self, sink: Optional[str] = None) -> list[dict]:
        if sink is None:
            return [dict(r) for r in self.conn.execute("SELECT * FROM deliveries ORDER BY event_id, sink")]
        return [dict(r) for r in self.conn.execute("SELECT * FROM deliveries WHERE sink=? ORDER BY event_id", (sink,))]

    # -- search mechanisms written at run time and their trials (mechanisms/registry.py, trial.py)
    def add_mechanism(self, name: str, kind: str, code_sha256: str, path_for: Any, rationale: str, author: str,
                      campaign_id: Optional[int], status: str, reason: Optional[str] = None,
                      validation: Optional[dict] = None) -> tuple[int, int]:
        """Record a new version of `name`; path_for(version) names its file. Returns (id, version)."""
        now = time.time()
        with self.tx() as c:
            version = 1 + c.execute("SELECT COALESCE(MAX(version), 0) FROM mechanisms WHERE name=?",
                                    (name,)).fetchone()[0]
            cur = c.execute(
                "INSERT INTO mechanisms(name, version, kind, code_sha256, path, rationale, author, campaign_id, "
                "status, reason, validation_json, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (name, version, kind, code_sha256, str(path_for(version)), rationale, author, campaign_id, status,
                 reason, json.dumps(validation) if validation is not None else None, now, now))
            return _rowid(cur), version

    def mechanism(self, mechanism_id: Optional[int] = None, name: Optional[str] = None,
                  version: Optional[int] = None) -> Optional[dict]:
        """By id, or by name (a given version, else the latest)."""
        if mechanism_id is not None:
            return _row(self.conn.execute("SELECT * FROM mechanisms WHERE id=?", (mechanism_id,)).fetchone())
        if version is not None:
            return _row(self.conn.execute("SELECT * FROM mechanisms WHERE name=? AND version=?",
                                          (name, version)).fetchone())
        return _row(self.conn.execute("SELECT * FROM mechanisms WHERE name=? ORDER BY version DESC LIMIT 1",
                                      (name,)).fetchone())

    def mechanisms(self, statuses: Optional[Iterable[str]] = None) -> list[dict]:
        if statuses is None:
            return [dict(r) for r in self.conn.execute("SELECT * FROM mechanisms ORDER BY id")]
        st = list(statuses)
        return [dict(r) for r in self.conn.execute(
            f"SELECT * FROM mechanisms WHERE status IN ({','.join('?' * len(st))}) ORDER BY id", st)]

    def set_mechanism_status(self, mechanism_id: int, status: str, reason: Optional[str] = None) -> None:
        with self.tx() as c:
            c.execute("UPDATE mechanisms SET status=?, reason=COALESCE(?, reason), updated_at=? WHERE id=?",
                      (status, reason, time.time(), mechanism_id))

    def start_trial(self, mechanism_id: int, campaign_id: int, window: int, start_experiment_id: int) -> int:
        """Activate a mechanism on trial; refuses (LedgerError) while another trial runs in the campaign."""
        now = time.time()
        with self.tx() as c:
            busy = c.execute("SELECT t.id, m.name FROM mechanism_trials t JOIN mechanisms m ON m.id=t.mechanism_id "
                             "WHERE t.campaign_id=? AND t.outcome='running'", (campaign_id,)).fetchone()
            if busy:
                raise LedgerError(f"mechanism {busy['name']!r} is on trial (trial {busy['id']}); one trial at a "
                                  "time: wait for its verdict or revert it first")
            cur = c.execute("INSERT INTO mechanism_trials(mechanism_id, campaign_id, window, start_experiment_id, "
                            "started_at) VALUES (?,?,?,?,?)", (mechanism_id, campaign_id, window,
                                                               start_experiment_id, now))
            c.execute("UPDATE mechanisms SET status='active', reason=NULL, updated_at=? WHERE id=?",
                      (now, mechanism_id))
            return _rowid(cur)

    def end_trial(self, trial_id: int, outcome: str, reason: str, stats: Optional[dict],
                  end_experiment_id: Optional[int]) -> bool:
        """Close a running trial and set its mechanism kept or reverted, in one transaction.
        False when the trial had already ended (another process decided first)."""
        now = time.time()
        with self.tx() as c:
            cur = c.execute("UPDATE mechanism_trials SET outcome=?, reason=?, stats_json=?, end_experiment_id=?, "
                            "ended_at=? WHERE id=? AND outcome='running'",
                            (outcome, reason, json.dumps(stats) if stats is not None else None, end_experiment_id,
                             now, trial_id))
            if cur.rowcount != 1:
                return False
            mid = c.execute("SELECT mechanism_id FROM mechanism_trials WHERE id=?", (trial_id,)).fetchone()[0]
            c.execute("UPDATE mechanisms SET status=?, reason=?, updated_at=? WHERE id=?",
                      ("kept" if outcome == "kept" else "reverted", reason, now, mid))
            return True

    def trials(self, campaign_id: Optional[int] = None, running: bool = False) -> list[dict]:
        sql = ("SELECT t.*, m.name, m.version FROM mechanism_trials t JOIN mechanisms m ON m.id=t.mechanism_id "
               "WHERE 1=1")
        args: list[Any] = []
        if campaign_id is not None:
            sql += " AND t.campaign_id=?"
            args.append(campaign_id)
        if running:
            sql += " AND t.outcome='running'"
        out = []
        for r in self.conn.execute(sql + " ORDER BY t.id", args):
            d = dict(r)
            d["stats"] = json.loads(d.pop("stats_json") or "null")
            out.append(d)
        return out

    def max_experiment_id(self, campaign_id: int) -> int:
        return int(self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM experiments WHERE campaign_id=?",
                                     (campaign_id,)).fetchone()[0])

    # -- approvals (the autonomy slider) -------------------------------------
    def create_approval(self, campaign_id: int, kind: str, commit_sha: str, base_commit: str, description: str,
                        branch_prefix: str, experiment_id: Optional[int] = None, source_sha: Optional[str] = None,
                        payload: Optional[dict] = None, expires_at: Optional[float] = None) -> int:
        """A pending approval; its branch is `branch_prefix` + its id."""
        with self.tx() as c:
            aid = _rowid(c.execute(
                "INSERT INTO approvals(campaign_id, kind, experiment_id, commit_sha, base_commit, source_sha, "
                "description, payload, created_at, expires_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (campaign_id, kind, experiment_id, commit_sha, base_commit, source_sha, description,
                 json.dumps(payload or {}, sort_keys=True), time.time(), expires_at)))
            c.execute("UPDATE approvals SET branch=? WHERE id=?", (f"{branch_prefix}{aid}", aid))
            return aid

    def approval(self, approval_id: int) -> Optional[dict]:
        r = _row(self.conn.execute("SELECT * FROM approvals WHERE id=?", (approval_id,)).fetchone())
        if r is not None:
            r["payload"] = json.loads(r["payload"] or "{}")
        return r

    def approvals(self, campaign_id: Optional[int] = None, statuses: Iterable[str] = (),
                  kind: Optional[str] = None) -> list[dict]:
        sql = "SELECT * FROM approvals WHERE 1=1"
        args: list[Any] = []
        if campaign_id is not None:
            sql += " AND campaign_id=?"
            args.append(campaign_id)
        statuses = list(statuses)
        if statuses:
            sql += f" AND status IN ({','.join('?' * len(statuses))})"
            args += statuses
        if kind is not None:
            sql += " AND kind=?"
            args.append(kind)
        return self._with_payload(sql, args)

    def decide_approval(self, approval_id: int, status: str, who: str, via: str, note: Optional[str] = None,
                        at: Optional[float] = None) -> bool:
        """Decide a pending approval, once: True if this call decided it, False if it was decided already."""
        if status not in ("approved", "rejected", "expired"):
            raise LedgerError(f"unknown decision {status!r}")
        with self.tx() as c:
            return c.execute("UPDATE approvals SET status=?, decided_by=?, decided_via=?, decided_at=?, "
                             "decision_note=? WHERE id=? AND status='pending'",
                             (status, who, via, time.time() if at is None else at, note, approval_id)).rowcount == 1

    def settle_approval(self, approval_id: int, status: str, outcome: str, from_status: str = "approved",
                        experiment_id: Optional[int] = None) -> bool:
        """Record what applying an approved change did (applied, stale, conflict, ran), once."""
        if status not in ("applied", "stale", "conflict", "ran"):
            raise LedgerError(f"unknown settlement {status!r}")
        with self.tx() as c:
            return c.execute("UPDATE approvals SET status=?, outcome=?, applied_at=?, "
                             "experiment_id=COALESCE(?, experiment_id) WHERE id=? AND status=?",
                             (status, outcome[:1000], time.time(), experiment_id, approval_id,
                              from_status)).rowcount == 1

    def expired_approvals(self, now: float) -> list[int]:
        return [r[0] for r in self.conn.execute(
            "SELECT id FROM approvals WHERE status='pending' AND expires_at IS NOT NULL AND expires_at<=? ORDER BY id",
            (now,))]

    # -- key/value for small bits of state (e.g. a Jira issue key per campaign)
    def kv_get(self, key: str) -> Optional[str]:
        r = self.conn.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return r[0] if r else None

    def kv_set(self, key: str, value: str) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO kv(key, value) VALUES (?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                      (key, value))

    def kv_setdefault(self, key: str, value: str) -> str:
        """Set `key` unless it is set; returns the value it holds now (the first writer's wins)."""
        with self.tx() as c:
            c.execute("INSERT OR IGNORE INTO kv(key, value) VALUES (?,?)", (key, value))
            return c.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()[0]

    def kv_delete(self, key: str) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM kv WHERE key=?", (key,))

    # -- the person's stop request (`loopwright stop`, a webhook): honoured at the next budget check
    def stop_request(self) -> Optional[str]:
        return self.kv_get(STOP_KEY)

    def request_stop(self, reason: str) -> None:
        self.kv_set(STOP_KEY, reason)

    def clear_stop_request(self) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM kv WHERE key=?", (STOP_KEY,))
