"""The spike detector's and the eval gate's thresholds, pinned exactly: a value at the threshold,
one ulp on either side, the warm-up length and the window. Histories are chosen so that the mean
and the standard deviation are exact in binary floating point ([2, 4, 6]: mean 4, sample std 2),
which makes "exactly at the threshold" an exact statement rather than a tolerance."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.runtime.stage import eval_gate as gates
from ito_assets.runtime.stage import battery as stage_eval
from ito_assets.runtime.stage.eval_gate import Direction, GatedMetric, EvalGatePolicy, EvalGateVerdict, MetricCheck, VerdictStore, judge_stage
from ito_assets.runtime.stage.noise import Units
from ito_assets.runtime.supervision.spikes import RollingDetector, Spike, SpikeConfig, SpikeDetector

up = lambda x: math.nextafter(x, math.inf)  # noqa: E731 - one ulp above
down = lambda x: math.nextafter(x, -math.inf)  # noqa: E731 - one ulp below

HISTORY = (2.0, 4.0, 6.0)  # mean 4.0, sample standard deviation 2.0, both exact


def _detector(history=HISTORY, *, window=None, min_history=None, z=2.0, ratio=1.0) -> RollingDetector:
    config = SpikeConfig(window=window or len(history), min_history=min_history or len(history),
                         z_threshold=z, min_ratio=ratio)
    detector = RollingDetector("loss", config)
    for step, value in enumerate(history):
        assert detector.observe(step, value) is None
    return detector


# --- the z threshold: value > mean + z * std ----------------------------------------------------------


@pytest.mark.parametrize(("z", "threshold"), [(2.0, 8.0), (3.0, 10.0), (0.5, 5.0)])
def test_a_value_exactly_at_mean_plus_z_std_is_not_a_spike_one_ulp_above_is(z, threshold):
    assert _detector(z=z).observe(10, threshold) is None
    assert _detector(z=z).observe(10, down(threshold)) is None
    spike = _detector(z=z).observe(10, up(threshold))
    assert spike == Spike(step=10, metric="loss", value=up(threshold), mean=4.0, std=2.0)


def test_the_statistics_are_the_mean_and_the_sample_standard_deviation():
    spike = _detector((1.0, 1.0, 1.0, 5.0), z=1.0).observe(4, 10.0)
    # mean 2, sample variance (1 + 1 + 1 + 9) / 3 = 4: std 2 (the population std would be sqrt(3))
    assert (spike.mean, spike.std) == (2.0, 2.0)
    assert _detector((1.0, 1.0, 1.0, 5.0), z=1.0).observe(4, 4.0) is None  # exactly mean + std
    assert _detector((1.0, 1.0, 1.0, 5.0), z=1.0).observe(4, up(4.0)) is not None


def test_a_value_far_below_the_mean_is_never_a_spike():
    assert _detector(z=0.5).observe(10, -100.0) is None


# --- the ratio guard: value >= min_ratio * mean ---------------------------------------------------------


def test_a_value_exactly_at_min_ratio_times_the_mean_is_a_spike_one_ulp_below_is_not():
    flat = (2.0, 2.0, 2.0)  # std 0: the z condition is only value > 2
    assert _detector(flat, ratio=1.25).observe(5, 2.5) is not None
    assert _detector(flat, ratio=1.25).observe(5, up(2.5)) is not None
    assert _detector(flat, ratio=1.25).observe(5, down(2.5)) is None


def test_both_conditions_are_needed():
    # z passes (9 > 8), ratio fails (9 < 2.5 * 4 = 10): no spike; at 10 both pass.
    assert _detector(ratio=2.5).observe(5, 9.0) is None
    assert _detector(ratio=2.5).observe(5, down(10.0)) is None
    assert _detector(ratio=2.5).observe(5, 10.0) is not None
    # ratio passes (8 >= 1.0 * 4), z fails (8 is not > 8): no spike.
    assert _detector(ratio=1.0).observe(5, 8.0) is None


def test_on_a_flat_series_the_value_must_exceed_the_mean_even_at_ratio_one():
    flat = (3.0, 3.0, 3.0)
    assert _detector(flat, ratio=1.0).observe(5, 3.0) is None  # 3 >= 1 * 3, but not > 3 + z * 0
    assert _detector(flat, ratio=1.0).observe(5, up(3.0)) is not None


# --- warm-up and window -----------------------------------------------------------------------------------


@pytest.mark.parametrize("min_history", [2, 3, 5])
def test_nothing_is_judged_before_exactly_min_history_values(min_history):
    config = SpikeConfig(window=10, min_history=min_history, z_threshold=1.0, min_ratio=1.0)
    warming = RollingDetector("loss", config)
    for step in range(min_history - 1):
        assert warming.observe(step, 1.0 + step % 2) is None
    assert warming.observe(99, 1e9) is None  # one value short: not judged (and it joins the history)
    ready = RollingDetector("loss", config)
    for step in range(min_history):
        assert ready.observe(step, 1.0 + step % 2) is None
    assert ready.observe(99, 1e9) is not None  # exactly min_history values: judged


def test_only_the_last_window_values_count():
    detector = RollingDetector("loss", SpikeConfig(window=3, min_history=3, z_threshold=2.0, min_ratio=1.0))
    for step, value in enumerate((100.0, 100.0, 100.0, 2.0, 4.0, 6.0)):
        assert detector.observe(step, value) is None
    assert detector.observe(6, 8.0) is None
    # The hundreds are out of the window: mean 4 and std 2 of (4, 6, 8) would differ.
    detector = RollingDetector("loss", SpikeConfig(window=3, min_history=3, z_threshold=2.0, min_ratio=1.0))
    for step, value in enumerate((100.0, 100.0, 100.0, 2.0, 4.0, 6.0)):
        detector.observe(step, value)
    spike = detector.observe(6, up(8.0))
    assert (spike.mean, spike.std) == (4.0, 2.0)


def test_a_window_larger_than_the_history_uses_every_value():
    detector = _detector((2.0, 4.0, 6.0), window=50, min_history=3)
    assert detector.observe(3, 8.0) is None  # 8 joins: (2, 4, 6, 8)
    spike = detector.observe(4, 100.0)
    assert spike.mean == 5.0 and spike.std == math.sqrt(20.0 / 3.0)


def test_a_flagged_value_does_not_join_the_statistics_an_ordinary_one_does():
    detector = _detector()
    assert detector.observe(3, up(8.0)) is not None
    assert detector.observe(4, up(8.0)) is not None  # still judged against (2, 4, 6)
    assert detector.observe(5, 8.0) is None  # joins: (4, 6, 8), mean 6, std 2
    spike = detector.observe(6, up(10.0))
    assert (spike.mean, spike.std) == (6.0, 2.0)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_value_is_a_spike_at_once_and_never_joins_the_history(value):
    empty = RollingDetector("grad_norm", SpikeConfig(window=3, min_history=3))
    spike = empty.observe(7, value)  # even during the warm-up
    assert spike.step == 7 and spike.metric == "grad_norm"
    assert spike.value is value or (math.isnan(value) and math.isnan(spike.value))
    assert math.isnan(spike.mean) and math.isnan(spike.std)
    detector = _detector()
    assert detector.observe(3, value) is not None
    spike = detector.observe(4, up(8.0))
    assert (spike.mean, spike.std) == (4.0, 2.0)


# --- Spike, SpikeConfig, SpikeDetector ----------------------------------------------------------------------


def test_z_score_is_the_distance_in_standard_deviations():
    assert Spike(step=0, metric="loss", value=9.0, mean=3.0, std=1.5).z_score == 4.0
    assert Spike(step=0, metric="loss", value=3.0, mean=3.0, std=1.5).z_score == 0.0
    assert Spike(step=0, metric="loss", value=9.0, mean=3.0, std=0.0).z_score == math.inf
    assert Spike(step=0, metric="loss", value=9.0, mean=3.0, std=5e-324).z_score == math.inf  # overflows


def test_the_detector_defaults_are_the_documented_ones():
    assert SpikeConfig() == SpikeConfig(window=100, z_threshold=6.0, min_ratio=1.25, min_history=20)
    config = SpikeConfig()
    assert (config.window, config.z_threshold, config.min_ratio, config.min_history) == (100, 6.0, 1.25, 20)
    assert SpikeDetector().loss.config == config and SpikeDetector().grad_norm.config == config


def test_spike_config_boundaries():
    assert SpikeConfig(window=2, min_history=2).window == 2
    with pytest.raises(ValueError, match="window must be at least 2"):
        SpikeConfig(window=1, min_history=2)
    assert SpikeConfig(z_threshold=5e-324).z_threshold == 5e-324
    for z in (0.0, -1.0):
        with pytest.raises(ValueError, match="z_threshold must be positive"):
            SpikeConfig(z_threshold=z)
    assert SpikeConfig(min_ratio=1.0).min_ratio == 1.0
    with pytest.raises(ValueError, match="min_ratio must be >= 1"):
        SpikeConfig(min_ratio=down(1.0))
    assert SpikeConfig(window=10, min_history=2).min_history == 2
    assert SpikeConfig(window=10, min_history=10).min_history == 10
    for bad in (1, 11, 0):
        with pytest.raises(ValueError, match=r"min_history must lie in \[2, window\]"):
            SpikeConfig(window=10, min_history=bad)


def _pair_detector(min_history: int = 3) -> SpikeDetector:
    return SpikeDetector(SpikeConfig(window=10, min_history=min_history, z_threshold=2.0, min_ratio=1.0))


def test_the_loss_spike_is_reported_first_when_both_spike():
    detector = _pair_detector()
    for step, value in enumerate(HISTORY):
        assert detector.observe(step, value, value) is None
    spike = detector.observe(3, 100.0, 200.0)
    assert spike.metric == "loss" and spike.value == 100.0 and spike.step == 3
    # The gradient norm's spike was judged too: it stayed out of its history.
    assert detector.observe(4, 4.0, up(8.0)).metric == "grad_norm"


def test_a_gradient_norm_spike_alone_is_reported():
    detector = _pair_detector()
    for step, value in enumerate(HISTORY):
        detector.observe(step, value, value)
    spike = detector.observe(3, 4.0, up(8.0))
    assert spike.metric == "grad_norm" and spike.step == 3 and (spike.mean, spike.std) == (4.0, 2.0)


def test_the_gradient_norm_is_observed_even_at_a_loss_spike():
    # Warm-up of three: two values, then a non-finite loss with an ordinary gradient norm, which
    # must still count towards the gradient norm's warm-up.
    detector = _pair_detector(min_history=3)
    detector.observe(0, 2.0, 2.0)
    detector.observe(1, 4.0, 4.0)
    assert detector.observe(2, math.nan, 6.0).metric == "loss"
    assert detector.observe(3, 4.0, up(8.0)).metric == "grad_norm"  # judged: three norms seen


def test_an_ordinary_step_reports_nothing():
    detector = _pair_detector()
    for step, value in enumerate(HISTORY):
        detector.observe(step, value, value)
    assert detector.observe(3, 8.0, 8.0) is None


# --- the eval gate: improvement >= bands * noise_band ------------------------------------------------------

LOWER = GatedMetric(name="heldout_loss", direction=Direction.LOWER_IS_BETTER, noise_band=0.25)
HIGHER = GatedMetric(name="correct_prob", direction=Direction.HIGHER_IS_BETTER, noise_band=0.125)
POLICY = EvalGatePolicy(metrics=(LOWER, HIGHER))  # 2 bands each way: 0.5 and 0.25


def _units(current: dict) -> dict[str, Units]:
    """One unit per metric: its pooled value is the value itself, and it has no item noise to
    measure, so each band is the policy's seed band and the thresholds below stay exact."""
    return {name: Units(loss=(value,), tokens=(1,)) for name, value in current.items()}


