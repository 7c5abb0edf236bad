"""The planner under huge, tiny and odd inputs: world sizes far past any booking, and totals that
must come out to the same bit on every Python version."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from ito_assets.manifest.schema import Manifest
from ito_assets.training.hardware import gpu_spec, network_spec
from ito_assets.training.model_config import config_by_name
from ito_assets.training.planner import Hardware, PlanRequest, _divisors, default_global_batch_sequences, plan
from ito_assets.training.run_plan import plan_run

MANIFESTS = Path(__file__).resolve().parents[2] / "data" / "fixtures" / "manifests"


def hardware(num_nodes: int = 1, gpus_per_node: int = 8) -> Hardware:
    return Hardware(gpu=gpu_spec("H100-SXM"), network=network_spec("infiniband"), num_nodes=num_nodes,
                    gpus_per_node=gpus_per_node, price_cents_per_gpu_hour=250)


@pytest.mark.parametrize("n", [*range(1, 200), 720, 1024, 4096, 55440, 65536, 999_983, 10**6])
def test_divisors_are_every_divisor_ascending(n: int) -> None:
    expected = [d for d in range(1, n + 1) if n % d == 0] if n <= 65536 else None
    found = _divisors(n)
    assert found == sorted(set(found)) and all(n % d == 0 for d in found)
    assert expected is None or found == expected
    assert n != 10**6 or len(found) == 49  # 2^6 x 5^6: 7 x 7 divisors, the square root counted once


def test_a_world_far_past_any_booking_plans_in_moments_not_minutes() -> None:
    # The offline flags take any GPU count; the search's replicate x shard splits used to be found
    # by trial division up to the world size (12.7 s for 10^8 GPUs, minutes for 10^9).
    world = 10**8
    model = config_by_name("tiny")
    request = PlanRequest(model=model, sequence_length=2048, num_training_tokens=10**12, hardware=hardware(world // 8),
                          global_batch_sequences=default_global_batch_sequences(model, 2048, world))
    started = time.perf_counter()
    chosen = plan(request)
    assert time.perf_counter() - started < 5
    assert chosen.layout.world_size == world and chosen.cost_cents > 0


def _manifest(size: str, stages: list[dict]) -> Manifest:
    document = json.loads((MANIFESTS / "fixture-small.json").read_text())
    document["model"]["size"] = size
    document["training_target"] = {"num_tokens": sum(s["num_tokens"] for s in stages), "stages": stages}
    return Manifest.model_validate_json(json.dumps(document))


def test_the_runs_time_is_the_correctly_rounded_sum_of_its_stages() -> None:
    stages = [{"name": "pretraining", "num_tokens": 496_949_968_117, "sequence_length": 256},
              {"name": "mid_training", "num_tokens": 387_887_538_055, "sequence_length": 2048},
              {"name": "long_context", "num_tokens": 402_777_208_084, "sequence_length": 256}]
    run_plan = plan_run(_manifest("llama3-8b", stages), hardware(), pair_shapes=None)
    walls = [s.plan.wall_seconds for s in run_plan.stages]
    naive = (walls[0] + walls[1]) + walls[2]
    assert naive != math.fsum(walls)  # a case where left-to-right float addition rounds the other way
    # Python 3.12's sum() is compensated and gives fsum's bits here, 3.11's gives the naive ones:
    # gate 5 and `ito plan` on two versions would otherwise disagree about the same plan.
    assert run_plan.wall_seconds == math.fsum(walls)
