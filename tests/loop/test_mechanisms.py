"""Search mechanisms on synthetic ledgers: tabu, plateau, bandit, and the suggest_next tool."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from mcp_server.agents.builtin import set_constant as edit_constant
from mcp_server.mechanisms import advise, near_repeat_warnings
from mcp_server.mechanisms.bandit import Bandit, reward
from mcp_server.mechanisms.base import Advice, History, combine, history_from_rows
from mcp_server.mechanisms.plateau import Plateau
from mcp_server.mechanisms.source import DENY_RE, all_constants, category_of, constant_values, skeleton, tunable_constants
from mcp_server.mechanisms.tabu import Tabu

from conftest import BENCH, FROZEN_PY, RECIPE_TRAIN, make_workspace, record_baseline, set_constant

TRAIN = RECIPE_TRAIN


class Synthetic:
    """A fake campaign: baseline rows, then candidates that change constants of the best version."""

    def __init__(self, baseline=(2.00, 2.01), source: str = TRAIN):
        self.rows: list[dict] = []
        self.sources = {"c0": source}
        self.best_commit = "c0"
        self.best_val = sum(baseline) / len(baseline)
        for v in baseline:
            self._row(is_baseline=1, status="ok", val_bpb=v, verdict="baseline", commit_sha="c0",
                      description="baseline")

    def _row(self, **kw) -> dict:
        row = {"id": len(self.rows) + 1, "is_baseline": 0, "status": "ok", "val_bpb": None, "test_bpb": None,
               "confirm_of": None, "verdict": None, "commit_sha": None, "parent_commit": None, "description": ""}
        row.update(kw)
        self.rows.append(row)
        return row

    def trial(self, changes: dict, verdict: str = "discard", val: float | None = 2.05, status: str = "ok",
              source: str | None = None) -> dict:
        src = self.sources[self.best_commit]
        for name, value in changes.items():
            src = edit_constant(src, name, value)
        if source is not None:
            src = source
        commit = f"c{len(self.sources)}"
        self.sources[commit] = src
        desc = ", ".join(f"{k} -> {v}" for k, v in changes.items()) or "code change"
        row = self._row(status=status, val_bpb=val if status == "ok" else None, verdict=verdict,
                        commit_sha=commit, parent_commit=self.best_commit, description=desc)
        if verdict == "keep":
            self.best_commit, self.best_val = commit, val
        return row

    def history(self) -> History:
        return history_from_rows(self.rows, self.sources.__getitem__, 0.0005, self.best_commit)

    @property
    def best_source(self) -> str:
        return self.sources[self.best_commit]


# -- train.py's constants -----------------------------------------------------------

def test_constants_are_parsed_and_categorised():
    names = [c.name for c in tunable_constants(TRAIN)]
    assert {"LR", "DEPTH", "D_MODEL", "N_HEAD", "BATCH_SIZE", "WEIGHT_DECAY", "WARMUP_STEPS", "QK_NORM"} <= set(names)
    # operational constants are not tunable, but are still parsed
    assert {"PRINT_EVERY_S", "MAX_STEPS", "QUICK_EVAL_TOKENS", "COMPILE_ON_CUDA"} & set(names) == set()
    assert "PRINT_EVERY_S" in [c.name for c in all_constants(TRAIN)]
    assert category_of("LR") == category_of("EMBED_LR") == category_of("BETA2") == "optimizer"
    assert category_of("WARMDOWN_FRAC") == category_of("MIN_LR") == "schedule"
    assert category_of("WEIGHT_DECAY") == category_of("GRAD_CLIP") == "regularisation"
    assert category_of("D_MODEL") == category_of("N_HEAD") == category_of("QK_NORM") == "architecture"
    assert category_of("BATCH_SIZE") == category_of("GRAD_ACCUM_STEPS") == "batch"
    # whole words only: EPS is not STEPS, LOG is not LOGIT
    assert category_of("WARMUP_STEPS") == "schedule" and DENY_RE.search("LOGIT_SOFTCAP") is None
    assert DENY_RE.search("LOG_EVERY") and DENY_RE.search("SEED")


def test_parser_handles_negative_annotated_and_ignores_the_rest():
    src = "import os\nA: float = -0.5  # note\nB = 3\nc = 4\nD = 'x'\nE = 1 + 2\nif True:\n    F = 9\nG = True\n"
    vals = constant_values(src)
    assert vals == {"A": -0.5, "B": 3, "G": True}
    assert skeleton(src) == skeleton(src.replace("-0.5", "-0.7").replace("# note", "# other"))
    assert skeleton(src) != skeleton(src.replace("c = 4", "c = 5"))   # lower-case names are code


# -- tabu -----------------------------------------------------------------------

def test_tabu_exact_repeat():
    s = Synthetic()
    t = s.trial({"LR": 0.008})
    adv = Tabu().advise(s.history(), s.sources[t["commit_sha"]])
    assert adv.details["status"] == "exact_repeat" and adv.details["of_experiment"] == t["id"]
    assert f"#{t['id']}" in adv.warnings[0] and "refuse" in adv.warnings[0]


def test_tabu_near_repeat_of_constants_and_of_comments():
    s = Synthetic()
    t = s.trial({"LR": 0.008})
    near = edit_constant(TRAIN, "LR", 0.0082)
    adv = Tabu().advise(s.history(), near)
    assert adv.details["status"] == "near_repeat" and adv.details["of_experiment"] == t["id"]
    assert "LR 0.0082 vs 0.008" in adv.warnings[0]
    far = edit_constant(TRAIN, "LR", 0.012)
    assert Tabu().advise(s.history(), far).details["status"] == "new"
    # the same version with only a comment changed is a near repeat too
    commented = s.sources[t["commit_sha"]].replace("# residual width", "# the residual width")
    adv = Tabu().advise(s.history(), commented)
    assert adv.details["status"] == "near_repeat" and "comments or layout" in adv.warnings[0]
    # a real code change with the same constants is new
    code = s.sources[t["commit_sha"]].replace("return x + self.out(", "return x + 0.5 * self.out(")
    assert Tabu().advise(s.history(), code).details["status"] == "new"


def test_tabu_tolerance_and_best_version():
    s = Synthetic()
    s.trial({"BATCH_SIZE": 32})
    assert Tabu(rel_tol=0.1).advise(s.history(), edit_constant(TRAIN, "BATCH_SIZE", 30)).details["status"] == "near_repeat"
    assert Tabu(rel_tol=0.01).advise(s.history(), edit_constant(TRAIN, "BATCH_SIZE", 30)).details["status"] == "new"
    # nearly the best version itself: a change too small to clear the noise
    adv = Tabu().advise(s.history(), edit_constant(TRAIN, "LR", 0.0041))
    assert adv.details["status"] == "near_repeat" and adv.details["of_experiment"] is None
    assert Tabu().advise(s.history(), TRAIN).details["status"] == "unchanged"


# -- history ------------------------------------------------------------------------

def test_history_gains_confirms_crashes_and_interrupted():
    s = Synthetic(baseline=(2.00, 2.02))            # mean 2.01
    a = s.trial({"LR": 0.008}, verdict="keep", val=1.95)
    s._row(confirm_of=a["id"], status="ok", val_bpb=1.97, verdict="keep", commit_sha=a["commit_sha"])
    s.best_val = 1.96
    b = s.trial({"DEPTH": 6}, verdict="discard", val=1.99)
    c = s.trial({"D_MODEL": 4096}, verdict="discard", status="timeout")
    s._row(status="interrupted", commit_sha=None, description="killed")
    h = s.history()
    assert [t.id for t in h.trials] == [a["id"], b["id"], c["id"]]
    ta, tb, tc = h.trials
    assert ta.val_bpb == pytest.approx(1.96) and ta.gain == pytest.approx(2.01 - 1.96)   # confirm averaged in
    assert tb.gain == pytest.approx(1.96 - 1.99)     # against the best at that time, not the baseline
    assert ta.changed == ("LR",) and ta.category == "optimizer" and tb.category == "architecture"
    assert tc.failed and tc.val_bpb is None and tc.gain is None
    assert h.baseline_mean == pytest.approx(2.01) and h.sigma == pytest.approx(0.0141421, rel=1e-4)
    assert h.experiments_since_keep == 2


# -- plateau ------------------------------------------------------------------------

def test_plateau_triggers_after_k_and_points_elsewhere():
    s = Synthetic()
    for v in (0.008, 0.002):
        s.trial({"LR": v})
    assert Plateau(k=3).advise(s.history(), s.best_source).category is None   # 2 < k
    s.trial({"EMBED_LR": 0.02})
    adv = Plateau(k=3).advise(s.history(), s.best_source)
    assert adv.details["plateau"] is True and adv.priority > Bandit.priority
    assert adv.category not in ("optimizer", None)
    names = {c.name: c for c in tunable_constants(s.best_source)}
    assert adv.parameters and all(names[p].category == adv.category for p in adv.parameters)


def test_plateau_prefers_the_least_recently_touched_category_and_constant():
    s = Synthetic()
    s.trial({"DEPTH": 5})                  # architecture, long ago
    for ch in ({"LR": 0.008}, {"BATCH_SIZE": 32}, {"WARMUP_STEPS": 20}, {"WEIGHT_DECAY": 0.1}):
        s.trial(ch)
    adv = Plateau(k=4).advise(s.history(), s.best_source)
    assert adv.category == "architecture"   # the only category the last 4 did not touch
    assert adv.parameters[-1] == "DEPTH"    # constants never touched come first
    # a keep resets the count
    s.trial({"GRAD_CLIP": 2.0}, verdict="keep", val=1.9)
    assert Plateau(k=4).advise(s.history(), s.best_source).details["plateau"] is False


def test_plateau_rejects_bad_k():
    with pytest.raises(ValueError):
        Plateau(k=0)


# -- bandit -------------------------------------------------------------------------

def test_bandit_tries_every_arm_first_in_a_fixed_order():
    s = Synthetic()
    first = Bandit().advise(s.history(), s.best_source)
    assert first.category == "schedule" and "not been tried" in first.reason
    s.trial({"WARMUP_STEPS": 20})
    assert Bandit().advise(s.history(), s.best_source).category == "regularisation"


def test_bandit_shifts_to_the_rewarding_category():
    s = Synthetic()
    # every category once, architecture is the one that pays at first
    for ch in ({"WARMUP_STEPS": 20}, {"GRAD_CLIP": 2.0}, {"BATCH_SIZE": 32}, {"LR": 0.008}):
        s.trial(ch, verdict="discard", val=2.05)
    s.trial({"DEPTH": 5}, verdict="keep", val=1.95)
    assert Bandit().advise(s.history(), s.best_source).category == "architecture"
    # then architecture stops paying and the optimizer starts to
    val = 1.95
    for i in range(6):
        s.trial({"D_MODEL": 64 if i % 2 else 256, "N_HEAD": 2 if i % 3 else 8}, verdict="discard", val=2.1)
        val -= 0.02
        s.trial({"EMBED_LR": round(0.01 * (1.1 + i), 4)}, verdict="keep", val=val)
    adv = Bandit().advise(s.history(), s.best_source)
    assert adv.category == "optimizer"
    arms = {a["category"]: a for a in adv.details["arms"]}
    assert arms["optimizer"]["mean_reward"] > arms["architecture"]["mean_reward"]
    assert adv.parameters[0] != "EMBED_LR"   # inside the category, the least tried constant first


def test_bandit_rewards():
    s = Synthetic(baseline=(2.0, 2.0))   # sigma = floor 0.0005
    s.trial({"LR": 0.008}, verdict="keep", val=1.9)
    s.trial({"LR": 0.016}, verdict="discard", val=1.8995)        # gain 0.0005 = sigma
    s.trial({"LR": 0.032}, verdict="discard", val=1.95)          # a loss
    s.trial({"DEPTH": 40}, verdict="discard", status="crash")
    h = s.history()
    assert [reward(t, h.sigma) for t in h.trials] == [1.0, pytest.approx(0.25), 0.0, 0.0]


def test_mechanisms_are_deterministic_and_combine_by_priority():
    s = Synthetic()
    for v in (0.008, 0.002, 0.006, 0.003):
        s.trial({"LR": v})
    h = s.history()
    a1, a2 = advise(h, s.best_source), advise(h, s.best_source)
    assert a1 == a2
    assert a1.mechanism == "plateau" and a1.category != "optimizer"   # plateau outranks the bandit
    merged = combine([Advice("x", "batch", ("B",), 1, ("w1",)), Advice("y", None, (), 5, ("w2",)),
                      Advice("z", "schedule", ("S",), 2)])
    assert merged.category == "schedule" and merged.warnings == ("w1", "w2")


# -- on a live workspace: the tool and the engine hook -------------------------------

def _fake_discarded(eng, name: str, value: str) -> int:
    """A candidate as the engine records it: committed, measured, discarded, tree back at best."""
    from mcp_server.loop import gitops

    set_constant(eng.ws.root / "train.py", name, value)
    c = eng.campaign
    sha, _ = gitops.commit_editable(eng.ws.root, ["train.py"], ".loopwright", f"{name} -> {value}")
    e = eng.ledger.start_experiment(c["id"], f"{name} -> {value}", commit_sha=sha, parent_commit=c["best_commit"])
    eng.ledger.update_experiment(e, status="ok", val_bpb=2.1, verdict="discard", finished_at=time.time())
    gitops.reset_to(eng.ws.root, c["best_commit"])
    return e


def _bench(tmp_path: Path) -> Path:
    """The benchmark folder with TRAIN as its train.py (the constants the assertions name)."""
    import shutil

    d = tmp_path / "bench"
    d.mkdir()
    for name in (*FROZEN_PY, "program.md"):
        shutil.copyfile(BENCH / name, d / name)
    (d / "train.py").write_text(TRAIN)
    return d


async def test_suggest_next_tool_and_near_repeat_hook(tmp_path: Path, small_corpus):
    from mcp import Client

    from mcp_server.loop.engine import Engine
    from mcp_server.mcp.server import build_server

    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=_bench(tmp_path))
    eng = Engine(ws.root)
    record_baseline(eng)
    tried = _fake_discarded(eng, "LR", "0.008")
    async with Client(build_server(ws.root)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert tools["suggest_next"].annotations.read_only_hint is True
        assert tools["suggest_next"].output_schema is not None
        res = await client.call_tool("suggest_next", {})
        assert not res.is_error, res.content
        sug = res.structured_content
        assert sug["tabu_status"] == "unchanged" and sug["constants"]["LR"] == 0.004
        assert sug["category"] == "schedule" and sug["decided_by"] == "bandit"   # optimizer was tried
        arms = {a["category"]: a for a in sug["arms"]}
        assert arms["optimizer"]["pulls"] == 1 and arms["schedule"]["ucb"] is None
        set_constant(ws.root / "train.py", "LR", "0.0079")
        sug = (await client.call_tool("suggest_next", {})).structured_content
        assert sug["tabu_status"] == "near_repeat" and sug["repeat_of"] == tried
        (ws.root / "train.py").write_text("def broken(:\n")
        sug = (await client.call_tool("suggest_next", {})).structured_content
        assert "does not parse" in sug["warnings"][0] and sug["category"]   # still advises, from the best version
    # the hook run_experiment uses: a near repeat gets a warning, a new change none
    (ws.root / "train.py").write_text(edit_constant(TRAIN, "LR", 0.0079))
    warnings = near_repeat_warnings(eng)
    assert len(warnings) == 1 and f"#{tried}" in warnings[0]
    (ws.root / "train.py").write_text(edit_constant(TRAIN, "LR", 0.02))
    assert near_repeat_warnings(eng) == []
    eng.close()


def test_parsed_versions_are_cached_on_disk(tmp_path: Path, small_corpus):
    """A new server process reads the parsed versions back instead of parsing them again."""
    import json

    from mcp_server.loop.engine import Engine
    from mcp_server.mechanisms import history_from_engine, source

    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=_bench(tmp_path))
    with Engine(ws.root) as eng:
        record_baseline(eng)
        _fake_discarded(eng, "LR", "0.008")
        _fake_discarded(eng, "DEPTH", "6")
        fresh = history_from_engine(eng)
        cache = json.loads((ws.state_dir / "cache" / "mechanisms.json").read_text())
        assert len(cache) == 3            # the pinned version and the two candidates
        source._CACHE.clear()
        calls = []
        real = source._analyse
        source._analyse = lambda src: calls.append(src) or real(src)
        try:
            again = history_from_engine(eng)
        finally:
            source._analyse = real
        assert calls == []                 # nothing parsed: everything came from the disk cache
        assert [(t.id, t.changed, t.category) for t in again.trials] == \
            [(t.id, t.changed, t.category) for t in fresh.trials]
        assert again.trials[0].changed == ("LR",) and again.trials[1].category == "architecture"
        (ws.state_dir / "cache" / "mechanisms.json").write_text("{not json")   # a damaged cache is ignored
        assert [t.id for t in history_from_engine(eng).trials] == [t.id for t in fresh.trials]


def test_a_mechanism_answer_is_bounded_and_not_echoed_back_verbatim():
    """Red team B1: `mechanism_propose` handed the proposer its advice samples verbatim, and `parameters` had
    no size cap: a mechanism that read anything could return it that way. Names must be identifiers of a few
    dozen characters, the whole answer a few KB; the proposer sees only the constants of train.py among
    the names and the length of the note."""
    from mcp_server.mechanisms import validate
    from mcp_server.mechanisms.base import MAX_ADVICE_BYTES, check_advice

    source = (BENCH / "train.py").read_text()
    blob = "A" * 5000
    for bad in ({"parameters": [blob]}, {"parameters": ["not a name!"]}, {"note": blob},
                {"parameters": [f"N{i}" for i in range(200)]}, {"avoid": ["x" * 65]}):
        with pytest.raises(ValueError):
            check_advice(bad)
    with pytest.raises(ValueError, match=str(MAX_ADVICE_BYTES)):
        check_advice({"parameters": [f"{'C' * 60}{i:03d}" for i in range(64)]})
    smuggle = ("SECRET_" + "ab12" * 10)          # a well-formed name that is no constant of train.py
    code = ("def advise(history, source):\n"
            f"    return {{'category': 'optimizer', 'parameters': ['LR', {smuggle!r}], 'note': 'val text here'}}\n")
    v = validate.validate("echo", code, source)
    assert v.ok, v.reason
    assert v.samples and smuggle not in repr(v.samples) and "val text" not in repr(v.samples), v.samples
    assert all(s["parameters"] == ["LR"] and s["parameters_not_constants"] == 1 for label, s in v.samples.items()
               if label != "no-constants"), v.samples
