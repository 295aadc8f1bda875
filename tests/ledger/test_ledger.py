"""The ledger (mcp_server/ledger/store.py): its named questions about experiments, the seed-set table and
the migration that moves an old ledger's seed sets out of kv."""
from __future__ import annotations

import json

import pytest

from mcp_server.ledger import store
from mcp_server.ledger.store import Ledger, LedgerError, SeedSet
from tests.conftest import make_workspace


def _campaign(led: Ledger) -> tuple[int, dict[str, int]]:
    """A campaign with one row of each kind the loop writes; returns (campaign id, name -> row id)."""
    cid = led.create_campaign("t", "loopwright/t", "c0")
    ids: dict[str, int] = {}

    def add(name: str, **f) -> None:
        ids[name] = led.start_experiment(cid, name, **f)

    add("base", is_baseline=1, status="ok", val_bpb=2.0, test_bpb=2.1, verdict="baseline", seed=1, commit_sha="c0")
    add("base_no_test", is_baseline=1, status="ok", val_bpb=2.0, seed=2, commit_sha="c0")
    add("kept", status="ok", val_bpb=1.9, verdict="keep", source_sha="s1", seed=1, commit_sha="c1", role="candidate")
    add("pair_of_kept", status="ok", val_bpb=1.9, confirm_of=ids["kept"], source_sha="s1", seed=2, role="pair")
    led.set_best(cid, "c1", ids["kept"])
    add("ref_running", status="running", confirm_of=ids["kept"], seed=3, commit_sha="c1", role="reference")
    add("ref_no_seed", status="running", confirm_of=ids["kept"], commit_sha="c1", role="reference")
    add("retest", status="ok", val_bpb=1.95, verdict="retest", source_sha="s2", seed=1, role="candidate")
    add("interrupted", status="interrupted", source_sha="s3", role="candidate")
    add("cut_short", status="ok", verdict="discard", verdict_reason="interrupted: the loop was stopped",
        source_sha="s3", role="candidate")
    add("lost", status="lost", source_sha="s4", role="candidate")
    add("unscored", status="ok", val_bpb=1.99, source_sha="s5", seed=1, role="candidate")
    add("crashed", status="crash", source_sha="s6", role="candidate")
    return cid, ids


def _names(rows: list[dict]) -> list[str]:
    return [r["description"] for r in rows]


def test_named_questions_answer_what_they_say(tmp_path):
    with Ledger(tmp_path / "s.db") as led:
        cid, ids = _campaign(led)
        other = led.create_campaign("u", "loopwright/u", "c0")          # rows of another campaign never leak in
        led.start_experiment(other, "elsewhere", status="ok", verdict="retest", source_sha="s1")

        assert _names(led.candidates(cid)) == ["kept", "retest", "interrupted", "cut_short", "lost", "unscored",
                                               "crashed"]
        assert _names(led.candidates(cid, limit=2, newest_first=True)) == ["crashed", "unscored"]
        assert _names(led.kept_candidates(cid)) == ["kept"]
        assert _names(led.pending_retests(cid)) == ["retest"]
        assert _names(led.unscored_candidates(cid)) == ["unscored"]
        assert led.latest_scorable(cid)["description"] == "unscored"
        led.update_experiment(ids["unscored"], verdict="discard")
        assert led.latest_scorable(cid)["description"] == "retest"      # a retest waits for score() too
        assert _names(led.recent_non_baseline(cid, limit=3)) == ["crashed", "unscored", "lost"]
        assert _names(led.recent_finished(cid, limit=3)) == ["crashed", "unscored", "lost"]
        assert "ref_running" not in _names(led.recent_finished(cid, limit=100))
        assert _names(led.experiments_after(cid, ids["lost"])) == ["unscored", "crashed"]
        assert _names(led.baseline_runs_with_test(cid)) == ["base"]
        assert _names(led.running_runs_of_commit(cid, "c1")) == ["ref_running"]   # a seed is known
        assert _names(led.running_experiments(cid)) == ["ref_running", "ref_no_seed"]
        assert led.running_baseline_runs(cid) == []
        # every non-baseline row after the keep (its pair run included) counts toward a plateau
        assert led.count_since_best(cid) == len(ids) - 3
        assert led.count_experiments(cid) == len(ids)


