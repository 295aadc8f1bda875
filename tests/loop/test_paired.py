"""Paired (common-random-numbers) verdicts: the math on synthetic samples, and one real campaign.

The synthetic model of a run is val = base + seed_effect[seed] + change_effect + small noise: the seed
effect is large (as measured on the bundled benchmark) and cancels in the paired difference.
"""
from __future__ import annotations

import random
import re
import statistics

import pytest

from mcp_server.loop import verdict
from mcp_server.loop.config import NoiseConfig

from conftest import hobbled_bench, make_workspace, set_constant

NOISE = NoiseConfig(baseline_seeds=2, k_sigma=2.0, min_delta=0.002, sigma_floor=0.0005, sigma_prior=0.02,
                    prior_pairs=3, retest_band=0.5, max_confirms=2)


def _runs(seeds, effect, rng, seed_sd=0.2, pair_sd=0.01):
    # seed effect shared by every version on that seed; the pair noise is per run
    seed_effect = {s: random.Random(s).gauss(0, seed_sd) for s in seeds}
    return [3.5 + seed_effect[s] + effect + rng.gauss(0, pair_sd / 2 ** 0.5) for s in seeds]


def test_true_gain_of_0_03_is_kept_with_two_pairs_at_sigma_d_0_01():
    rng = random.Random(1)
    kept = 0
    for trial in range(200):
        seeds = [1000 + 2 * trial, 1001 + 2 * trial]
        ref, cand = _runs(seeds, 0.0, rng), _runs(seeds, -0.03, rng)
        d = [c - r for c, r in zip(cand, ref)]
        # the pooled bar alone (spread_alpha 0): two pairs seldom clear the own-spread t test, which sends
        # such a gain to a retest instead (tests/loop/test_noise_prior.py)
        kept += verdict.decide(d, 0.01, NOISE.model_copy(update={"spread_alpha": 0.0}), n_planned=2).kind == "keep"
        assert verdict.decide(d, 0.01, NOISE, n_planned=2).kind != "discard" or -sum(d) / 2 < 0.0141
    # bar = 2 * 0.01 / sqrt(2) = 0.0141; a 0.03 effect clears it almost always, despite a seed SD of 0.2
    assert kept >= 195
    # unpaired, the same runs would face the seed spread: sd of a difference of 2-run means ~0.2
    assert verdict.bar(0.2, NOISE, 2) > 0.2


def test_identical_change_shifted_to_luckier_seeds_is_not_kept():
    rng = random.Random(2)
    seeds_ref, seeds_lucky = [1, 2], [7, 8]
    ref = _runs(seeds_ref, 0.0, rng, pair_sd=0.0)
    # the same code on other seeds: an unpaired comparison would see a 'gain' from the seeds alone
    lucky = _runs(seeds_lucky, 0.0, rng, pair_sd=0.0)
    assert abs(statistics.fmean(ref) - statistics.fmean(lucky)) > 0.01
    # paired on the reference's own seeds the identical code gives d = 0 exactly
    same = _runs(seeds_ref, 0.0, rng, pair_sd=0.0)
    d = [c - r for c, r in zip(same, ref)]
    v = verdict.decide(d, 0.01, NOISE, n_planned=2)
    assert v.kind == "discard" and v.gain == pytest.approx(0.0, abs=1e-12)
    # and a seed-only source edit is refused before it runs
    old = "SEED = 0\nLR = 0.01\n"
    assert verdict.seed_only_change(old, "SEED = 7\nLR = 0.01\n")


def test_early_stop_on_a_clearly_worse_first_pair_only():
    v = verdict.decide([+0.05], 0.01, NOISE, n_planned=2)
    assert v.kind == "discard" and v.early_stop
    assert verdict.clearly_worse(0.05, 0.01, NOISE) and not verdict.clearly_worse(0.015, 0.01, NOISE)
    # a first pair that is worse, but not clearly: not an early stop (the other seeds must run)
    assert not verdict.decide([+0.015], 0.01, NOISE, n_planned=2).early_stop
    # with the whole seed set run, a bad mean is an ordinary discard
    v = verdict.decide([+0.05, +0.04], 0.01, NOISE, n_planned=2)
    assert v.kind == "discard" and not v.early_stop


