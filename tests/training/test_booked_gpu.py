"""A booking's `gpu_type`: a catalogue name exactly (any case), or a model name, planned as that
model's most constrained variant, so that a plan which fits the name fits every machine it may mean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ito_assets.training.hardware import GPUS, booked_gpu
from ito_assets.manifest.schema import Manifest
from ito_assets.training.run_plan import booked_hardware, plan_run

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "fixtures" / "manifests" / "fixture-small.json"


@pytest.mark.parametrize("name", sorted(GPUS))
def test_every_catalogue_name_is_itself_in_any_case(name: str) -> None:
    assert booked_gpu(name) is GPUS[name]
    assert booked_gpu(name.lower()) is GPUS[name] and booked_gpu(name.upper()) is GPUS[name]


@pytest.mark.parametrize(("model", "planned"), [("H100", "H100-PCIe"), ("h100", "H100-PCIe"), ("A100", "A100-40GB-PCIe"),
                                                ("H200", "H200"), ("L40S", "L40S")])
def test_a_model_name_is_planned_as_its_most_constrained_variant(model: str, planned: str) -> None:
    spec = booked_gpu(model)
    assert spec.name == planned
    variants = [g for name, g in GPUS.items() if name.split("-")[0].lower() == model.lower()]
    assert len(variants) >= 1
    for other in variants:  # no variant of the model has less memory, fewer FLOPS or slower links
        assert spec.memory_bytes <= other.memory_bytes
        assert spec.peak_bf16_flops <= other.peak_bf16_flops
        assert spec.intra_node_bandwidth <= other.intra_node_bandwidth


def test_the_two_h100s_differ_where_a_plan_would() -> None:
    sxm, pcie = GPUS["H100-SXM"], GPUS["H100-PCIe"]
    assert pcie.peak_bf16_flops == pytest.approx(sxm.peak_bf16_flops * 756.5 / 989.4)
    assert (sxm.has_nvlink, pcie.has_nvlink) == (True, False)


@pytest.mark.parametrize("label", ["H10", "H1000", "H100-", "H100 SXM", "A100-80", "B200", "", "h100\n"])
def test_anything_else_is_not_a_gpu_the_planner_can_price(label: str) -> None:
    with pytest.raises(ValueError, match="gpu_type"):
        booked_gpu(label)


def test_a_booking_named_by_its_model_alone_plans_no_faster_than_its_sxm_variant() -> None:
    document = json.loads(FIXTURE.read_text())
    document["model"]["size"] = "proxy-150m"
    manifest = Manifest.model_validate_json(json.dumps(document))

    def seconds(gpu_type: str) -> float:
        return plan_run(manifest, booked_hardware(gpu_type=gpu_type, network="ib-400g", num_nodes=1, num_gpus=8,
                                                  price_per_gpu_hour_cents=100)).wall_seconds
    assert seconds("H100") == seconds("H100-PCIe") > seconds("H100-SXM")
