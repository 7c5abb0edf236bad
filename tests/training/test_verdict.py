"""The data decision's paired test: an independent reference for its interval, each verdict at the
edge of its interval, and its false-decision rate under the null, simulated with a fixed seed."""

from __future__ import annotations

import math
import statistics
import sys

import numpy as np
import pytest
from scipy import stats

from ito_assets.training import verdict
from ito_assets.training.verdict import Verdict, paired_test, stein_test

# Student's t at 2 degrees of freedom has a closed-form quantile, t_p = (2p - 1) / sqrt(2p(1 - p)):
# 4.3027 at p = 0.975 and 1.0607 at p = 0.8, as printed tables give them.
def _t2(p: float) -> float:
    return (2 * p - 1) / math.sqrt(2 * p * (1 - p))


T_975_2 = _t2(0.975)


def test_the_interval_is_scipys_paired_t_interval() -> None:
    candidate, baseline = [1.00, 1.20, 0.90, 1.10], [1.30, 1.35, 1.25, 1.50]
    test = paired_test(candidate, baseline, 0.95)
    reference = stats.ttest_rel(baseline, candidate)
    interval = reference.confidence_interval(0.95)
    assert test.interval_low == pytest.approx(interval.low, rel=1e-12)
    assert test.interval_high == pytest.approx(interval.high, rel=1e-12)
    assert test.p_value == pytest.approx(reference.pvalue, rel=1e-9)
    assert test.difference == pytest.approx(0.3, rel=1e-12) and test.verdict is Verdict.GO
    assert test.to_dict()["degrees_of_freedom"] == 3 and test.to_dict()["verdict"] == "GO"


def _differences_with_mean(mean: float) -> tuple[list[float], list[float]]:
    """Three paired seeds whose differences are mean - 1, mean, mean + 1 (sd 1, se 1/sqrt 3)."""
    return [0.0, 0.0, 0.0], [mean - 1.0, mean, mean + 1.0]


@pytest.mark.parametrize(("scale", "expected"), [(1 + 1e-9, Verdict.GO), (1 - 1e-9, Verdict.WITHIN_NOISE)])
def test_go_only_when_the_whole_interval_is_above_zero(scale: float, expected: Verdict) -> None:
    edge = T_975_2 / math.sqrt(3)  # the mean at which the interval's low end is exactly zero
    test = paired_test(*_differences_with_mean(edge * scale), 0.95)
    assert test.verdict is expected
    assert test.half_width == pytest.approx(edge, rel=1e-12)


@pytest.mark.parametrize(("scale", "expected"), [(1 + 1e-9, Verdict.NO_GO), (1 - 1e-9, Verdict.WITHIN_NOISE)])
def test_no_go_only_when_the_whole_interval_is_below_zero(scale: float, expected: Verdict) -> None:
    edge = T_975_2 / math.sqrt(3)
    assert paired_test(*_differences_with_mean(-edge * scale), 0.95).verdict is expected


def test_pairing_cancels_the_seeds_shared_luck() -> None:
    # Each seed moves both arms by the same large amount: unpaired, the spread hides the gain;
    # paired, the candidate is better by 0.1 on every seed.
    luck = [0.0, 3.0, -2.0]
    candidate = [2.0 + u for u in luck]
    baseline = [2.1 + u + e for u, e in zip(luck, (0.001, -0.001, 0.0))]
    test = paired_test(candidate, baseline, 0.95)
    assert test.verdict is Verdict.GO and test.difference == pytest.approx(0.1)
    assert statistics.stdev(candidate) > 2  # what an unpaired test would have had to beat


def test_one_seed_is_inconclusive_and_states_why() -> None:
    test = paired_test([1.0], [5.0], 0.95)
    assert test.verdict is Verdict.INCONCLUSIVE and test.half_width is None and test.p_value is None
    assert "one seed" in test.explanation and test.difference == 4.0


@pytest.mark.parametrize("baseline, candidate", [([1.0, 2.0], [1.5, 2.5]), ([1.5, 2.5], [1.0, 2.0]),
                                                 ([1.0, 2.0], [1.0, 2.0])], ids=["better", "worse", "same"])
def test_identical_differences_measured_no_noise_and_are_inconclusive(baseline, candidate) -> None:
    """Every seed moved the arms apart by the same amount: no spread, so no interval to test."""
    test = paired_test(baseline, candidate, 0.95)
    assert test.verdict is Verdict.INCONCLUSIVE and "measured no noise" in test.explanation


def test_mismatched_or_empty_arms_are_refused() -> None:
    with pytest.raises(ValueError, match="one value per seed"):
        paired_test([1.0, 2.0], [1.0], 0.95)
    with pytest.raises(ValueError, match="at least one seed"):
        paired_test([], [], 0.95)