def _seed_only(seed_band: float) -> dict:
    return {"seed_band": seed_band, "item_band": 0.0, "method": "unpaired bootstrap", "total": seed_band}


def _first(current: dict, previous: dict, policy: EvalGatePolicy = POLICY) -> EvalGateVerdict:
    return judge_stage("pretraining", _units(current), previous, policy, previous_stage=None)


def _later(current: dict, previous: dict, policy: EvalGatePolicy = POLICY) -> EvalGateVerdict:
    return judge_stage("mid_training", _units(current), previous, policy, previous_stage="pretraining")


def test_the_default_bands_are_two():
    assert gates.MIN_IMPROVEMENT_BANDS == 2.0 and gates.MAX_REGRESSION_BANDS == 2.0
    assert (POLICY.min_improvement_bands, POLICY.max_regression_bands) == (2.0, 2.0)


def test_a_first_stage_improving_by_exactly_two_bands_passes_one_ulp_less_fails():
    untrained = {"heldout_loss": 6.0, "correct_prob": 0.25}
    exact = _first({"heldout_loss": 5.5, "correct_prob": 0.5}, untrained)
    assert exact.passed and exact.error_code is None and exact.summary() == "passed"
    assert exact.checks == (
        MetricCheck(metric="heldout_loss", value=5.5, previous=6.0, improvement=0.5, required=0.5, passed=True,
                    band=_seed_only(0.25)),
        MetricCheck(metric="correct_prob", value=0.5, previous=0.25, improvement=0.25, required=0.25, passed=True,
                    band=_seed_only(0.125)),
    )
    short_lower = _first({"heldout_loss": up(5.5), "correct_prob": 0.5}, untrained)
    assert [c.passed for c in short_lower.checks] == [False, True]
    short_higher = _first({"heldout_loss": 5.5, "correct_prob": down(0.5)}, untrained)
    assert [c.passed for c in short_higher.checks] == [True, False]
    beyond = _first({"heldout_loss": down(5.5), "correct_prob": up(0.5)}, untrained)
    assert beyond.passed


