"""The planner's rules, one table row per refusal, and the search that avoids them all."""

from __future__ import annotations

import pytest

from ito_assets.errors import ErrorCode
from ito_assets.training.capabilities import Capabilities
from ito_assets.training.hardware import GIB, gpu_spec, network_spec
from ito_assets.training.layout import Checkpointing, Layout, PlanRefused, RefusalReason as R
from ito_assets.training.memory import estimate_memory
from ito_assets.training.model_config import config_by_name, parameter_count
from ito_assets.training.planner import Hardware, PlanRequest, candidate_layouts, default_global_batch_sequences, plan, refusals_of


def hardware(gpu: str = "H100-SXM", nodes: int = 1, per_node: int = 8, network: str = "infiniband") -> Hardware:
    return Hardware(gpu=gpu_spec(gpu), network=network_spec(network), num_nodes=nodes, gpus_per_node=per_node,
                    price_cents_per_gpu_hour=250)


def request(model: str, hw: Hardware, *, seq: int = 2048, batch: int | None = None, layout: Layout | None = None) -> PlanRequest:
    config = config_by_name(model)
    batch = batch or default_global_batch_sequences(config, seq, hw.world_size)
    # Every capability: these are the price model's rules, whatever this runtime can train today.
    return PlanRequest(model=config, sequence_length=seq, global_batch_sequences=batch, num_training_tokens=10**9,
                       hardware=hw, layout=layout, capabilities=Capabilities.everything())


FULL = Checkpointing.FULL
CASES = [
    # reason, model, hardware, layout, extra request arguments
    (R.DEGREES_NOT_WORLD_SIZE, "proxy-150m", hardware(), Layout(dp_shard=4), {}),
    (R.BATCH_INDIVISIBLE, "proxy-150m", hardware(), Layout(dp_shard=8), {"batch": 12}),
    (R.TENSOR_PARALLEL_INDIVISIBLE, "proxy-150m", hardware(), Layout(tp=8), {}),  # 12 heads
    (R.TENSOR_PARALLEL_ACROSS_NODES, "llama3-70b", hardware(nodes=2, per_node=4), Layout(tp=8, checkpointing=FULL), {"seq": 8192}),
    (R.TENSOR_PARALLEL_OVER_ETHERNET, "llama3-70b", hardware(nodes=2, per_node=4, network="ethernet"), Layout(tp=8, checkpointing=FULL), {"seq": 8192}),
    (R.TENSOR_PARALLEL_WITHOUT_NVLINK, "olmo-1b", hardware(gpu="L40S"), Layout(tp=2, dp_shard=4), {}),
    (R.PIPELINE_STAGES_INDIVISIBLE, "proxy-150m", hardware(), Layout(pp=8), {}),  # 12 layers
    (R.PIPELINE_WHEN_SHARDING_FITS, "proxy-150m", hardware(), Layout(pp=2, dp_shard=4), {}),
    (R.PIPELINE_TOO_FEW_MICROBATCHES, "llama3-70b", hardware(nodes=4), Layout(pp=4, tp=8, checkpointing=FULL), {"seq": 8192, "batch": 4}),
    (R.CONTEXT_PARALLEL_WHEN_SEQUENCE_FITS, "proxy-150m", hardware(), Layout(cp=2, dp_shard=4), {}),
    (R.CONTEXT_PARALLEL_INDIVISIBLE, "proxy-150m", hardware(), Layout(cp=8), {"seq": 1000, "batch": 8}),
    (R.FP8_UNSUPPORTED_GPU, "llama3-8b", hardware(gpu="A100-80GB"), Layout(dp_shard=8, precision="fp8", checkpointing=FULL), {"seq": 8192}),
    (R.FP8_LAYERS_TOO_SMALL, "proxy-150m", hardware(), Layout(dp_shard=8, precision="fp8"), {}),
    (R.FP32_NOT_PRICED, "proxy-150m", hardware(), Layout(dp_shard=8, precision="fp32"), {}),
    (R.FULL_SHARD_OVER_SLOW_INTERCONNECT, "llama3-8b", hardware(nodes=2, network="ethernet"), Layout(dp_shard=16, checkpointing=FULL), {"seq": 8192}),
    (R.OVER_MEMORY, "llama3-70b", hardware(), Layout(dp_shard=8, checkpointing=FULL), {"seq": 8192}),
]