def test_the_minimum_detectable_effect_is_both_quantiles_times_the_standard_error() -> None:
    test = paired_test(*_differences_with_mean(0.5), 0.95)  # three seeds, standard error 1/sqrt(3)
    assert test.minimum_detectable_effect == pytest.approx((_t2(0.975) + _t2(0.8)) / math.sqrt(3), rel=1e-9)
    assert test.verdict is Verdict.WITHIN_NOISE and "detect about 3.0965 bits/byte with 80% power" in test.explanation


def test_a_diverged_run_is_inconclusive_never_a_crash() -> None:
    for broken in (math.nan, math.inf):
        test = paired_test([1.0, broken, 1.2], [1.5, 1.6, 1.7], 0.95)
        assert test.verdict is Verdict.INCONCLUSIVE and "not finite" in test.explanation
        assert test.interval_low is None and test.minimum_detectable_effect is None


@pytest.mark.parametrize("num_seeds", [2, 3, 5])
def test_false_decisions_between_equal_arms_stay_within_five_percent(num_seeds: int) -> None:
    # 4,000 null trials, a fixed seed: deterministic. The bound is 5% plus three binomial standard
    # errors of 4,000 trials (0.0103). Pairing cancels the shared seed effect simulated here; with
    # nothing shared, the rule the test replaced said GO or NO_GO in 18% of decisions at two seeds.
    trials = 4000
    rng = np.random.default_rng(num_seeds)
    shared = rng.normal(0, 3.0, size=(trials, num_seeds))
    candidate = shared + rng.normal(0, 1.0, size=(trials, num_seeds))
    baseline = shared + rng.normal(0, 1.0, size=(trials, num_seeds))
    verdicts = [paired_test(c.tolist(), b.tolist(), 0.95).verdict for c, b in zip(candidate, baseline)]
    false_go = sum(v is Verdict.GO for v in verdicts) / trials
    false_decisions = false_go + sum(v is Verdict.NO_GO for v in verdicts) / trials
    assert false_decisions <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)
    assert false_go <= 0.025 + 3 * math.sqrt(0.025 * 0.975 / trials)


ULP = math.ulp(1.0)


@pytest.mark.parametrize("baseline", [[1.0 + ULP] * 3, [1.01] * 3, [0.99] * 3, [1.0] * 3])
def test_seeds_that_changed_neither_arm_are_inconclusive_never_a_decision_at_p_zero(baseline) -> None:
    # Every seed gave each arm the same value: one run repeated three times. Their zero spread made
    # a one-ULP difference a GO at p = 0 (and equal arms WITHIN_NOISE): no noise was measured.
    for test in (paired_test([1.0] * 3, baseline, 0.95), stein_test([1.0] * 3, baseline, 2, 0.95)):
        assert test.verdict is Verdict.INCONCLUSIVE and test.p_value is None and test.interval_low is None
        assert "measured no noise" in test.explanation


@pytest.mark.parametrize("varied", ["candidate", "baseline"])
@pytest.mark.parametrize("ulps, tested", [(1, False), (8, False), (32, True)])
def test_one_arm_varying_by_rounding_alone_measured_no_noise(varied: str, ulps: int, tested: bool) -> None:
    # A seed that moved an arm by a few ULPs measured rounding, not seed noise: t over that spread
    # made a 0.01 difference a GO at p ~ 0. Beyond 8 epsilons of the values, it is tested as usual.
    candidate, baseline = [1.0] * 3, [1.01] * 3
    (candidate if varied == "candidate" else baseline)[2] += ulps * ULP
    for test in (paired_test(candidate, baseline, 0.95), stein_test(candidate + [1.0], baseline + [1.01], 3, 0.95)):
        assert test.verdict is (Verdict.GO if tested else Verdict.INCONCLUSIVE)
        assert tested or "to float rounding" in test.explanation


def test_differences_equal_but_for_their_decimal_rounding_are_no_spread() -> None:
    # 0.1 each, as three subtractions write it: the differences spread by 1e-16.
    test = paired_test([1.2, 1.1, 1.0], [1.3, 1.2, 1.1], 0.95)
    assert test.verdict is Verdict.INCONCLUSIVE and test.p_value is None


def test_the_rounding_floor_is_eight_epsilons_of_the_largest_value() -> None:
    floor = 8 * sys.float_info.epsilon * 3.0
    assert verdict._within_rounding(floor, [1.0, -3.0], [2.0, 0.5])
    assert not verdict._within_rounding(math.nextafter(floor, 1.0), [1.0, -3.0], [2.0, 0.5])


def test_a_stein_pilot_that_changed_neither_arm_is_inconclusive_whatever_later_seeds_did() -> None:
    test = stein_test([1.0, 1.0, 0.5], [1.2, 1.2, 1.9], 2, 0.95)
    assert test.verdict is Verdict.INCONCLUSIVE and test.num_seeds == 3