def test_a_later_stage_regressing_by_exactly_two_bands_passes_one_ulp_more_fails():
    previous = {"heldout_loss": 4.0, "correct_prob": 0.5}
    exact = _later({"heldout_loss": 4.5, "correct_prob": 0.25}, previous)
    assert exact.passed and exact.compared_with == "pretraining"
    assert [(c.improvement, c.required) for c in exact.checks] == [(-0.5, -0.5), (-0.25, -0.25)]
    worse_lower = _later({"heldout_loss": up(4.5), "correct_prob": 0.25}, previous)
    assert [c.passed for c in worse_lower.checks] == [False, True]
    assert worse_lower.error_code == ErrorCode.EVAL_GATE_FAILED.value == "EVAL_GATE_FAILED"
    assert worse_lower.summary() == "failed on heldout_loss against pretraining"
    # One ulp below 0.25 is lost when 0.5 is subtracted (the result rounds back to -0.25); two ulps
    # (2**-54) survive: the smallest step of the value that changes the improvement.
    assert _later({"heldout_loss": 4.5, "correct_prob": down(0.25)}, previous).checks[1].improvement == -0.25
    worse_higher = _later({"heldout_loss": 4.5, "correct_prob": 0.25 - 2**-54}, previous)
    assert worse_higher.checks[1].improvement == down(-0.25)
    assert [c.passed for c in worse_higher.checks] == [True, False]
    assert _later({"heldout_loss": down(4.5), "correct_prob": up(0.25)}, previous).passed


