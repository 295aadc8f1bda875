"""The config model: round trip, the frozen hash, upgrades, errors that name the key and the fix."""

import pytest

from mcp_server.loop.config import (
    FROZEN_SECTIONS,
    OPERATIONAL_SECTIONS,
    ConfigError,
    LoopwrightConfig,
    dump_config,
    parse_config,
)

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
    assert LATE_FROZEN_FIELDS[-1] == ("noise", "spread_alpha")
    cfg = parse_config(full.replace("spread_alpha = 0.0", "spread_alpha = 0.01"))
    assert cfg.noise.spread_alpha == 0.01 and cfg.frozen_hashes() == {cfg.frozen_hash()}
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