@pytest.mark.parametrize("reason,model,hw,layout,extra", CASES, ids=[c[0].value for c in CASES])
def test_each_refusal_has_its_stable_reason(reason, model, hw, layout, extra):
    req = request(model, hw, layout=layout, **extra)
    assert reason in {r.reason for r in refusals_of(req, layout)}
    with pytest.raises(PlanRefused) as raised:
        plan(req)
    assert raised.value.code is ErrorCode.PLAN_REFUSED
    assert reason.value in raised.value.to_dict()["reasons"]


def test_every_reason_has_a_case():
    covered = {case[0] for case in CASES} | {R.UNKNOWN_MODEL_SIZE, R.RUNTIME_CANNOT_TRAIN}  # test_run_plan.py, below
    assert covered == set(R)


@pytest.mark.parametrize(
    "model,hw,seq",
    [("proxy-150m", hardware(), 2048), ("llama3-8b", hardware(nodes=2, network="ethernet"), 8192),
     ("llama3-70b", hardware(nodes=8), 8192), ("olmo-1b", hardware(gpu="L40S", nodes=2, network="roce"), 2048),
     ("tiny", hardware(gpu="CPU", per_node=1), 128)],
)
def test_search_returns_the_fastest_acceptable_layout(model, hw, seq):
    req = request(model, hw, seq=seq)
    chosen = plan(req)
    assert refusals_of(req, chosen.layout) == ()
    assert chosen.memory.fits and chosen.layout.world_size == hw.world_size
    assert 0 < chosen.step.mfu < 1 and chosen.cost_cents > 0
    accepted = [layout for layout in candidate_layouts(req) if not refusals_of(req, layout)]
    assert chosen.num_candidates - chosen.num_refused == len(accepted)


def test_slow_network_gets_hybrid_sharding():
    chosen = plan(request("llama3-8b", hardware(nodes=2, network="ethernet"), seq=8192))
    assert chosen.layout.dp_replicate > 1 and chosen.layout.tp * chosen.layout.shard_group <= 8


def test_nothing_fits_is_refused_for_memory():
    with pytest.raises(PlanRefused) as raised:
        plan(request("llama3-70b", hardware(gpu="L40S", per_node=1), seq=8192))
    assert raised.value.reasons == ("OVER_MEMORY",)


def test_memory_is_16_bytes_per_parameter_plus_activations():
    config = config_by_name("proxy-150m")
    unsharded = estimate_memory(config, Layout(), 2048, gpu_spec("H100-SXM"))
    assert unsharded.model_states == 16 * parameter_count(config)
    sharded = estimate_memory(config, Layout(dp_shard=8), 2048, gpu_spec("H100-SXM"))
    assert sharded.model_states == 16 * parameter_count(config) // 8
    # Korthikanti et al.: 34 s b h per layer for a GELU MLP of 4h; our SwiGLU at f = 4h: 17 + 32.
    assert unsharded.activations == 12 * 2048 * (17 * 768 + 8 * 3072)
    full = estimate_memory(config, Layout(checkpointing=Checkpointing.FULL), 2048, gpu_spec("H100-SXM"))
    assert full.activations < unsharded.activations / 4
    assert unsharded.total < 80 * GIB


def test_request_validation_names_the_field():
    with pytest.raises(ValueError, match="global_batch_sequences"):
        PlanRequest(model=config_by_name("tiny"), sequence_length=128, global_batch_sequences=0,
                    num_training_tokens=1, hardware=hardware())
    with pytest.raises(ValueError, match="tp"):
        Layout(tp=0)
    with pytest.raises(ValueError, match="gpu_type"):
        gpu_spec("TPUv5")


