"""A GO binds money only when its gain pays for the full run: the manifest's cost per point of
improvement and the desk's minimum improvement, each at its boundary and on both sides; the gate
turns a GO that is not worth it into NOT_WORTH_IT, which reviewers may accept in writing."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from helpers import valid_manifest
from ito_assets.errors import ErrorCode
from ito_assets.manifest.schema import MAX_CENTS, Manifest
from ito_assets.training import decision_gate as decision_gate_module
from ito_assets.training.decision_gate import NOT_WORTH_IT, decision_gate, judge_decision
from ito_assets.training.layout import PlanRefused, Refusal, RefusalReason
from ito_assets.training.economics import Economics, EconomicsConfig, cost_per_point, not_worth_it
from ito_assets.training.verdict import Verdict

FULL_RUN_CENTS = 1_000_000  # 10,000 USD
DEFAULT = EconomicsConfig()


def test_cost_per_point_is_the_full_run_over_the_improvement_in_points():
    assert cost_per_point(FULL_RUN_CENTS, 0.02) == pytest.approx(500_000)  # 2 points: 5,000 USD each
    assert cost_per_point(FULL_RUN_CENTS, 0.0) is None and cost_per_point(FULL_RUN_CENTS, -0.01) is None


@pytest.mark.parametrize("threshold,worth", [(500_001, True), (500_000, True), (499_999, False)])
def test_the_manifests_cost_per_point_binds_at_its_boundary(threshold, worth):
    reasons = not_worth_it(0.02, FULL_RUN_CENTS, DEFAULT, threshold)
    assert (reasons == ()) is worth
    if not worth:
        assert reasons == ("the full run costs 5,000.00 USD per point of improvement, above the manifest's 4,999.99",)


@pytest.mark.parametrize("full, limit, improvement, worth", [
    (9_883_728, 984_770, 0.10036585192481493, False),  # exactly 6e-11 cents above: its float quotient is the limit
    (30_437_867, 936_711, 0.3249440542493896, False),
    (500_000, 100_000, 0.05, True),  # exactly at the limit
    (500_000, 100_000, math.nextafter(0.05, 0.0), False),  # 0.05 is a hair above 1/20 as a double; one ulp less is below
])
def test_the_cost_per_point_is_compared_with_the_limit_exactly(full, limit, improvement, worth):
    """In floats the quotient rounds twice: one ulp either side of the limit was decided wrongly,
    and a refusal read "9,847.70 USD per point, above the manifest's 9,847.70"."""
    reasons = not_worth_it(improvement, full, DEFAULT, limit)
    assert (reasons == ()) is worth
    if not worth and f"{cost_per_point(full, improvement) / 100:,.2f}" == f"{limit / 100:,.2f}":
        assert reasons[0].endswith("by less than a cent")


def test_without_a_threshold_any_gain_beyond_noise_is_worth_it():
    assert not_worth_it(1e-9, FULL_RUN_CENTS, DEFAULT, None) == ()


def test_a_threshold_with_nothing_gained_is_not_worth_it():
    assert not_worth_it(0.0, FULL_RUN_CENTS, DEFAULT, MAX_CENTS) == ("no improvement to pay for the full run",)


@pytest.mark.parametrize("improvement,worth", [(0.0101, True), (0.01, True), (0.0099, False)])
def test_the_desks_minimum_improvement_binds_at_its_boundary(improvement, worth):
    reasons = not_worth_it(improvement, FULL_RUN_CENTS, EconomicsConfig(min_relative_improvement=0.01), None)
    assert (reasons == ()) is worth


def _economics(*reasons: str) -> Economics:
    return Economics(decision_num_tokens=1, decision_cost_cents=1, full_run_cost_cents=FULL_RUN_CENTS,
                     decision_cost_fraction=1e-6, relative_improvement=0.02, cost_cents_per_improvement_point=500_000,
                     max_cost_cents_per_improvement_point=1, within_budget_cap=True, within_max_incremental=True,
                     worth_it=not reasons, reasons=reasons, notes=())


def _manifest(**top_level) -> Manifest:
    return Manifest.model_validate_json(json.dumps({**valid_manifest(), **top_level}))


def test_a_go_not_worth_its_cost_blocks_with_its_own_code():
    gate = decision_gate(Verdict.GO, _manifest(), _economics("too dear"))
    assert (gate.passed, gate.outcome, gate.error_code) == (False, NOT_WORTH_IT, ErrorCode.DATA_DECISION_NOT_WORTH_IT)
    assert gate.reason == "NOT_WORTH_IT (too dear): the manifest's reviewers did not accept this outcome"


def test_a_go_worth_its_cost_or_not_asked_about_it_passes():
    for economics in (_economics(), None):
        gate = decision_gate(Verdict.GO, _manifest(), economics)
        assert (gate.passed, gate.outcome, gate.accepted_by_manifest, gate.error_code) == (True, "GO", False, None)


def test_a_go_whose_full_run_could_not_be_planned_is_not_shown_worth_it(monkeypatch):
    """The booked hardware cannot plan the full run: its cost was never weighed against the gain,
    and training on another booking would skip the economics, so the GO blocks unless accepted."""
    def refused(*args, **kwargs):
        raise PlanRefused((Refusal(reason=RefusalReason.UNKNOWN_MODEL_SIZE, detail="x"),), "refused")

    monkeypatch.setattr(decision_gate_module, "plan_run", refused)
    result = SimpleNamespace(verdict=Verdict.GO)
    judged = judge_decision(result, _manifest(), hardware=None, config=EconomicsConfig())
    assert (judged.gate.passed, judged.gate.outcome, judged.gate.error_code) == (False, NOT_WORTH_IT,
                                                                                ErrorCode.DATA_DECISION_NOT_WORTH_IT)
    assert judged.economics is None and judged.plan_refusal == "UNKNOWN_MODEL_SIZE"
    assert "could not be planned on the booked hardware (UNKNOWN_MODEL_SIZE)" in judged.gate.reason
    accepted = _manifest(data_decision={"accepted_verdicts": ["NOT_WORTH_IT"], "reason": "booked elsewhere",
                                        "reviewed_by": "desk"})
    assert judge_decision(result, accepted, hardware=None, config=EconomicsConfig()).gate.passed
    for verdict, code in ((Verdict.NO_GO, ErrorCode.DATA_DECISION_NO_GO),
                          (Verdict.WITHIN_NOISE, ErrorCode.DATA_DECISION_INCONCLUSIVE)):
        assert judge_decision(SimpleNamespace(verdict=verdict), _manifest(), hardware=None,
                              config=EconomicsConfig()).gate.error_code is code


def test_reviewers_may_accept_not_worth_it_in_writing_and_only_that():
    accepted = _manifest(data_decision={"accepted_verdicts": ["NOT_WORTH_IT"], "reason": "licence", "reviewed_by": "desk"})
    gate = decision_gate(Verdict.GO, accepted, _economics("too dear"))
    assert (gate.passed, gate.accepted_by_manifest, gate.outcome) == (True, True, NOT_WORTH_IT)
    assert not decision_gate(Verdict.NO_GO, accepted, _economics()).passed  # accepting one outcome is not the others


def test_the_statistical_verdicts_keep_their_codes_whatever_the_economics():
    manifest = _manifest()
    assert decision_gate(Verdict.NO_GO, manifest, _economics("x")).error_code is ErrorCode.DATA_DECISION_NO_GO
    assert decision_gate(Verdict.WITHIN_NOISE, manifest, _economics()).error_code is ErrorCode.DATA_DECISION_INCONCLUSIVE


@pytest.mark.parametrize("value,ok", [(0, False), (1, True), (MAX_CENTS, True), (MAX_CENTS + 1, False), (1.5, False),
                                      ("100", False)])
def test_the_manifests_threshold_is_whole_positive_cents(value, ok):
    document = {"decision_economics": {"max_cost_cents_per_improvement_point": value}}
    if ok:
        assert _manifest(**document).decision_economics.max_cost_cents_per_improvement_point == value
    else:
        with pytest.raises(ValidationError):
            Manifest.model_validate_json(json.dumps({**valid_manifest(), **document}), strict=True)


def test_the_threshold_refuses_unknown_fields():
    with pytest.raises(ValidationError):
        _manifest(decision_economics={"max_cost_cents_per_improvement_point": 1, "currency": "EUR"})


def test_the_economics_are_judged_again_on_the_run_s_own_booking():
    """The decision weighs the gain against the full run's cost on the configured hardware, before
    any booking; training judges it again on the run's booking: ten times the price per GPU-hour
    puts the cost per point over the manifest's maximum."""
    from ito_assets.training.decision_config import DecisionConfig
    from ito_assets.training.run_plan import booked_hardware, plan_run

    def hardware(price: int):
        return booked_hardware(gpu_type="H100", topology="1x8-nvlink", network="ib", num_nodes=1, num_gpus=8,
                               price_per_gpu_hour_cents=price)

    result = SimpleNamespace(verdict=Verdict.GO, config=DecisionConfig(), runs=(None,) * 6, difference=0.01,
                             baseline=SimpleNamespace(mean=1.0))  # 1 % better: 1 point
    target = {"num_tokens": 2 * 10**9, "stages": [{"name": "pretraining", "num_tokens": 10**9, "sequence_length": 128},
                                                  {"name": "mid_training", "num_tokens": 10**9, "sequence_length": 128}]}
    full = plan_run(_manifest(training_target=target), hardware(250), pair_shapes=None).curriculum_cost_cents
    manifest = _manifest(training_target=target, decision_economics={"max_cost_cents_per_improvement_point": 2 * full})
    judged = judge_decision(result, manifest, hardware(250), EconomicsConfig())
    assert judged.gate.passed and judged.economics.worth_it
    assert judged.for_booking(plan_run(manifest, hardware(250), pair_shapes=None), manifest).passed
    dear = judged.for_booking(plan_run(manifest, hardware(2500), pair_shapes=None), manifest)
    assert (dear.passed, dear.error_code) == (False, ErrorCode.DATA_DECISION_NOT_WORTH_IT)
    # A decision stored before it recorded its settings keeps its gate.
    assert dataclasses.replace(judged, economics_config=None).for_booking(
        plan_run(manifest, hardware(2500), pair_shapes=None), manifest) is judged.gate
