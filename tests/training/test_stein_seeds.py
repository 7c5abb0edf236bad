"""Seeds chosen by the data: Stein's two-stage paired test. The pilot's spread sets the seed count
(each boundary on both sides), the test over every seed keeps the pilot's degrees of freedom, and
its false-decision rate under the null stays at 5% where "add seeds until the MDE is small enough,
then test as usual" does not (simulated with a fixed seed: the figures cannot flake)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy import stats

from ito_assets.training.decision_config import DecisionConfig
from ito_assets.manifest.schema import DecisionPower
from ito_assets.training.verdict import POWER, Verdict, paired_test, stein_seed_count, stein_test

PILOT = [0.0, 1.0, 2.0]  # differences with sd 1


def _factor(degrees: int) -> float:
    return float(stats.t.ppf(0.975, degrees) + stats.t.ppf(POWER, degrees))


@pytest.mark.parametrize("wanted", [5, 6, 7])
def test_the_count_is_the_smallest_with_the_pilots_spread_at_the_target(wanted):
    # n seeds detect (t + t_power) * s0 / sqrt(n): the target at exactly n = wanted, and a hair
    # above or below it moves the count by one.
    exact = _factor(2) / math.sqrt(wanted)
    assert stein_seed_count(PILOT, exact * (1 + 1e-9), 0.95, 64) == wanted
    assert stein_seed_count(PILOT, exact * (1 - 1e-9), 0.95, 64) == wanted + 1


def test_the_count_is_never_below_the_pilot_nor_above_the_ceiling():
    assert stein_seed_count(PILOT, 1e6, 0.95, 64) == 3
    assert stein_seed_count(PILOT, 1e-6, 0.95, 12) == 12
    assert stein_seed_count(PILOT, 1e-6, 0.95, 3) == 3


@pytest.mark.parametrize("target", [1e-100, 1e-160, 5e-324])
def test_a_target_so_small_its_count_would_overflow_asks_for_the_ceiling(target):
    """The manifest takes any positive effect: squared, the ratio overflowed (OverflowError after
    the pilot had trained)."""
    assert stein_seed_count(PILOT, target, 0.95, 12) == 12


@pytest.mark.parametrize("pilot,target,max_seeds", [([1.0], 1.0, 5), (PILOT, 0.0, 5), (PILOT, -1.0, 5), (PILOT, 1.0, 2)])
def test_a_pilot_of_one_a_target_not_above_zero_or_a_ceiling_below_the_pilot_is_refused(pilot, target, max_seeds):
    with pytest.raises(ValueError):
        stein_seed_count(pilot, target, 0.95, max_seeds)


def test_the_second_stage_uses_the_pilots_spread_and_degrees_of_freedom():
    candidate = [0.0] * 5
    baseline = PILOT + [10.0, 10.0]  # later seeds far off: they move the mean, not the spread
    test = stein_test(candidate, baseline, num_pilot=3, confidence=0.95)
    standard_error = statistics.stdev(PILOT) / math.sqrt(5)
    assert test.difference == pytest.approx(statistics.fmean(baseline))
    assert test.half_width == pytest.approx(stats.t.ppf(0.975, 2) * standard_error, rel=1e-12)
    assert (test.degrees_of_freedom, test.num_seeds, test.method) == (2, 5, "Stein two-stage paired t")
    assert test.to_dict()["degrees_of_freedom"] == 2 and test.verdict is Verdict.GO


def test_a_pilot_equal_to_all_seeds_is_the_ordinary_paired_test():
    candidate, baseline = [1.0, 1.2, 0.9, 1.1], [1.3, 1.35, 1.25, 1.5]
    stein, plain = stein_test(candidate, baseline, 4, 0.95), paired_test(candidate, baseline, 0.95)
    assert (stein.interval_low, stein.interval_high, stein.degrees_of_freedom) == pytest.approx(
        (plain.interval_low, plain.interval_high, plain.degrees_of_freedom), rel=1e-12)


def test_a_diverged_run_is_inconclusive():
    assert stein_test([0.0, 0.0, math.nan], [1.0, 2.0, 3.0], 2, 0.95).verdict is Verdict.INCONCLUSIVE


def _false_decisions(rule, trials: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    return sum(rule(rng) in (Verdict.GO, Verdict.NO_GO) for _ in range(trials)) / trials


def _stein(rng, target=1.0, max_seeds=20):
    pilot = list(rng.normal(0, 1, 3))
    total = stein_seed_count(pilot, target, 0.95, max_seeds)
    differences = pilot + list(rng.normal(0, 1, total - 3))
    return stein_test([0.0] * total, differences, 3, 0.95).verdict


def _until_small_enough(rng, target=1.0, max_seeds=20):
    differences = list(rng.normal(0, 1, 3))
    while (test := paired_test([0.0] * len(differences), differences, 0.95)).minimum_detectable_effect > target \
            and len(differences) < max_seeds:
        differences.append(rng.normal(0, 1))
    return test.verdict


def test_stein_keeps_the_false_decision_rate_where_adding_seeds_until_small_enough_does_not():
    # 4,000 null decisions each: a binomial 5% has a standard deviation of 0.34 points there.
    assert _false_decisions(_stein, 4000, seed=7) <= 0.055
    assert _false_decisions(_until_small_enough, 4000, seed=7) > 0.07


def test_the_manifests_power_turns_the_seeds_into_a_pilot():
    config = DecisionConfig(seeds=(0, 1, 2)).with_power(DecisionPower(minimum_detectable_effect=0.01, max_seeds=8))
    assert (config.target_detectable_effect, config.max_seeds) == (0.01, 8)
    assert config.extra_seeds(3) == (3, 4, 5)
    assert DecisionConfig().with_power(None) == DecisionConfig()
    with pytest.raises(ValueError, match="pilot"):
        DecisionConfig(seeds=(0,), target_detectable_effect=0.1)
    with pytest.raises(ValueError, match="max_seeds"):
        DecisionConfig(seeds=(0, 1, 2), target_detectable_effect=0.1, max_seeds=2)