def test_retest_band_and_confirm_limit():
    bar2 = verdict.bar(0.01, NOISE, 2)                      # 0.01414
    assert verdict.decide([-bar2 * 0.7] * 2, 0.01, NOISE, 2).kind == "retest"
    assert verdict.decide([-bar2 * 0.7] * 2, 0.01, NOISE, 2, n_confirms=2).kind == "discard"
    assert verdict.decide([-bar2 * 0.3] * 2, 0.01, NOISE, 2).kind == "discard"
    assert verdict.decide([-bar2 * 1.01] * 2, 0.01, NOISE, 2).kind == "keep"
    # a third pair (the confirm) lowers the bar: the same mean gain can now be kept
    bar3 = verdict.bar(0.01, NOISE, 3)
    assert bar3 < bar2
    assert verdict.decide([-bar2 * 0.9] * 3, 0.01, NOISE, 2, n_confirms=1).kind == "keep"


def test_sigma_prior_dominates_with_few_pairs_and_data_takes_over():
    s0, dof0 = verdict.pooled_sigma([], NOISE)
    assert s0 == pytest.approx(0.02) and dof0 == 0
    # one comparison of 2 pairs, d = -0.05 and -0.05: zero spread (1 dof) pulls sigma only part way down
    s1, dof1 = verdict.pooled_sigma([[-0.05, -0.05]], NOISE)
    assert dof1 == 1 and s1 == pytest.approx((3 * 0.02 ** 2 / 4) ** 0.5)
    # a real effect does not inflate sigma: deviations are taken around each comparison's own mean
    rng = random.Random(3)
    groups = [[eff + rng.gauss(0, 0.005) for _ in range(3)] for eff in (-0.01, 0.0, 0.01) * 20]
    s, dof = verdict.pooled_sigma(groups, NOISE)
    assert dof == 120 and 0.004 < s < 0.0075
    # the floor holds however consistent the pairs are
    floor = NoiseConfig(sigma_prior=0.0, prior_pairs=0, sigma_floor=0.003)
    assert verdict.pooled_sigma([[0.01, 0.01]], floor)[0] == 0.003
    # the MDE shrinks with more pairs and sits above the bar (80 % power)
    assert verdict.mde(0.01, NOISE, 4) < verdict.mde(0.01, NOISE, 2)
    assert verdict.mde(0.01, NOISE, 2) > verdict.bar(0.01, NOISE, 2)


def test_a_large_effect_that_varies_by_seed_does_not_raise_the_bar_for_small_changes():
    # measured in a demo: WARMUP_STEPS 10 -> 3 gained 0.40 on one seed and 0.12 on the other; the small
    # changes after it spread by ~0.01. Pooling the big one's spread raised the bar from 0.03 to 0.14.
    small = [[-0.0118, -0.0128], [0.0218, -0.0176], [-0.0089, -0.0164], [0.004, -0.006]]
    with_big = [[-0.399, -0.123]] + small
    s_small, dof_small = verdict.pooled_sigma(small, NOISE)
    s_all, dof_all = verdict.pooled_sigma(with_big, NOISE)
    assert (s_all, dof_all) == (s_small, dof_small) and s_all < 0.03
    # switched off, the big comparison is pooled and sigma_d more than doubles
    off = NoiseConfig(large_effect_sigmas=0)
    assert verdict.pooled_sigma(with_big, off)[0] > 2 * s_small
    assert verdict.pooled_sigma(with_big, off)[1] == dof_small + 1


def test_leaving_out_large_means_does_not_bias_sigma_for_a_noisy_benchmark():
    # pure noise ten times the prior: many comparisons' means are beyond 5 * prior at first, but the cut-off
    # grows with the estimate, so noise is never mistaken for effects and sigma_d is not underestimated
    rng = random.Random(11)
    groups = [[rng.gauss(0, 0.2), rng.gauss(0, 0.2)] for _ in range(60)]
    s, dof = verdict.pooled_sigma(groups, NOISE)
    assert dof == 60 and 0.16 < s < 0.24
    # and null comparisons among large, seed-dependent effects still give the noise, not the effects' spread
    mixed = groups + [[e + rng.gauss(0, 0.6), e + rng.gauss(0, 0.6)] for e in (-5.0, 5.0) * 5]
    assert verdict.pooled_sigma(mixed, NOISE) == (s, dof)