def test_prior_of_source_skips_what_the_loop_stopped_not_the_change(tmp_path):
    with Ledger(tmp_path / "s.db") as led:
        cid, ids = _campaign(led)
        assert led.prior_of_source(cid, "s1", skip_statuses=())["id"] == ids["kept"]   # never the pair run
        assert led.prior_of_source(cid, "s3", skip_statuses=("interrupted",))["id"] == ids["cut_short"]
        assert led.prior_of_source(cid, "s3", skip_statuses=("interrupted",),
                                   skip_reason_prefix="interrupted: ") is None
        assert led.prior_of_source(cid, "s4", skip_statuses=("interrupted",))["id"] == ids["lost"]
        assert led.prior_of_source(cid, "s4", skip_statuses=("interrupted", "lost")) is None
        assert led.prior_of_source(cid, "never", skip_statuses=()) is None


def test_experiments_takes_no_sql(tmp_path):
    with Ledger(tmp_path / "s.db") as led:
        cid, _ = _campaign(led)
        with pytest.raises(TypeError):
            led.experiments(cid, where="1=1")   # type: ignore[call-arg]
        with pytest.raises(TypeError):
            led.count_experiments(cid, "1=1")   # type: ignore[call-arg]


def test_seed_sets_are_rows_and_the_first_writer_of_a_number_wins(tmp_path):
    with Ledger(tmp_path / "s.db") as led:
        cid = led.create_campaign("t", "loopwright/t", "c0")
        assert led.seed_set(cid) is None
        assert led.start_seed_set(cid, 0, [1001, 1002], since=0) == SeedSet(0, (1001, 1002), 0)
        # a second process rotating at the same moment gets the set already recorded, not a second one
        assert led.start_seed_set(cid, 0, [1003, 1004], since=0) == SeedSet(0, (1001, 1002), 0)
        assert led.start_seed_set(cid, 1, [1005, 1006, 1007], since=4) == SeedSet(1, (1005, 1006, 1007), 4)
        assert led.seed_set(cid) == SeedSet(1, (1005, 1006, 1007), 4)
        with pytest.raises(LedgerError, match="at least one seed"):
            led.start_seed_set(cid, 2, [], since=5)
    with Ledger(tmp_path / "s.db") as led:                          # it is on disk, not in the object
        assert led.seed_set(cid) == SeedSet(1, (1005, 1006, 1007), 4)


def test_an_old_ledger_keeps_its_seed_sets_when_they_move_out_of_kv(tmp_path):
    """A ledger written before the seed-set table (schema 12, the set as JSON in kv) opens and migrates:
    every campaign keeps its current set; what is not a seed set of a real campaign stays in kv."""
    saved = list(store.MIGRATIONS)
    try:
        store.MIGRATIONS[:] = saved[:12]
        with Ledger(tmp_path / "s.db") as led:
            assert led.schema_version == 12
            a = led.create_campaign("a", "loopwright/a", "c0")
            b = led.create_campaign("b", "loopwright/b", "c0")
            e = led.start_experiment(a, "baseline", is_baseline=1, seed=1001, seed_set=2, status="ok", val_bpb=2.0)
            led.kv_set(f"seedset:{a}", json.dumps({"index": 2, "seeds": [1005, 1006], "since": 7}))
            led.kv_set(f"seedset:{b}", json.dumps({"index": 0, "seeds": [1001], "since": 0}))
            led.kv_set("seedset:99", json.dumps({"index": 0, "seeds": [1], "since": 0}))   # no such campaign
            led.kv_set("seedset:x", "not json")
            led.kv_set("jira.issue.P.1", "P-7")
    finally:
        store.MIGRATIONS[:] = saved
    with Ledger(tmp_path / "s.db") as led:
        assert led.schema_version == len(saved)
        assert led.seed_set(a) == SeedSet(2, (1005, 1006), 7)
        assert led.seed_set(b) == SeedSet(0, (1001,), 0)
        assert led.kv_get(f"seedset:{a}") is None and led.kv_get(f"seedset:{b}") is None
        assert led.kv_get("seedset:99") is not None and led.kv_get("seedset:x") == "not json"
        assert led.kv_get("jira.issue.P.1") == "P-7"
        assert led.experiment(e)["seed_set"] == 2
        assert led.conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert led.start_seed_set(a, 3, [1007, 1008], since=9).index == 3   # rotation continues the numbering


