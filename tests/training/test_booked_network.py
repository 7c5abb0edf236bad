"""A booking's network label, `<kind>` or `<kind>-<speed>g`: the speed scales the fabric's
bandwidth, so a slow fabric is priced as slow; a speed that cannot be read is not plannable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import Manifest
from ito_assets.training.hardware import GB, MAX_LINK_GBIT_PER_S, NETWORKS, Network, booked_network
from ito_assets.training.run_plan import booked_hardware, plan_run

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "fixtures" / "manifests" / "fixture-small.json"


@pytest.mark.parametrize(("label", "gb_per_s"), [
    ("ib", 50), ("infiniband", 50), ("ib-400g", 50), ("IB-400G", 50), ("ib_400g", 50), ("ib-400", 50),
    ("ib-100g", 12.5), ("ib-800g", 100), ("roce-10g", 1.25), ("eth-100g", 100 / 8 / 8), ("eth-400g", 400 / 8 / 8),
])
def test_the_speed_scales_the_fabrics_bandwidth_per_gpu(label: str, gb_per_s: float) -> None:
    assert booked_network(label).bandwidth == pytest.approx(gb_per_s * GB, rel=1e-12)


@pytest.mark.parametrize(("speed", "readable"), [
    ("0", False), ("1", True), (str(MAX_LINK_GBIT_PER_S), True), (str(MAX_LINK_GBIT_PER_S + 1), False),
    ("", False), ("fast", False), ("-400", False), ("4e2", False), ("١٠٠", False), ("1" * 5000, False),
])
def test_a_speed_is_read_from_1_to_the_largest_link_sold(speed: str, readable: bool) -> None:
    if readable:
        assert booked_network(f"roce-{speed}g").link_gbit_per_s == int(speed)
        return
    with pytest.raises(ValueError, match="speed"):
        booked_network(f"roce-{speed}g")


def test_the_unscaled_figures_are_the_fabrics_own() -> None:
    assert booked_network("ib-400g") == NETWORKS[Network.INFINIBAND]


def _two_nodes(network: str):
    return booked_hardware(gpu_type="H100", topology="2x8-nvlink", network=network, num_nodes=2, num_gpus=16, price_per_gpu_hour_cents=100)


def test_a_slower_fabric_plans_a_longer_run_across_nodes() -> None:
    document = json.loads(FIXTURE.read_text())
    document["model"]["size"] = "proxy-150m"
    manifest = Manifest.model_validate_json(json.dumps(document))
    fast, slow = (plan_run(manifest, _two_nodes(label), pair_shapes=None).wall_seconds for label in ("ib-400g", "ib-10g"))
    assert slow > fast


def test_an_unreadable_speed_cannot_be_planned() -> None:
    with pytest.raises(ItoError) as refused:
        _two_nodes("ib-fast")
    assert refused.value.code is ErrorCode.PLAN_REFUSED