@pytest.mark.slow
def test_campaign_runs_candidates_on_the_references_seeds(tmp_path, small_corpus):
    from mcp_server.loop.engine import Engine

    bench = hobbled_bench(tmp_path / "bench", lr="0.0002", max_steps=12, tiny=True)
    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=bench,
                        noise={"baseline_seeds": 2, "rotate_every": 0})
    train = ws.root / "train.py"
    with Engine(ws.root) as eng:
        base = eng.run_experiment("baseline")
        c = eng.campaign
        base_rows = [r for r in eng.ledger.experiments(c["id"]) if r["is_baseline"]]
        base_seeds = sorted(r["seed"] for r in base_rows)
        assert base.baseline and base.baseline.seeds == base_seeds and len(base_seeds) == 2
        # a real improvement: the normal learning rate
        set_constant(train, "LR", "0.004")
        res = eng.run_experiment("normal learning rate")
        assert res.status == "ok" and len(res.pairs) == 2
        runs = [eng.ledger.experiment(res.experiment_id)] + eng.ledger.confirm_runs(res.experiment_id)
        assert sorted(r["seed"] for r in runs) == base_seeds          # the same seeds
        by_seed = {r["seed"]: r for r in base_rows}
        for r in runs:                                                # each paired with that seed's baseline run
            assert r["paired_with"] == by_seed[r["seed"]]["id"]
            assert r["role"] in ("candidate", "pair")
        sc = eng.score(res.experiment_id)
        assert sc.verdict == "keep", sc
        assert sc.gain == pytest.approx(-statistics.fmean(p.d for p in sc.pairs))
        # a clearly worse change stops after its first pair, paired with the kept version's run
        set_constant(train, "LR", "0.0000001")
        bad = eng.run_experiment("tiny learning rate")
        assert bad.early_stopped and len(bad.pairs) == 1 and not eng.ledger.confirm_runs(bad.experiment_id)
        row = eng.ledger.experiment(bad.experiment_id)
        assert eng.ledger.experiment(row["paired_with"])["commit_sha"] == eng.campaign["best_commit"]
        sc = eng.score(bad.experiment_id)
        assert sc.verdict == "discard" and sc.early_stop
        # the budget and the noise view speak in effect sizes
        b, nz = eng.budget(), eng.noise(eng.campaign)
        assert b.mde and b.mde == pytest.approx(nz.mde, abs=1e-6)
        # the kept LR fix is a large effect: its two pairs' spread says how it varies by seed, so sigma_d
        # leaves it out and stays at the prior (with it, the bar for every later small change would rise)
        assert nz.paired_dof == 0 and nz.sigma_paired == pytest.approx(eng.ws.cfg.noise.sigma_prior)


def _formula_runs(monkeypatch, objective):
    """train.py and the evaluator replaced by objective(constants, seed); engine, ledger and git are real."""
    from mcp_server.loop import runner
    from mcp_server.mechanisms.source import constant_values

    def train(ws, run_dir, seed, on_progress=None, **kw):
        run_dir.mkdir(parents=True, exist_ok=True)
        model = run_dir / "model.pt2"
        model.write_text(str(objective(constant_values((ws.root / "train.py").read_text()), seed)))
        return runner.TrainResult("ok", 0, "", 0.1, {"num_steps": 5.0, "training_seconds": 0.1}, "", model)

    def evaluate(ws, pinned, run_dir, model_path, **kw):
        val = float(model_path.read_text())
        return runner.EvalResult(True, "", val, val + 0.01, 0.01, {}, 0.01)

    monkeypatch.setattr(runner, "run_training", train)
    monkeypatch.setattr(runner, "run_evaluation", evaluate)