def test_a_later_stage_need_not_improve():
    previous = {"heldout_loss": 4.0, "correct_prob": 0.5}
    assert _later(previous, previous).passed
    assert not _first(previous, previous).passed  # the first stage must


def test_each_band_count_applies_to_its_own_comparison():
    policy = EvalGatePolicy(metrics=(LOWER,), min_improvement_bands=1.0, max_regression_bands=3.0)
    assert _first({"heldout_loss": 5.75}, {"heldout_loss": 6.0}, policy).passed  # 1 band = 0.25
    assert not _first({"heldout_loss": up(5.75)}, {"heldout_loss": 6.0}, policy).passed
    assert _later({"heldout_loss": 4.75}, {"heldout_loss": 4.0}, policy).passed  # 3 bands = 0.75
    assert not _later({"heldout_loss": up(4.75)}, {"heldout_loss": 4.0}, policy).passed
    (check,) = _later({"heldout_loss": 4.75}, {"heldout_loss": 4.0}, policy).checks
    assert check.required == -0.75


def test_zero_bands_mean_no_worse_at_all():
    policy = EvalGatePolicy(metrics=(HIGHER,), min_improvement_bands=0.0, max_regression_bands=0.0)
    assert _first({"correct_prob": 0.5}, {"correct_prob": 0.5}, policy).passed
    assert not _first({"correct_prob": down(0.5)}, {"correct_prob": 0.5}, policy).passed
    assert _later({"correct_prob": 0.5}, {"correct_prob": 0.5}, policy).passed
    assert not _later({"correct_prob": down(0.5)}, {"correct_prob": 0.5}, policy).passed


def test_a_nan_metric_fails_the_gate():
    verdict = _later({"heldout_loss": math.nan, "correct_prob": 0.5}, {"heldout_loss": 4.0, "correct_prob": 0.5})
    assert not verdict.passed and [c.passed for c in verdict.checks] == [False, True]


