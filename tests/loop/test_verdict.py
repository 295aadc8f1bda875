"""Noise-aware verdicts (mcp_server/loop/verdict.py): sigma floor, bands, confirms, min_delta, seeds."""

import pytest

from mcp_server.loop import verdict
from mcp_server.loop.config import (
    NoiseConfig,
)

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
