"""Stage eval gates: thresholds against the previous stage and the seed noise band; a failed gate
stops the run with EVAL_GATE_FAILED and stays failed."""

from __future__ import annotations

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.runtime.stage.eval_gate import Direction, GatedMetric, EvalGatePolicy, VerdictStore, judge_stage

POLICY = EvalGatePolicy(metrics=(
    GatedMetric(name="heldout_loss", direction=Direction.LOWER_IS_BETTER, noise_band=0.05),
    GatedMetric(name="correct_prob", direction=Direction.HIGHER_IS_BETTER, noise_band=0.01),
))


def test_the_first_stage_must_beat_the_untrained_model_beyond_noise():
    untrained = {"heldout_loss": 6.0, "correct_prob": 0.25}
    passed = judge_stage("pretraining", {"heldout_loss": 5.0, "correct_prob": 0.30}, untrained, POLICY, previous_stage=None)
    assert passed.passed and passed.compared_with == "initial model"
    within_noise = judge_stage("pretraining", {"heldout_loss": 5.95, "correct_prob": 0.30}, untrained, POLICY,
                         previous_stage=None)
    assert not within_noise.passed and within_noise.error_code == "EVAL_GATE_FAILED"
    assert within_noise.summary() == "failed on heldout_loss against initial model"


def test_a_later_stage_may_not_regress_beyond_two_noise_bands():
    previous = {"heldout_loss": 4.0, "correct_prob": 0.40}
    small = judge_stage("mid_training", {"heldout_loss": 4.09, "correct_prob": 0.39}, previous, POLICY,
                  previous_stage="pretraining")
    assert small.passed  # regressions of 0.09 < 0.10 and 0.01 < 0.02: noise
    large = judge_stage("mid_training", {"heldout_loss": 4.2, "correct_prob": 0.40}, previous, POLICY,
                  previous_stage="pretraining")
    assert not large.passed and [c.passed for c in large.checks] == [False, True]


def test_a_failed_verdict_stays_failed(tmp_path):
    store = VerdictStore(tmp_path)
    failed = judge_stage("pretraining", {"heldout_loss": 6.0, "correct_prob": 0.25},
                   {"heldout_loss": 6.0, "correct_prob": 0.25}, POLICY, previous_stage=None)
    store.record(failed)
    with pytest.raises(ItoError) as caught:
        store.ensure_not_failed(("pretraining",))
    assert caught.value.code is ErrorCode.EVAL_GATE_FAILED
    better = judge_stage("pretraining", {"heldout_loss": 1.0, "correct_prob": 0.9},
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
        judge_stage("pretraining", {"heldout_loss": 1.0}, {"heldout_loss": 2.0}, POLICY, previous_stage=None)