def test_the_summary_names_every_failed_metric_in_policy_order():
    verdict = _first({"heldout_loss": 6.0, "correct_prob": 0.25}, {"heldout_loss": 6.0, "correct_prob": 0.25})
    assert verdict.summary() == "failed on heldout_loss, correct_prob against initial model"
    assert verdict.compared_with == "initial model"


def test_the_verdict_as_a_dict():
    verdict = _first({"heldout_loss": 5.5, "correct_prob": 0.25}, {"heldout_loss": 6.0, "correct_prob": 0.25})
    assert verdict.to_dict() == {
        "stage": "pretraining", "compared_with": "initial model", "passed": False,
        "error_code": "EVAL_GATE_FAILED",
        "checks": [
            {"metric": "heldout_loss", "value": 5.5, "previous": 6.0, "improvement": 0.5, "required": 0.5,
             "passed": True, "band": {"seed_band": 0.25, "item_band": 0.0, "method": "unpaired bootstrap",
                                      "total": 0.25}},
            {"metric": "correct_prob", "value": 0.25, "previous": 0.25, "improvement": 0.0, "required": 0.25,
             "passed": False, "band": {"seed_band": 0.125, "item_band": 0.0, "method": "unpaired bootstrap",
                                       "total": 0.125}},
        ]}


def test_a_metric_missing_on_either_side_is_refused_and_extras_are_ignored():
    both = {"heldout_loss": 5.0, "correct_prob": 0.5}
    with pytest.raises(ValueError, match="metric correct_prob is missing"):
        _first({"heldout_loss": 5.0}, both)
    with pytest.raises(ValueError, match="metric heldout_loss is missing"):
        _first(both, {"correct_prob": 0.25})
    assert [c.metric for c in _first({**both, "other": 1.0}, {"heldout_loss": 6.0, "correct_prob": 0.25}).checks] == [
        "heldout_loss", "correct_prob"]


def test_improvement_follows_the_direction():
    assert LOWER.improvement(3.0, 4.0) == 1.0 and LOWER.improvement(4.0, 3.0) == -1.0
    assert HIGHER.improvement(3.0, 4.0) == -1.0 and HIGHER.improvement(4.0, 3.0) == 1.0
    assert GatedMetric(name="x", direction="lower", noise_band=1.0).direction is Direction.LOWER_IS_BETTER
    assert GatedMetric(name="x", direction="higher", noise_band=1.0).direction is Direction.HIGHER_IS_BETTER


def test_gated_metric_boundaries():
    assert GatedMetric(name="x", direction=Direction.LOWER_IS_BETTER, noise_band=5e-324).noise_band == 5e-324
    for band in (0.0, -0.1, math.nan):
        with pytest.raises(ValueError, match="noise_band must be positive"):
            GatedMetric(name="x", direction=Direction.LOWER_IS_BETTER, noise_band=band)
    with pytest.raises(ValueError, match="name must not be empty"):
        GatedMetric(name="", direction=Direction.LOWER_IS_BETTER, noise_band=1.0)
    with pytest.raises(ValueError):
        GatedMetric(name="x", direction="sideways", noise_band=1.0)


def test_gate_policy_boundaries():
    assert EvalGatePolicy(metrics=(LOWER,), min_improvement_bands=0.0, max_regression_bands=0.0)
    for changes in ({"min_improvement_bands": down(0.0)}, {"max_regression_bands": -1.0}):
        with pytest.raises(ValueError, match="must be >= 0"):
            EvalGatePolicy(metrics=(LOWER,), **changes)
    with pytest.raises(ValueError, match="at least one gated metric"):
        EvalGatePolicy(metrics=())
    with pytest.raises(ValueError, match="distinct names"):
        EvalGatePolicy(metrics=(LOWER, GatedMetric(name=LOWER.name, direction="higher", noise_band=1.0)))
    assert len(EvalGatePolicy(metrics=(LOWER, HIGHER)).metrics) == 2


# --- the verdict store: a failed gate stays failed -----------------------------------------------------------


def _verdict(passed: bool, stage: str = "pretraining") -> EvalGateVerdict:
    current = {"heldout_loss": 5.0 if passed else 6.0, "correct_prob": 0.5 if passed else 0.25}
    return judge_stage(stage, _units(current), {"heldout_loss": 6.0, "correct_prob": 0.25}, POLICY, previous_stage=None)


