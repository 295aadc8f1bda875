"""Unit tests of the config model, the ledger, noise-aware verdicts and budgets."""
import sqlite3
import time

import pytest

from mcp_server.ledger.store import MIGRATIONS, Ledger, LedgerError
from mcp_server.loop import budget, verdict
from mcp_server.loop.config import (
    FROZEN_SECTIONS,
    OPERATIONAL_SECTIONS,
    BudgetConfig,
    ConfigError,
    LoopwrightConfig,
    NoiseConfig,
    dump_config,
    parse_config,
)
from mcp_server.report.tsv import COLUMNS, export_tsv

# -- config -------------------------------------------------------------------

def test_config_round_trip_and_frozen_hash_ignores_operational_sections():
    cfg = LoopwrightConfig()
    assert "[budget]" not in dump_config(cfg)       # loopwright.toml holds the frozen sections only
    every = FROZEN_SECTIONS + OPERATIONAL_SECTIONS
    again = parse_config(dump_config(cfg, every))
    assert again == cfg and "schedule = []" not in dump_config(cfg, every)
    changed_budget = parse_config(dump_config(cfg, every).replace("max_experiments = 50", "max_experiments = 7"))
    assert changed_budget.budget.max_experiments == 7
    assert changed_budget.frozen_hash() == cfg.frozen_hash()
    changed_bench = parse_config(dump_config(cfg).replace("time_budget = 30.0", "time_budget = 31.0"))
    assert changed_bench.frozen_hash() != cfg.frozen_hash()


def test_a_lock_written_before_later_frozen_fields_existed_still_matches_after_an_upgrade():
    """An older loopwright hashed the frozen sections without the fields added since (LATE_FROZEN_FIELDS),
    and its pinned loopwright.toml does not name them: at their defaults they are not tampering. A field
    the workspace's toml sets away from its default means it was made when the field existed."""
    import hashlib
    import json

    from mcp_server.loop.config import LATE_FROZEN_FIELDS

    def old_hash(cfg, missing):
        # what an older loopwright hashed: the GPT benchmark's three sections ([target] came later and is
        # hashed only in a target workspace)
        data = {name: getattr(cfg, name).model_dump(mode="json") for name in ("benchmark", "paths", "noise")}
        for section, name in missing:
            del data[section][name]
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    full = dump_config(LoopwrightConfig())
    for k in range(len(LATE_FROZEN_FIELDS) + 1):
        missing = LATE_FROZEN_FIELDS[k:]
        # the toml of that older version: the fields it did not know are absent
        text = "\n".join(ln for ln in full.splitlines()
                         if not any(ln.startswith(f"{name} =") for _, name in missing))
        cfg = parse_config(text)
        assert old_hash(cfg, missing) in cfg.frozen_hashes(), missing
    # the newest field set away from its default: no older lock can match, and a changed value never does
    assert LATE_FROZEN_FIELDS[-1] == ("noise", "max_pairs")
    cfg = parse_config(full.replace("max_pairs = 6", "max_pairs = 5"))
    assert cfg.noise.max_pairs == 5 and cfg.frozen_hashes() == {cfg.frozen_hash()}
    assert LoopwrightConfig().frozen_hash() not in cfg.frozen_hashes()
    changed = parse_config(full.replace("time_budget = 30.0", "time_budget = 31.0"))
    assert not LoopwrightConfig().frozen_hashes() & changed.frozen_hashes()


@pytest.mark.parametrize("text, needle", [
    ("[benchmark]\ntime_budget = -1\n", "benchmark.time_budget"),
    ("[benchmark]\ntime_buget = 3\n", "benchmark.time_buget: unknown key"),
    ("[[schedule]]\ncron = '61 * * * *'\n", "schedule.0.cron"),
    ("[[schedule]]\ncron = '0 1 * * *'\ntimezone = 'Mars/Base'\n", "unknown timezone"),
    ("[jira]\nproject = 'X'\n", "jira.server: required key is missing"),
    ("[paths]\neditable = ['../x.py']\n", "must be relative"),
    ("[campaign\n", "not valid TOML"),
])
def test_config_errors_name_the_key_and_the_fix(text, needle):
    with pytest.raises(ConfigError) as e:
        parse_config(text, "ws/loopwright.toml")
    assert needle in str(e.value)


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


# -- verdicts -----------------------------------------------------------------

NOISE = NoiseConfig(k_sigma=2.0, min_delta=0.001, sigma_floor=0.0005, retest_band=0.5, max_confirms=2)


def test_paired_sigma_has_a_floor():
    floor = NoiseConfig(sigma_prior=0.0, prior_pairs=0, sigma_floor=0.002)
    assert verdict.pooled_sigma([[0.01]], floor)[0] == 0.002               # one pair: no spread to measure
    assert verdict.pooled_sigma([[0.01, 0.01, 0.01]], floor)[0] == 0.002   # agreeing pairs are not zero noise
    assert verdict.pooled_sigma([[0.0, 0.02, -0.02]], floor)[0] == pytest.approx(0.02)