def test_the_engine_rotates_seed_sets_through_the_table(tmp_path, small_corpus):
    """Engine.seed_set: one set until `rotate_every` candidates ran on it, then a fresh one of unused seeds;
    the row of each run holds its seed once (written when the row is made)."""
    from mcp_server.loop.engine import Engine

    ws = make_workspace(tmp_path / "ws", small_corpus, noise={"baseline_seeds": 2, "rotate_every": 2,
                                                              "first_seed": 1001})
    with Engine(ws.root) as eng:
        c = eng.campaign
        assert eng.seed_set(c, rotate=True) == (0, [1001, 1002])
        eng.ledger.start_experiment(c["id"], "one", seed=1001, status="ok", seed_set=0)
        assert eng.seed_set(c, rotate=True) == (0, [1001, 1002])           # one candidate: not yet
        eng.ledger.start_experiment(c["id"], "two", seed=1002, status="ok", seed_set=0)
        assert eng.seed_set(c) == (0, [1001, 1002])                        # without rotate: never
        assert eng.seed_set(c, rotate=True) == (1, [1003, 1004])
        assert eng.ledger.seed_set(c["id"]) == SeedSet(1, (1003, 1004), 2)
        assert eng.seed_set(c, rotate=True) == (1, [1003, 1004])


def test_changes_are_stored_typed_and_an_old_builtin_ledger_gets_them_from_its_descriptions(tmp_path):
    """Migration 14 adds the change columns; candidates the built-in agent described before ("LR 0.004 ->
    0.008") get their change once, so a resumed session learns from them; other rows get none."""
    saved = list(store.MIGRATIONS)
    try:
        store.MIGRATIONS[:] = saved[:13]
        with Ledger(tmp_path / "s.db") as led:
            cid = led.create_campaign("t", "loopwright/t", "c0")
            base = led.start_experiment(cid, "baseline (seed run 1/2, seed 1001)", is_baseline=1, status="ok")
            lr = led.start_experiment(cid, "LR 0.004 -> 0.008", status="ok", verdict="discard", val_bpb=2.0)
            off = led.start_experiment(cid, "GRAD_CLIP 1.0 -> 0 (off)", status="crash")
            flip = led.start_experiment(cid, "QK_NORM False -> True", status="ok", verdict="keep")
            pair = led.start_experiment(cid, "QK_NORM False -> True [seed 1002]", confirm_of=flip, status="ok")
            prose = led.start_experiment(cid, "try a wider model", status="ok")
            odd = led.start_experiment(cid, "LR x -> y", status="ok")
            before = {e: led.experiment(e) for e in (base, lr, off, flip, pair, prose, odd)}
    finally:
        store.MIGRATIONS[:] = saved
    with Ledger(tmp_path / "s.db") as led:
        assert led.schema_version == len(saved)
        got = {e: led.experiment(e) for e in before}
        for e, row in got.items():   # every recorded column is as it was
            assert before[e]["change"] is None
            assert {k: v for k, v in row.items() if k != "change"} == {k: v for k, v in before[e].items()
                                                                        if k != "change"}
        assert got[lr]["change"] == {"name": "LR", "old": 0.004, "new": 0.008}
        assert got[off]["change"] == {"name": "GRAD_CLIP", "old": 1.0, "new": 0}
        assert got[flip]["change"]["new"] is True
        assert [got[e]["change"] for e in (base, pair, prose, odd)] == [None] * 4
        # a new row stores its change with the value types it was given
        e = led.start_experiment(cid, "anything", change={"name": "D_MODEL", "old": 64, "new": 128})
        assert led.experiment(e)["change"] == {"name": "D_MODEL", "old": 64, "new": 128}
        assert type(led.experiment(e)["change"]["new"]) is int
        with pytest.raises(LedgerError, match="a change is {name, old, new}"):
            led.start_experiment(cid, "bad", change={"name": "LR", "to": 1})


def test_recorded_rows_are_rows_or_a_ledger_error_never_none(tmp_path):
    with Ledger(tmp_path / "s.db") as led:
        cid, ids = _campaign(led)
        assert led.recorded_experiment(ids["kept"])["description"] == "kept"
        assert led.recorded_campaign(cid)["tag"] == "t"
        with pytest.raises(LedgerError, match="experiment 999 is not in the ledger"):
            led.recorded_experiment(999)
        with pytest.raises(LedgerError, match="campaign 999 is not in the ledger"):
            led.recorded_campaign(999)