def test_replay_checks_each_keep_on_fresh_interleaved_seeds(tmp_path, small_corpus, monkeypatch):
    import math

    from mcp_server.loop.engine import Engine
    from mcp_server.loop.replay import latest, replay
    from mcp_server.report.writer import write_report

    # a big seed effect; LR 0.016 is truly better by 0.05 on every seed; WARMUP 7 (neither v1 nor v2 has it) is better only on
    # the campaign's own seeds (1001, 1002): a keep that should not hold on fresh seeds
    def objective(v, seed):
        val = 3.0 + random.Random(seed).gauss(0, 0.2) + 0.05 * abs(math.log2(v["LR"] / 0.016))
        return val - (0.05 if v["WARMUP_STEPS"] == 7 and seed in (1001, 1002) else 0.0)

    _formula_runs(monkeypatch, objective)
    ws = make_workspace(tmp_path / "ws", small_corpus, noise={"baseline_seeds": 2, "rotate_every": 0})
    train = ws.root / "train.py"
    with Engine(ws.root) as eng:
        eng.run_experiment("baseline")
        lr0 = float(re.search(r"^LR = ([0-9.e-]+)", train.read_text(), re.M).group(1))
        set_constant(train, "LR", repr(lr0 * 2))
        # the real gain, whatever the bundled LR is, as long as 2x moves it towards 0.016
        expect_lr_keep = abs(math.log2(lr0 * 2 / 0.016)) < abs(math.log2(lr0 / 0.016)) - 0.6
        v = eng.score(eng.run_experiment("LR x2").experiment_id).verdict
        assert v == ("keep" if expect_lr_keep else "discard")
        set_constant(train, "WARMUP_STEPS", "7")
        r = eng.run_experiment("WARMUP_STEPS 7")
        assert eng.score(r.experiment_id).verdict == "keep"
        used_before = eng.budget().experiments_used
        res = replay(eng, seeds=3)
        keeps = {k.description: k for k in res.keeps}
        assert res.runs == 2 * 3 * len(res.keeps) and not res.all_hold
        warm = keeps["WARMUP_STEPS 7"]
        assert warm.outcome == "does not hold" and warm.gain == pytest.approx(0.0, abs=1e-9)
        assert all(p.seed not in (1001, 1002) for p in warm.pairs)   # fresh seeds only
        if expect_lr_keep:   # a real effect holds on every fresh seed
            assert keeps["LR x2"].outcome == "holds" and keeps["LR x2"].wins == 3 and keeps["LR x2"].gain > 0.02
        # replay runs are recorded, interleaved parent/child, and are not campaign runs
        rows = eng.ledger.replay_runs(eng.campaign["id"])
        assert [r["side"] for r in rows[:4]] == ["parent", "child", "parent", "child"]
        assert eng.budget().experiments_used == used_before
        assert latest(eng.ledger, eng.campaign["id"]).keeps[-1].outcome == "does not hold"
    md = write_report(ws.root).markdown.read_text()
    assert "## Replay 1" in md and "does not hold" in md and "Not every keep holds" in md


def test_ablation_paired_statistics():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "ablation", Path(__file__).resolve().parents[2] / "bench" / "perf" / "ablation_mechanisms.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    st = ab.paired_stats([-0.01, -0.02, -0.005, -0.03, -0.01, -0.02, -0.001, -0.015])
    assert st["p_signflip"] == pytest.approx(2 / 256)        # all 8 negative: only the two all-same-sign flips
    assert st["ci"][1] < 0 < -st["ci"][0] and st["t"] < -3
    st = ab.paired_stats([0.01, -0.01, 0.02, -0.02])
    assert st["p_signflip"] == 1.0 and st["mean"] == 0.0