def test_keep_discard_retest_bands():
    sigma = 0.01  # bar with 2 pairs: 2 * 0.01 / sqrt(2) = 0.014142
    bar = verdict.bar(sigma, NOISE, 2)
    assert bar == pytest.approx(0.0141421, rel=1e-4)
    assert verdict.decide([-0.02, -0.02], sigma, NOISE, 2).kind == "keep"
    assert verdict.decide([-0.01, -0.01], sigma, NOISE, 2).kind == "retest"
    assert verdict.decide([-0.004, -0.004], sigma, NOISE, 2).kind == "discard"
    assert verdict.decide([+0.01, +0.01], sigma, NOISE, 2).kind == "discard"


def test_confirm_pairs_tighten_the_bar_and_are_bounded():
    sigma = 0.01
    # mean gain 0.012: retest on 2 pairs, keep when a confirm pair agrees (the bar shrinks with n)
    assert verdict.decide([-0.012, -0.012], sigma, NOISE, 2).kind == "retest"
    assert verdict.decide([-0.012, -0.012, -0.012], sigma, NOISE, 2, n_confirms=1).kind == "keep"
    # a lucky start that the confirm pair does not reproduce is discarded once confirms are exhausted
    assert verdict.decide([-0.012, -0.012, 0.0, 0.0], sigma, NOISE, 2, n_confirms=2).kind == "discard"


def test_min_delta_dominates_when_noise_is_tiny():
    noise = NoiseConfig(k_sigma=2.0, min_delta=0.01, sigma_floor=0.0)
    assert verdict.decide([-0.005, -0.005], 1e-6, noise, 2).kind != "keep"


def test_seed_only_changes_are_detected():
    old = "SEED = 0\nLR = 0.01\ntorch.manual_seed(SEED)\n"
    assert verdict.seed_only_change(old, "SEED = 123\nLR = 0.01\ntorch.manual_seed(SEED)\n")
    assert verdict.seed_only_change(old, "SEED = 0\nLR = 0.01\ntorch.manual_seed(42)  # lucky\n")
    assert not verdict.seed_only_change(old, "SEED = 0\nLR = 0.02\ntorch.manual_seed(SEED)\n")
    assert not verdict.seed_only_change(old, old)


# -- budget -------------------------------------------------------------------

def test_budget_counts_experiments_cost_and_target(tmp_path):
    led = Ledger(tmp_path / "s.db")
    cid = led.create_campaign("t", "b", "abc")
    cfg = BudgetConfig(max_experiments=2, max_hours=1.0, max_cost_usd=1.0, target_metric=1.5)
    st = budget.check(led, cid, cfg, best_metric=2.0)
    assert not st.should_stop and st.experiments_left == 2
    for _ in range(2):
        e = led.start_experiment(cid, "x")
        led.update_experiment(e, status="ok", finished_at=time.time())
    st = budget.check(led, cid, cfg, best_metric=2.0)
    assert st.should_stop and "experiment budget spent" in st.reasons[0]
    sid = led.start_session(cid, "cron", "claude")
    led.end_session(sid, 0, turns=3, cost_usd=1.25)
    st = budget.check(led, cid, BudgetConfig(max_experiments=None, max_cost_usd=1.0), best_metric=2.0)
    assert st.should_stop and "cost budget spent" in st.reasons[0] and st.cost_used_usd == 1.25
    st = budget.check(led, cid, BudgetConfig(max_experiments=None, max_cost_usd=None, target_metric=2.5),
                      best_metric=2.0)
    assert st.should_stop and "target reached" in st.reasons[0]


def test_results_tsv_keeps_autoresearch_columns_first(tmp_path):
    led = Ledger(tmp_path / "s.db")
    cid = led.create_campaign("t", "b", "abc")
    e = led.start_experiment(cid, "baseline\twith tab", is_baseline=1, commit_sha="abcdef1234")
    led.update_experiment(e, status="ok", val_bpb=1.234567, verdict="baseline", memory_gb=0.5)
    e = led.start_experiment(cid, "bigger lr", commit_sha="1234567890")
    led.update_experiment(e, status="crash", reason="exit 1")
    lines = export_tsv(led, cid).splitlines()
    assert lines[0].split("\t")[:5] == ["commit", "val_bpb", "memory_gb", "status", "description"]
    assert len(lines[0].split("\t")) == len(COLUMNS)
    assert lines[1].split("\t")[:5] == ["abcdef1", "1.234567", "0.500000", "keep", "baseline with tab"]
    assert lines[2].split("\t")[3] == "crash"


def test_results_tsv_shows_a_finished_reference_run_of_the_best_as_kept_not_pending(tmp_path):
    # a confirm's reference run re-measures the kept best on a fresh seed; it has no verdict of its own
    led = Ledger(tmp_path / "s.db")
    cid = led.create_campaign("t", "b", "abc")
    e = led.start_experiment(cid, "reference: best #3 on seed 6003 (confirm of #5)", commit_sha="4ba8c1a",
                             role="reference", seed=6003)
    led.update_experiment(e, status="ok", val_bpb=2.989)
    e = led.start_experiment(cid, "still running", commit_sha="5ca1ab1", role="candidate")
    cells = [ln.split("\t") for ln in export_tsv(led, cid).splitlines()[1:]]
    assert cells[0][3] == "keep" and cells[0][COLUMNS.index("verdict")] == "reference"
    assert cells[1][3] == "pending"
