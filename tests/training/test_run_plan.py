"""The plan of a manifest's run, its budget verdict, and the decision gate."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ito_assets.manifest.schema import Manifest
from ito_assets.errors import ErrorCode
from ito_assets.training.verdict import Verdict
from ito_assets.training.decision_gate import decision_gate
from ito_assets.training.hardware import gpu_spec, network_spec
from ito_assets.training.layout import PlanRefused
from ito_assets.training.planner import Hardware
from ito_assets.training.run_plan import plan_outcome, plan_run

MANIFESTS = Path(__file__).resolve().parents[2] / "data" / "fixtures" / "manifests"


def _manifest(name: str = "fixture-small", **changes) -> Manifest:
    document = json.loads((MANIFESTS / f"{name}.json").read_text())
    for key, value in changes.items():
        document[key] = value
    return Manifest.model_validate_json(json.dumps(document))


def _hardware(price: int = 250) -> Hardware:
    return Hardware(gpu=gpu_spec("H100-SXM"), network=network_spec("infiniband"), num_nodes=1, gpus_per_node=8,
                    price_cents_per_gpu_hour=price)


def test_fixture_manifest_plans_every_stage_within_budget():
    plan = plan_run(_manifest(), _hardware(), pair_shapes=None)
    assert [s.stage for s in plan.stages] == ["pretraining", "mid_training", "long_context"]
    assert plan.cost_cents == sum(s.plan.cost_cents for s in plan.stages) > 0
    assert plan.budget.within_cap and plan.budget.within_max_incremental
    data = plan.to_dict()
    assert data["model"]["name"] == "tiny" and data["model"]["manifest_num_parameters"] == 1_000_000
    assert data["stages"][2]["sequence_length"] == 256
    json.dumps(data, allow_nan=False)


def test_over_budget_is_visible_in_the_verdict():
    model = {"size": "llama3-8b", "num_parameters": 8_030_261_248, "revision": "r1"}
    target = {"num_tokens": 10**12, "stages": [{"name": "pretraining", "num_tokens": 10**12, "sequence_length": 8192}]}
    plan = plan_run(_manifest(model=model, training_target=target), _hardware(), pair_shapes=None)
    assert plan.cost_cents > 5_000_000
    assert not plan.budget.within_cap and not plan.budget.within_max_incremental


def test_unknown_model_size_is_refused_with_its_reason():
    manifest = _manifest(model={"size": "mystery-3b", "num_parameters": 3, "revision": "r1"})
    with pytest.raises(PlanRefused) as raised:
        plan_run(manifest, _hardware(), pair_shapes=None)
    assert raised.value.reasons == ("UNKNOWN_MODEL_SIZE",)
    outcome = plan_outcome(manifest, _hardware(), pair_shapes=None)
    assert outcome.refused and outcome.to_dict()["reasons"] == ["UNKNOWN_MODEL_SIZE"]


def test_decision_gate_passes_go_or_an_accepted_no_go():
    manifest = _manifest(data_decision=None)  # no reviewer accepted anything
    assert decision_gate(Verdict.GO, manifest).passed and decision_gate(Verdict.GO, manifest).error_code is None
    # Each verdict that blocks has its own code: a NO_GO, and the two that could not tell.
    assert decision_gate(Verdict.NO_GO, manifest).error_code is ErrorCode.DATA_DECISION_NO_GO
    assert decision_gate(Verdict.WITHIN_NOISE, manifest).error_code is ErrorCode.DATA_DECISION_INCONCLUSIVE
    assert decision_gate(Verdict.INCONCLUSIVE, manifest).error_code is ErrorCode.DATA_DECISION_INCONCLUSIVE
    accepted = SimpleNamespace(data_decision=SimpleNamespace(accepted_verdicts=("WITHIN_NOISE", "INCONCLUSIVE")))
    for verdict in (Verdict.WITHIN_NOISE, Verdict.INCONCLUSIVE):
        gate = decision_gate(verdict, accepted)
        assert gate.passed and gate.accepted_by_manifest and gate.error_code is None
    assert not decision_gate(Verdict.NO_GO, accepted).passed