def test_ablation_states_its_power_and_its_t_interval_at_any_number_of_pairs():
    """The minimum detectable difference (80 % power, two-sided 5 %) is (t_0.975 + z_0.8) sd / sqrt(n); the
    interval's t comes from Student's t at n - 1 dof for every n (a table once fell back to 1.96 at 14 pairs)."""
    import importlib.util
    import math
    import statistics
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "ablation", Path(__file__).resolve().parents[2] / "bench" / "perf" / "ablation_mechanisms.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    diffs = [0.03, -0.05, 0.01, 0.08, -0.02, 0.04, -0.06, 0.02]
    st = ab.paired_stats(diffs)
    sd = statistics.stdev(diffs)
    assert st["mde"] == pytest.approx((2.3646 + 0.8416) * sd / math.sqrt(8), rel=1e-3)
    assert st["ci"][1] - st["mean"] == pytest.approx(2.3646 * sd / math.sqrt(8), rel=1e-3)
    assert "MDE " in ab.fmt_paired(st)
    # twice the spread, twice the MDE; four times the pairs, about half of it
    assert ab.paired_stats([2 * d for d in diffs])["mde"] == pytest.approx(2 * st["mde"])
    assert ab.paired_stats(diffs * 4)["mde"] < 0.6 * st["mde"]
    st14 = ab.paired_stats(diffs + diffs[:6])
    assert st14["ci"][1] - st14["mean"] == pytest.approx(2.1604 * st14["sd"] / math.sqrt(14), rel=1e-3)


def test_ablation_pairs_campaigns_by_repeat_and_formats_the_test():
    import importlib.util
    import math
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "ablation", Path(__file__).resolve().parents[2] / "bench" / "perf" / "ablation_mechanisms.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    runs = [{"arm": "a", "repeat": 1, "delta": -0.3}, {"arm": "b", "repeat": 1, "delta": -0.1},
            {"arm": "b", "repeat": 0, "delta": -0.2}, {"arm": "a", "repeat": 0, "delta": -0.25},
            {"arm": "a", "repeat": 2, "delta": None}, {"arm": "b", "repeat": 2, "delta": -0.4},   # no Δ: no pair
            {"arm": "b", "repeat": 3, "delta": -0.4}]                                            # no partner
    pairs = ab.paired_diffs(runs, "a", "b")
    assert [k for k, _ in pairs] == [0, 1]
    assert [d for _, d in pairs] == pytest.approx([-0.05, -0.2])
    assert ab.fmt_paired(ab.paired_stats([])) == "—"
    assert "no test" in ab.fmt_paired(ab.paired_stats([-0.05]))
    text = ab.fmt_paired(ab.paired_stats([d for _, d in pairs]))
    assert text.startswith("-0.1250 [") and "t = " in text and "p = 0.500" in text
    # no spread: identical pairs give t = 0 and p = 1, a constant nonzero difference an infinite t of its sign
    st = ab.paired_stats([0.0] * 8)
    assert st["t"] == 0.0 and st["p_signflip"] == 1.0 and "every pair identical" in ab.fmt_paired(st)
    assert ab.paired_stats([-0.01] * 3)["t"] == -math.inf


def test_demo_seed_picks_the_campaigns_training_seeds(tmp_path, small_corpus):
    """`loopwright demo --seed S`: the campaign's seeds start at 1001 + 1000*S, so five demos are five draws
    of the seed noise, not five replicates on seeds 1001 and 1002; fresh seed sets continue after them."""
    from mcp_server.cli.demo import demo_overrides
    from mcp_server.loop.engine import Engine

    assert demo_overrides(8)["noise"]["first_seed"] == 1001            # --seed 0: the default campaign seeds
    noise = demo_overrides(8, seed=2)["noise"]
    assert noise["first_seed"] == 3001 and demo_overrides(8, seed=-1)["noise"]["first_seed"] > 0
    ws = make_workspace(tmp_path / "ws", small_corpus, noise={"first_seed": noise["first_seed"]})
    with Engine(ws.root) as eng:
        c = eng.campaign
        assert eng.seed_set(c) == (0, [3001, 3002])
        eng.ledger.start_experiment(c["id"], "a run", seed=3002, status="ok")
        assert eng.fresh_seeds(c, 2) == [3003, 3004]
    other = make_workspace(tmp_path / "other", small_corpus)
    with Engine(other.root) as eng:
        assert eng.seed_set(eng.campaign)[1] == [1001, 1002]