# --- the runtime's capability set -------------------------------------------------------------


def _runtime_request(model: str, hw: Hardware, *, seq: int = 2048, layout: Layout | None = None,
                     capabilities: Capabilities = Capabilities()) -> PlanRequest:
    config = config_by_name(model)
    return PlanRequest(model=config, sequence_length=seq, num_training_tokens=10**9, hardware=hw, layout=layout,
                       global_batch_sequences=default_global_batch_sequences(config, seq, hw.world_size),
                       capabilities=capabilities)


@pytest.mark.parametrize("model,hw,seq", [("proxy-150m", hardware(), 2048), ("llama3-8b", hardware(nodes=2), 8192),
                                          ("llama3-70b", hardware(nodes=8), 8192)])
def test_the_search_stays_within_what_the_runtime_trains(model, hw, seq):
    req = _runtime_request(model, hw, seq=seq)
    candidates = candidate_layouts(req)
    assert candidates and all(c.pp == 1 and c.cp == 1 and c.precision.value == "bf16" for c in candidates)
    assert any(c.tp > 1 for c in candidates)  # tensor parallelism is a runtime capability
    chosen = plan(req).layout
    assert chosen.pp == chosen.cp == 1 and chosen.precision.value == "bf16" and chosen.compile


@pytest.mark.parametrize("layout,missing", [
    (Layout(pp=2, dp_shard=4), "pipeline parallelism"), (Layout(cp=2, dp_shard=4), "context parallelism"),
    (Layout(dp_shard=8, precision="fp8"), "fp8"),
])
def test_a_proposed_layout_the_runtime_cannot_train_is_refused(layout, missing):
    with pytest.raises(PlanRefused) as raised:
        plan(_runtime_request("proxy-150m", hardware(), layout=layout))
    assert "RUNTIME_CANNOT_TRAIN" in raised.value.reasons
    assert missing in str(refusals_of(_runtime_request("proxy-150m", hardware(), layout=layout), layout))


def test_fp8_is_offered_once_the_runtime_has_it():
    req = _runtime_request("llama3-8b", hardware(nodes=2), seq=8192, capabilities=Capabilities(fp8=True))
    assert any(c.precision.value == "fp8" for c in candidate_layouts(req))
    assert "RUNTIME_CANNOT_TRAIN" not in {r.reason.value for r in refusals_of(req, Layout(dp_shard=16, precision="fp8"))}


def test_the_default_capabilities_are_the_workers():
    from ito_assets.training.capabilities import runtime_capabilities

    request = PlanRequest(model=config_by_name("tiny"), sequence_length=128, global_batch_sequences=8,
                          num_training_tokens=10**6, hardware=hardware(gpu="CPU", per_node=1))
    assert request.capabilities == runtime_capabilities()
    can = request.capabilities
    assert can.tensor_parallel and not (can.pipeline_parallel or can.context_parallel or can.fp8)


def test_an_equal_request_is_answered_from_the_cache_and_a_refusal_is_raised_every_time():
    # The API plans a manifest on its booking at every confirm and train: the same frozen request
    # gives the same plan object, a request that differs in one field (the price) is planned anew.
    first = plan(request("proxy-150m", hardware()))
    assert plan(request("proxy-150m", hardware())) is first
    repriced = Hardware(gpu=gpu_spec("H100-SXM"), network=network_spec("infiniband"), num_nodes=1, gpus_per_node=8,
                        price_cents_per_gpu_hour=500)
    again = plan(request("proxy-150m", repriced))
    assert again is not first and again.wall_seconds == first.wall_seconds
    assert abs(again.cost_cents - 2 * first.cost_cents) <= 1  # each rounded up to a whole cent
    refused = request("proxy-150m", hardware(), layout=Layout(dp_shard=4))
    for _ in range(2):
        with pytest.raises(PlanRefused):
            plan(refused)
