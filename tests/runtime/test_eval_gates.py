"""Stage eval gates: thresholds against the previous stage in noise bands measured for the run
(the seed part and a paired bootstrap over the battery's units); a failed gate stops the run with
EVAL_GATE_FAILED and stays failed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.runtime.stage import noise
from ito_assets.runtime.stage.eval_gate import Direction, GatedMetric, EvalGatePolicy, VerdictStore, judge_stage
from ito_assets.runtime.stage.noise import Units


def _steady(values: dict[str, float], num_units: int = 4) -> dict[str, Units]:
    """Units whose every unit scores the same: no item noise, the band is the seed part alone."""
    return {name: Units(loss=(value * 10,) * num_units, tokens=(10,) * num_units) for name, value in values.items()}


def _judge(stage, current, previous, policy=None, **kwargs):
    return judge_stage(stage, _steady(current), previous, policy or POLICY, **kwargs)

POLICY = EvalGatePolicy(metrics=(
    GatedMetric(name="heldout_loss", direction=Direction.LOWER_IS_BETTER, noise_band=0.05),
    GatedMetric(name="correct_prob", direction=Direction.HIGHER_IS_BETTER, noise_band=0.01),
))


def test_the_first_stage_must_beat_the_untrained_model_beyond_noise():
    untrained = {"heldout_loss": 6.0, "correct_prob": 0.25}
    passed = _judge("pretraining", {"heldout_loss": 5.0, "correct_prob": 0.30}, untrained, POLICY, previous_stage=None)
    assert passed.passed and passed.compared_with == "initial model"
    within_noise = _judge("pretraining", {"heldout_loss": 5.95, "correct_prob": 0.30}, untrained, POLICY,
                         previous_stage=None)
    assert not within_noise.passed and within_noise.error_code == "EVAL_GATE_FAILED"
    assert within_noise.summary() == "failed on heldout_loss against initial model"


def test_a_later_stage_may_not_regress_beyond_two_noise_bands():
    previous = {"heldout_loss": 4.0, "correct_prob": 0.40}
    small = _judge("mid_training", {"heldout_loss": 4.09, "correct_prob": 0.39}, previous, POLICY,
                  previous_stage="pretraining")
    assert small.passed  # regressions of 0.09 < 0.10 and 0.01 < 0.02: noise
    large = _judge("mid_training", {"heldout_loss": 4.2, "correct_prob": 0.40}, previous, POLICY,
                  previous_stage="pretraining")
    assert not large.passed and [c.passed for c in large.checks] == [False, True]


def test_a_failed_verdict_stays_failed(tmp_path):
    store = VerdictStore(tmp_path)
    failed = _judge("pretraining", {"heldout_loss": 6.0, "correct_prob": 0.25},
                   {"heldout_loss": 6.0, "correct_prob": 0.25}, POLICY, previous_stage=None)
    store.record(failed)
    with pytest.raises(ItoError) as caught:
        store.ensure_not_failed(("pretraining",))
    assert caught.value.code is ErrorCode.EVAL_GATE_FAILED
    better = _judge("pretraining", {"heldout_loss": 1.0, "correct_prob": 0.9},
                   {"heldout_loss": 6.0, "correct_prob": 0.25}, POLICY, previous_stage=None)
    with pytest.raises(ItoError, match="stays failed"):
        store.record(better)  # a retry with better numbers cannot overwrite the failure
    assert store.read("pretraining")["passed"] is False


def test_policy_is_validated_on_construction():
    with pytest.raises(ValueError, match="noise_band"):
        GatedMetric(name="x", direction=Direction.LOWER_IS_BETTER, noise_band=0)
    with pytest.raises(ValueError, match="distinct"):
        EvalGatePolicy(metrics=POLICY.metrics + POLICY.metrics[:1])
    with pytest.raises(ValueError, match="missing"):
        _judge("pretraining", {"heldout_loss": 1.0}, {"heldout_loss": 2.0}, POLICY, previous_stage=None)


# --- the band, measured for the run ---------------------------------------------------------------

ONE = EvalGatePolicy(metrics=(GatedMetric(name="heldout_loss", direction=Direction.LOWER_IS_BETTER, noise_band=0.01),))


def _noisy(mean: float, spread: float, num_units: int = 64, seed: int = 1) -> Units:
    per_unit = mean + np.random.default_rng(seed).normal(0, spread, num_units)
    return Units(loss=tuple(float(v) * 10 for v in per_unit), tokens=(10,) * num_units)


def test_every_check_records_its_band_and_both_parts():
    current, reference = _noisy(5.0, 0.3), _noisy(5.5, 0.3, seed=2)
    verdict = judge_stage("pretraining", {"heldout_loss": current}, {"heldout_loss": reference.pooled}, ONE,
                          previous_stage=None, previous_units={"heldout_loss": reference})
    (check,) = verdict.checks
    band = check.band
    assert band["seed_band"] == 0.01 and band["item_band"] > 0.01 and band["method"] == "paired bootstrap"
    assert band["total"] == pytest.approx(math.hypot(0.01, band["item_band"]))
    assert check.required == pytest.approx(2.0 * band["total"])
    assert verdict.to_dict()["checks"][0]["band"] == band


def test_the_paired_bootstrap_is_the_spread_of_resampled_differences():
    current, reference = _noisy(5.0, 0.3, num_units=8), _noisy(5.2, 0.3, num_units=8, seed=2)
    plan = np.random.default_rng(0).integers(0, 8, size=(noise.RESAMPLES, 8))
    pooled = lambda u: (np.asarray(u.loss)[plan].sum(1) / np.asarray(u.tokens)[plan].sum(1))
    expected = float(np.std(pooled(reference) - pooled(current), ddof=1))
    assert noise.band(0.0, current, reference).item_band == pytest.approx(expected, rel=1e-12)


def test_pairing_cancels_what_both_models_find_hard():
    hard = _noisy(5.0, 1.0)  # units differ a lot from one another ...
    easier = Units(loss=tuple(v - 2.0 for v in hard.loss), tokens=hard.tokens)  # ... by the same amount for both models
    paired = noise.band(0.01, easier, hard)
    unpaired = noise.band(0.01, easier, None)
    assert paired.item_band == pytest.approx(0.0, abs=1e-9) and paired.total == pytest.approx(0.01)
    spread = math.sqrt(2) * float(np.std(np.asarray(easier.loss) / 10, ddof=1)) / math.sqrt(len(easier.loss))
    assert unpaired.method == "unpaired bootstrap" and unpaired.item_band == pytest.approx(spread, rel=0.1)


@pytest.mark.parametrize("offset,passed", [(1e-9, True), (-1e-9, False)])
def test_a_gain_exactly_at_two_measured_bands_passes_and_a_hair_less_fails(offset, passed):
    reference = _noisy(6.0, 0.3)
    probe = noise.band(0.01, _noisy(5.0, 0.3, seed=3), reference)
    # Shift the current model so its gain is two bands of the band its own units measure.
    current = _noisy(5.0, 0.3, seed=3)
    shift = (reference.pooled - current.pooled) - 2.0 * probe.total - offset
    moved = Units(loss=tuple(v + shift * t for v, t in zip(current.loss, current.tokens)), tokens=current.tokens)
    verdict = judge_stage("pretraining", {"heldout_loss": moved}, {"heldout_loss": reference.pooled}, ONE,
                          previous_stage=None, previous_units={"heldout_loss": reference})
    assert noise.band(0.01, moved, reference).total == pytest.approx(probe.total, rel=1e-9)  # a shift moves no spread
    assert verdict.passed is passed


def test_a_score_within_the_item_noise_does_not_fail_a_later_stage():
    previous = _noisy(4.0, 0.5)
    # 0.05 worse per token: past two seed bands (0.02) but inside the eval's own sampling noise,
    # since the units disagree on how much worse (noise of mean zero around the 0.05).
    jitter = np.random.default_rng(9).normal(0, 0.5, len(previous.loss))
    jitter -= jitter.mean()
    worse = Units(loss=tuple(v + 10 * (0.05 + j) for v, j in zip(previous.loss, jitter)), tokens=previous.tokens)
    verdict = judge_stage("mid_training", {"heldout_loss": worse}, {"heldout_loss": previous.pooled}, ONE,
                          previous_stage="pretraining", previous_units={"heldout_loss": previous})
    (check,) = verdict.checks
    assert check.improvement == pytest.approx(-0.05) and verdict.passed


def test_units_that_do_not_pair_are_refused():
    with pytest.raises(ValueError, match="same units"):
        noise.band(0.01, _noisy(5.0, 0.3, num_units=4), _noisy(5.0, 0.3, num_units=5))
    with pytest.raises(ValueError, match="no units"):
        noise.band(0.01, Units(loss=(), tokens=()), None)
