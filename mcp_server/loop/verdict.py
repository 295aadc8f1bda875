"""Noise-aware keep / discard / retest on paired (common-random-numbers) runs.

The rule (docs/statistics.md):

* The runner, not train.py, picks seeds. A campaign has a current *seed set* of
  n = `[noise] baseline_seeds` seeds. The reference (the best version) has a run
  on each of them; a candidate runs on the SAME seeds, and the verdict is on the
  paired differences d_i = candidate_i - reference_i (lower is better). The seed
  (init + data order) dominates run-to-run noise and cancels in d_i.
* sigma_d, the SD of a paired difference, is pooled from the campaign's own
  comparisons (deviations of each comparison's d_i around its own mean, so real
  effects do not inflate it), shrunk towards a prior `sigma_prior` worth
  `prior_pairs` pseudo degrees of freedom, never below `sigma_floor`; comparisons
  with a large mean effect are left out (their spread is the effect's own
  dependence on the seed, see pooled_sigma). The
  baseline's seed spread is NOT used: it measures seed noise, which pairing removes.
* Keep iff mean(d) <= -max(min_delta, k * sigma_d / sqrt(n)). A gain within
  `retest_band` of that bar gets `retest`: one more pair on a fresh seed (both the
  candidate and the reference run on it), up to `max_confirms` times.
* Sequential: after the first pair, a candidate with d_1 > k * sigma_d (clearly
  worse) is discarded without running the rest of the seed set.
* Every `rotate_every` candidates the campaign moves to a fresh seed set and the
  best is re-measured on it (reference runs, counted as runs), so no keep is
  tuned to a few seeds. A seed-only change can never be kept.
* MDE: the true gain that is kept with 80 % probability at the current sigma_d and
  n pairs, bar + 0.84 * sigma_d / sqrt(n).

With `[noise] pairs = "adaptive"` the keep/discard/retest rule above is replaced by the sequential test
of mcp_server/loop/sequential.py (retest there means: one more pair, up to `max_pairs`); `decide`,
`enough_pairs` and `achieved_mde` are the one entry point both executors' paths use for either rule.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Literal, Optional, Sequence

from mcp_server.loop import sequential
from mcp_server.loop.config import NoiseConfig

VerdictKind = Literal["keep", "discard", "retest"]
Z_POWER = 0.8416   # one-sided normal quantile for 80 % power


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    gain: float          # -mean(d): positive = the candidate is better (metric is lower-is-better)
    threshold: float     # gain needed for a keep with this many pairs
    reason: str
    early_stop: bool = False


def pooled_sigma(groups: Sequence[Sequence[float]], noise: NoiseConfig) -> tuple[float, int]:
    """(sigma_d, degrees of freedom from data) from groups of paired differences, one group per comparison.

    Each group contributes its squared deviations around its own mean (n-1 dof); the prior adds
    `prior_pairs` pseudo-dof at `sigma_prior`; the result is never below `sigma_floor`.

    Groups whose mean is beyond `large_effect_sigmas` * sigma_d are left out: a change that moves
    val_bpb by 0.3 moves it by 0.4 on one seed and 0.2 on another, and that spread is the effect's
    dependence on the seed, not measurement noise (one such comparison used to triple the bar for every
    small change after it). Selecting groups by their MEAN does not bias the pooled variance (for normal
    pairs a sample's mean and its deviations are independent), and a null change's mean is never 5 sigma
    out, so noise alone is never left out. The cut-off and sigma_d are found together: start from the
    prior, recompute until the included set stops changing."""
    gs = [[float(x) for x in g] for g in groups if len(g) >= 2]
    sigma = max(noise.sigma_prior, noise.sigma_floor)
    included: Optional[list[list[float]]] = None
    df = 0
    for _ in range(20):
        cut = noise.large_effect_sigmas * sigma
        now = [g for g in gs if not noise.large_effect_sigmas or abs(statistics.fmean(g)) <= cut]
        if not now and gs and noise.prior_pairs <= 0:
            now = gs   # no prior to fall back on: use everything rather than nothing
        if now == included:
            break
        included = now
        sigma, df = _pool(now, noise)
    return sigma, df


def _pool(groups: Sequence[Sequence[float]], noise: NoiseConfig) -> tuple[float, int]:
    ss, df = 0.0, 0
    for g in groups:
        m = statistics.fmean(g)
        ss += sum((x - m) ** 2 for x in g)
        df += len(g) - 1
    prior_df = noise.prior_pairs
    if prior_df + df <= 0:
        return noise.sigma_floor, 0
    var = (prior_df * noise.sigma_prior ** 2 + ss) / (prior_df + df)
    return max(noise.sigma_floor, math.sqrt(var)), df


def bar(sigma_d: float, noise: NoiseConfig, n_pairs: int) -> float:
    """The mean paired gain needed for a keep with n pairs."""
    return max(noise.min_delta, noise.k_sigma * sigma_d / math.sqrt(max(1, n_pairs)))


def mde(sigma_d: float, noise: NoiseConfig, n_pairs: int) -> float:
    """Minimum detectable effect: the true gain kept with 80 % probability with n pairs."""
    return bar(sigma_d, noise, n_pairs) + Z_POWER * sigma_d / math.sqrt(max(1, n_pairs))


def achieved_mde(sigma_d: float, noise: NoiseConfig) -> float:
    """The MDE the campaign achieves with its pairs rule: fixed, one seed set (baseline_seeds pairs);
    adaptive, the gain the sequential test keeps >= 80 % of the time (sequential.achieved_mde)."""
    if noise.pairs == "adaptive":
        return sequential.achieved_mde(sigma_d, noise)
    return mde(sigma_d, noise, noise.baseline_seeds)


def keep_bar(sigma_d: float, noise: NoiseConfig, n_pairs: int) -> float:
    """The mean paired gain that keeps with n pairs under the campaign's pairs rule (fixed: `bar`)."""
    if noise.pairs == "adaptive":
        return sequential.keep_bound(sigma_d, noise, n_pairs)
    return bar(sigma_d, noise, n_pairs)


def enough_pairs(diffs: Sequence[float], sigma_d: float, noise: NoiseConfig, n_planned: int) -> bool:
    """Whether the seed set's remaining pairs can be skipped: the verdict is already clear after these pairs.
    Fixed pairs: only the first-pair early stop (clearly worse); adaptive: the sequential test decided."""
    if not diffs:
        return False
    if noise.pairs == "adaptive":
        return sequential.step(diffs, sigma_d, noise)[0] != "more"
    return (noise.early_stop and len(diffs) == 1 and n_planned > 1
            and clearly_worse(diffs[0], sigma_d, noise))


def clearly_worse(first_diff: float, sigma_d: float, noise: NoiseConfig) -> bool:
    """Sequential early stop after the first pair: worse by more than k single-pair sigmas."""
    return first_diff > noise.k_sigma * sigma_d


def decide(diffs: Sequence[float], sigma_d: float, noise: NoiseConfig, n_planned: int,
           n_confirms: int = 0) -> Verdict:
    """Verdict from paired differences d_i = candidate_i - reference_i (seed-matched).

    n_planned: pairs in the seed set; fewer pairs than that only happens after an early stop.
    n_confirms: fresh-seed confirm pairs already run (retests)."""
    if not diffs:
        raise ValueError("a paired verdict needs at least one (candidate, reference) pair")
    n = len(diffs)
    gain = -statistics.fmean(diffs)
    if noise.pairs == "adaptive":
        kind, why = sequential.step(diffs, sigma_d, noise)
        b = sequential.keep_bound(sigma_d, noise, n)
        if kind == "more":
            return Verdict("retest", gain, b, f"{why}; one more pair on a fresh seed (candidate and reference) "
                                              "with run_experiment(confirm_of=ID)")
        return Verdict(kind, gain, b, why, early_stop=n < n_planned)
    b = bar(sigma_d, noise, n)
    tag = f"{n} pair(s), sigma_d {sigma_d:.5f}"
    if n < n_planned and n == 1 and clearly_worse(diffs[0], sigma_d, noise):
        return Verdict("discard", gain, b, f"clearly worse on the first pair (d = {diffs[0]:+.5f} > "
                                           f"{noise.k_sigma:g} sigma_d = {noise.k_sigma * sigma_d:.5f}); stopped "
                                           "early", early_stop=True)
    if gain >= b:
        own = sequential.spread_bound(diffs, noise)
        if sequential.spread_ok(diffs, noise):
            return Verdict("keep", gain, b, f"paired gain {gain:.5f} >= bar {b:.5f} ({tag})")
        spread = f"paired gain {gain:.5f} >= bar {b:.5f} but below its own pairs' spread bound {own:.5f} ({tag})"
        if n_confirms < noise.max_confirms + 1:   # one confirm more than near the bar: see spread_bound
            return Verdict("retest", gain, b, f"{spread}; one more pair on a fresh seed (candidate and reference) "
                                              "with run_experiment(confirm_of=ID)")
        return Verdict("discard", gain, b, spread)
    if gain > 0 and gain >= (1.0 - noise.retest_band) * b and n_confirms < noise.max_confirms:
        return Verdict("retest", gain, b, f"paired gain {gain:.5f} is near the bar {b:.5f} ({tag}); confirm on "
                                          "a fresh seed (candidate and reference) with run_experiment(confirm_of=ID)")
    if gain > 0:
        why = f"paired gain {gain:.5f} is below the bar {b:.5f} ({tag})"
    else:
        why = f"no paired gain: mean difference {-gain:+.5f} ({tag})"
    return Verdict("discard", gain, b, why)


def paired_interval(diffs: Sequence[float], sigma_d: float, z: float = 1.96) -> tuple[float, float]:
    """Interval for the mean gain (-mean d), using the pooled sigma_d (not the few pairs' own SD)."""
    g = -statistics.fmean(diffs)
    half = z * sigma_d / math.sqrt(len(diffs))
    return g - half, g + half


# Lines that only choose a random seed; a change confined to them can never be kept.
_SEED_LINE = re.compile(r"(seed|SEED|manual_seed|random\.seed|np\.random\.seed|default_rng|Generator\(\))")


def _strip(src: str) -> list[str]:
    out = []
    for line in src.splitlines():
        code = line.split("#", 1)[0].rstrip()
        if code.strip() and not _SEED_LINE.search(code):
            out.append(code)
    return out


def seed_only_change(old_src: str, new_src: str) -> bool:
    """True when two train.py versions differ only in seed-related lines (or comments/blank lines)."""
    return old_src != new_src and _strip(old_src) == _strip(new_src)


def _code_tokens(src: str) -> Optional[list[tuple[int, str]]]:
    """The source's tokens without comments, blank lines or layout; None if it does not tokenize."""
    import io
    import tokenize

    skip = (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING)
    try:
        return [(t.type, "" if t.type in (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE) else t.string)
                for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type not in skip]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None


def comments_only_change(old_src: str, new_src: str) -> bool:
    """True when two train.py versions differ only in comments, blank lines or whitespace: the same code,
    so the same result (a run would measure seed noise)."""
    if old_src == new_src:
        return False
    old, new = _code_tokens(old_src), _code_tokens(new_src)
    return old is not None and old == new
