"""A booking's `gpu_type`: a catalogue name exactly (any case), or a model name read with the
booking's topology: NVLink said, the NVLink board; otherwise the model's most constrained variant,
so that a plan which fits the name fits every machine it may mean."""

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
@pytest.mark.parametrize("topology", ["", "2x4-pcie", "1x8", "8x-nvlink-pcie", "nvlinked", "t"])
def test_a_model_name_without_nvlink_is_planned_as_its_most_constrained_variant(model: str, planned: str, topology: str) -> None:
    spec = booked_gpu(model, topology)
    assert spec.name == planned
    variants = [g for name, g in GPUS.items() if name.split("-")[0].lower() == model.lower()]
    assert len(variants) >= 1
    for other in variants:  # no variant of the model has less memory, fewer FLOPS or slower links
        assert spec.memory_bytes <= other.memory_bytes
        assert spec.peak_bf16_flops <= other.peak_bf16_flops
        assert spec.intra_node_bandwidth <= other.intra_node_bandwidth


@pytest.mark.parametrize(("model", "planned"), [("H100", "H100-SXM"), ("A100", "A100-80GB"), ("H200", "H200")])
@pytest.mark.parametrize("topology", ["1x8-nvlink", "2X8_NVLINK", "hgx sxm", "SXM"])
def test_a_model_name_on_an_nvlink_topology_is_its_nvlink_board(model: str, planned: str, topology: str) -> None:
    assert booked_gpu(model, topology).name == planned


def test_a_catalogue_name_is_itself_whatever_the_topology() -> None:
    assert booked_gpu("H100-PCIe", "1x8-nvlink").name == "H100-PCIe" and booked_gpu("H100-SXM", "2x4-pcie").name == "H100-SXM"


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

    def seconds(gpu_type: str, topology: str) -> float:
        return plan_run(manifest, booked_hardware(gpu_type=gpu_type, topology=topology, network="ib-400g", num_nodes=1,
                                                  num_gpus=8, price_per_gpu_hour_cents=100), pair_shapes=None).wall_seconds
    assert seconds("H100", "1x8") == seconds("H100-PCIe", "1x8") > seconds("H100-SXM", "1x8") == seconds("H100", "1x8-nvlink")