def test_a_recorded_verdict_is_one_file_per_stage(tmp_path):
    run_dir = tmp_path / "runs" / "run-1"  # neither folder exists yet
    store = VerdictStore(run_dir)
    verdict = _verdict(True)
    assert store.record(verdict) is verdict
    assert store.read("pretraining") == verdict.to_dict()
    text = (run_dir / "gate-pretraining.json").read_text()
    assert text == json.dumps(verdict.to_dict(), sort_keys=True)  # canonical bytes
    assert store.read("mid_training") is None


def test_a_passed_verdict_may_be_replaced_a_failed_one_never(tmp_path):
    store = VerdictStore(tmp_path)
    store.record(_verdict(True))
    store.record(_verdict(True))  # a re-run that passes again
    store.record(_verdict(False))  # a passed gate can still end up failed
    for retry in (_verdict(True), _verdict(False)):
        with pytest.raises(ItoError) as caught:
            store.record(retry)
        assert caught.value.code is ErrorCode.EVAL_GATE_FAILED
    assert store.read("pretraining")["passed"] is False


def test_ensure_not_failed_raises_only_for_a_failed_stage_it_is_asked_about(tmp_path):
    store = VerdictStore(tmp_path)
    store.ensure_not_failed(())
    store.ensure_not_failed(("pretraining",))  # no verdict yet
    store.record(_verdict(True, "pretraining"))
    store.record(_verdict(False, "mid_training"))
    store.ensure_not_failed(("pretraining",))
    with pytest.raises(ItoError) as caught:
        store.ensure_not_failed(("pretraining", "mid_training"))
    assert caught.value.code is ErrorCode.EVAL_GATE_FAILED
    with pytest.raises(ItoError) as caught:
        store.ensure_not_failed(("mid_training", "pretraining"))
    assert caught.value.code is ErrorCode.EVAL_GATE_FAILED


# --- the stage's held-out loss: windows at their boundary ----------------------------------------------------


class _TargetMean(nn.Module):
    """loss = mean of the target token ids: the held-out loss is then exact arithmetic."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.batches: list[tuple[int, int]] = []

    def loss(self, inputs, targets):
        self.batches.append(tuple(targets.shape))
        assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the inputs shifted by one
        return targets.double().mean()


def test_one_window_needs_sequence_length_plus_one_tokens():
    tokens = np.arange(5, dtype=np.uint16)
    model = _TargetMean()
    assert stage_eval.heldout_loss(model, tokens, sequence_length=4, num_windows=8) == 2.5  # targets 1..4
    assert model.batches == [(1, 4)]
    with pytest.raises(ValueError, match="at least one window"):
        stage_eval.heldout_loss(_TargetMean(), tokens[:4], sequence_length=4, num_windows=8)


def test_the_windows_do_not_overlap_and_are_capped_by_num_windows():
    tokens = np.arange(13, dtype=np.uint16)  # (13 - 1) // 4 = 3 windows: 0-4, 4-8, 8-12
    assert stage_eval.heldout_loss(_TargetMean(), tokens, sequence_length=4, num_windows=3) == 6.5
    assert stage_eval.heldout_loss(_TargetMean(), tokens, sequence_length=4, num_windows=99) == 6.5
    assert stage_eval.heldout_loss(_TargetMean(), tokens, sequence_length=4, num_windows=2) == 4.5
    assert stage_eval.heldout_loss(_TargetMean(), tokens[:12], sequence_length=4, num_windows=3) == 4.5


def test_windows_are_scored_one_by_one_and_every_batch_of_them_beats():
    tokens = np.arange(13, dtype=np.uint16)
    model, beats = _TargetMean(), []
    model.eval()
    units = stage_eval.heldout_units(model, tokens, sequence_length=4, num_windows=3, batch_size=2,
                                     on_batch=lambda: beats.append(1))
    assert units.pooled == 6.5 and units.loss == (10.0, 26.0, 42.0) and units.tokens == (4, 4, 4)
    assert model.batches == [(1, 4)] * 3 and len(beats) == 2  # after windows 2 and 3
    assert not model.training  # the mode it came in with


def test_the_battery_without_a_suite_is_the_heldout_loss_alone():
    battery = stage_eval.Battery(heldout=np.arange(13, dtype=np.uint16), sequence_length=4, num_windows=3)
    model = _TargetMean()
    assert stage_eval.run_battery(model, battery) == {"heldout_loss": 6.5}
    assert model.training  # put back into training mode
