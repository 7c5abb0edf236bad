"""ito_assets.training.planner at the edge of each refusal: exactly at the limit, and one step on
each side (one byte of GPU memory, one micro-batch, one sequence, one GPU, one byte/s of network),
with the exact reasons, details and the PLAN_REFUSED code."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ito_assets.errors import ErrorCode
from ito_assets.training.cost import cost_cents, gpu_hours
from ito_assets.training.capabilities import Capabilities
from ito_assets.training.hardware import GB, GIB, Network, NetworkSpec, gpu_spec, network_spec
from ito_assets.training.layout import Checkpointing, Layout, PlanRefused, Precision, Refusal, RefusalReason as R
from ito_assets.training.memory import FIXED_RESERVE_BYTES, FRAGMENTATION_FRACTION, estimate_memory
from ito_assets.training.model_config import ModelConfig, config_by_name, parameter_count
from ito_assets.training.planner import (
    Hardware,
    Plan,
    PlanRequest,
    _complexity,
    _precision,
    _structural,
    _tensor_parallel,
    _wasteful,
    candidate_layouts,
    default_global_batch_sequences,
    plan,
    refusals_of,
)
from ito_assets.training.throughput import fp8_flop_fraction

H100 = gpu_spec("H100-SXM")
FULL = Checkpointing.FULL
P150 = config_by_name("proxy-150m")


def gpu_with(memory_bytes: int, base=H100):
    return replace(base, memory_bytes=memory_bytes)


def hw(*, gpu=H100, nodes: int = 1, per_node: int = 1, network="infiniband", price: int = 250) -> Hardware:
    net = network_spec(network) if isinstance(network, str) else network
    return Hardware(gpu=gpu, network=net, num_nodes=nodes, gpus_per_node=per_node, price_cents_per_gpu_hour=price)


def req(config: ModelConfig, hardware: Hardware, *, seq: int = 2048, batch: int = 8, tokens: int = 10**9,
        layout: Layout | None = None) -> PlanRequest:
    return PlanRequest(model=config, sequence_length=seq, global_batch_sequences=batch, num_training_tokens=tokens,
                       hardware=hardware, layout=layout, capabilities=Capabilities.everything())


def reasons(request: PlanRequest, layout: Layout) -> list[str]:
    return [r.reason.value for r in refusals_of(request, layout)]


def exact_capacity(config: ModelConfig, layout: Layout, seq: int) -> int:
    """The GPU memory (bytes) at which `layout` needs exactly all of it: the reserve grows with the
    capacity (5%), so this solves M - int(0.05 M) = what the layout needs besides that 5%."""
    est = estimate_memory(config, layout, seq, H100)
    need = est.total - est.reserve + FIXED_RESERVE_BYTES
    lo, hi = 1, 1 << 50
    while lo < hi:
        mid = (lo + hi) // 2
        if mid - int(FRAGMENTATION_FRACTION * mid) >= need:
            hi = mid
        else:
            lo = mid + 1
    exact = estimate_memory(config, layout, seq, gpu_with(lo))
    assert exact.total == exact.capacity == lo and exact.fits
    short = estimate_memory(config, layout, seq, gpu_with(lo - 1))
    assert short.total == short.capacity + 1 and not short.fits  # one byte over
    return lo


def refused(request: PlanRequest) -> PlanRefused:
    with pytest.raises(PlanRefused) as info:
        plan(request)
    assert info.value.code is ErrorCode.PLAN_REFUSED
    assert info.value.to_dict()["code"] == "PLAN_REFUSED" and info.value.retryable is False
    return info.value


# --- memory: exactly fits vs one byte over ----------------------------------------------------


def test_memory_that_exactly_fits_is_accepted_one_byte_over_is_refused():
    layout = Layout()
    capacity = exact_capacity(P150, layout, 2048)
    assert capacity == 6_876_774_399
    assert refusals_of(req(P150, hw(gpu=gpu_with(capacity))), layout) == ()
    over = req(P150, hw(gpu=gpu_with(capacity - 1)), layout=layout)
    assert refusals_of(over, layout) == (Refusal(reason=R.OVER_MEMORY, detail="needs 6.4 GiB of 6.4 GiB per GPU"),)
    err = refused(over)
    assert err.reasons == ("OVER_MEMORY",)
    assert err.message == "the proposed layout is refused: OVER_MEMORY"
    accepted = plan(req(P150, hw(gpu=gpu_with(capacity)), layout=layout))
    assert accepted.layout == layout and accepted.num_candidates == 1 and accepted.num_refused == 0
    assert accepted.memory.total == accepted.memory.capacity == capacity


def test_over_memory_detail_is_in_gib_of_two_to_the_thirty():
    detail = refusals_of(req(config_by_name("llama3-70b"), hw(per_node=8), seq=8192), Layout(dp_shard=8, checkpointing=FULL))
    memory = estimate_memory(config_by_name("llama3-70b"), Layout(dp_shard=8, checkpointing=FULL), 8192, H100)
    assert detail == (Refusal(reason=R.OVER_MEMORY, detail=f"needs {memory.total / GIB:.1f} GiB of 74.5 GiB per GPU"),)
    assert 80 * GB / 2**30 == pytest.approx(74.5058, abs=1e-4)


def test_search_at_the_memory_edge_keeps_the_one_layout_that_fits():
    frugal = Layout(checkpointing=FULL)  # recomputation at one sequence per GPU: the least memory
    capacity = exact_capacity(P150, frugal, 2048)
    chosen = plan(req(P150, hw(gpu=gpu_with(capacity))))
    assert chosen.layout == frugal
    # 1 GPU, batch 8: 2 precisions x 2 checkpointings x micro-batches 1, 2, 4, 8 = 16 candidates.
    assert (chosen.num_candidates, chosen.num_refused) == (16, 15)
    err = refused(req(P150, hw(gpu=gpu_with(capacity - 1))))
    assert err.reasons == ("OVER_MEMORY",)
    assert err.message == "no layout of this booking can train this model: OVER_MEMORY"
    # The reported refusal is the one of the smallest candidate (the frugal layout), not another's.
    assert err.refusals == (Refusal(reason=R.OVER_MEMORY, detail="needs 5.6 GiB of 5.6 GiB per GPU"),)


def test_search_reports_every_reason_of_the_smallest_candidate():
    # An fp8-less GPU and a model too large for it: the smallest candidate is refused only for memory.
    err = refused(req(config_by_name("llama3-70b"), hw(gpu=gpu_spec("L40S")), seq=8192, batch=1))
    assert err.reasons == ("OVER_MEMORY",)
    assert [r.reason for r in err.refusals] == [R.OVER_MEMORY]


# --- pipeline: wasteful vs needed, and the bubble ----------------------------------------------

FAT = ModelConfig(name="fat", vocab_size=256, num_layers=4, d_model=1024, num_heads=8, d_ff=4096)  # layers >> embedding


@pytest.fixture(scope="module")
def flat_capacity() -> int:
    """The memory at which the pipeline's simpler alternative (sharding over both GPUs) just fits."""
    return exact_capacity(FAT, Layout(dp_shard=2, checkpointing=FULL), 2048)


def _pipe(capacity: int, batch: int) -> PlanRequest:
    return req(FAT, hw(gpu=gpu_with(capacity), per_node=2), batch=batch)


def test_pipeline_when_sharding_just_fits_is_wasteful(flat_capacity):
    layout = Layout(pp=2, checkpointing=FULL)
    assert refusals_of(_pipe(flat_capacity, 4), layout) == (
        Refusal(reason=R.PIPELINE_WHEN_SHARDING_FITS, detail="sharded data parallelism fits without pipeline stages"),)
    assert refusals_of(_pipe(flat_capacity - 1, 4), layout) == ()  # sharding is one byte over: the pipeline is needed
    # The simpler layout is judged in its most frugal form: recomputation, one sequence per GPU.
    assert not estimate_memory(FAT, Layout(dp_shard=2), 2048, gpu_with(flat_capacity)).fits
    assert not estimate_memory(FAT, Layout(dp_shard=2, checkpointing=FULL, micro_batch_size=2), 2048,
                               gpu_with(flat_capacity)).fits
    # ... even when the pipelined layout itself runs two sequences per micro-batch.
    assert reasons(_pipe(flat_capacity, 8), Layout(pp=2, micro_batch_size=2, checkpointing=FULL)) == [
        "PIPELINE_WHEN_SHARDING_FITS"]


@pytest.mark.parametrize(
    "layout,batch,ok",
    [
        # 1F1B: (p - 1) / m <= 1/4, so m >= 4 (p - 1) micro-batches.
        (Layout(pp=2, checkpointing=FULL), 4, True),
        (Layout(pp=2, checkpointing=FULL), 5, True),
        (Layout(pp=2, checkpointing=FULL), 3, False),
        (Layout(pp=2, checkpointing=FULL, micro_batch_size=2), 8, True),  # 4 micro-batches of 2
        (Layout(pp=2, checkpointing=FULL, micro_batch_size=2), 6, False),  # 3 micro-batches of 2
    ],
)
def test_pipeline_bubble_boundary(flat_capacity, layout, batch, ok):
    got = refusals_of(_pipe(flat_capacity - 1, batch), layout)
    if ok:
        assert got == ()
    else:
        m = batch // layout.micro_batch_size
        assert got == (Refusal(reason=R.PIPELINE_TOO_FEW_MICROBATCHES, detail=f"{m} micro-batches for 2 stages"),)
        err = refused(replace(_pipe(flat_capacity - 1, batch), layout=layout))
        assert err.reasons == ("PIPELINE_TOO_FEW_MICROBATCHES",)


@pytest.mark.parametrize("batch,too_few", [(11, True), (12, False), (13, False)])
def test_four_stages_need_twelve_micro_batches(batch, too_few):
    request = req(config_by_name("llama3-70b"), hw(nodes=4, per_node=8), seq=8192, batch=batch)
    got = reasons(request, Layout(pp=4, tp=8, checkpointing=FULL))
    assert ("PIPELINE_TOO_FEW_MICROBATCHES" in got) is too_few
    if too_few:
        assert Refusal(reason=R.PIPELINE_TOO_FEW_MICROBATCHES, detail="11 micro-batches for 4 stages") in refusals_of(
            request, Layout(pp=4, tp=8, checkpointing=FULL))


def test_micro_batches_count_data_parallel_ranks():
    # 4 GPUs: pp 2 x dp 2; batch 8 is 4 micro-batches per rank (enough), batch 6 is 3 (too few).
    # (Sharding over all four always fits when this does: the pipeline is also wasteful here.)
    for batch, expected in ((8, ["PIPELINE_WHEN_SHARDING_FITS"]),
                            (6, ["PIPELINE_WHEN_SHARDING_FITS", "PIPELINE_TOO_FEW_MICROBATCHES"])):
        got = reasons(req(FAT, hw(per_node=4), batch=batch), Layout(pp=2, dp_shard=2, checkpointing=FULL))
        assert got == expected, batch


def test_fewer_sequences_than_one_micro_batch_per_rank_is_too_few_not_a_crash(flat_capacity):
    # refusals_of() refuses this as BATCH_INDIVISIBLE first; the rule itself must still answer.
    request = _pipe(flat_capacity - 1, 1)
    got = _wasteful(request, Layout(pp=2, micro_batch_size=2, checkpointing=FULL))
    assert got == [Refusal(reason=R.PIPELINE_TOO_FEW_MICROBATCHES, detail="0 micro-batches for 2 stages")]


# --- context parallelism --------------------------------------------------------------------------


@pytest.mark.parametrize("checkpointing", list(Checkpointing))
def test_context_parallel_when_the_sequence_just_fits_is_wasteful(checkpointing):
    capacity = exact_capacity(P150, Layout(dp_shard=2, checkpointing=FULL), 4096)
    layout = Layout(cp=2, checkpointing=checkpointing)
    request = lambda c: req(P150, hw(gpu=gpu_with(c), per_node=2), seq=4096)  # noqa: E731
    assert refusals_of(request(capacity), layout) == (
        Refusal(reason=R.CONTEXT_PARALLEL_WHEN_SEQUENCE_FITS, detail="the sequence fits on one GPU without context parallelism"),)
    assert refusals_of(request(capacity - 1), layout) == ()


@pytest.mark.parametrize(
    "cp,seq,ok",
    [(2, 4096, True), (2, 4094, False), (2, 4095, False), (2, 4, True), (2, 8, True), (2, 6, False),
     (4, 24, True), (4, 12, False), (4, 16, True), (4, 8, True), (8, 16, True), (8, 24, False)],
)
def test_context_parallel_needs_the_sequence_divisible_by_twice_cp(cp, seq, ok):
    found = _structural(req(P150, hw(per_node=cp), seq=seq), Layout(cp=cp))
    expected = [] if ok else [Refusal(reason=R.CONTEXT_PARALLEL_INDIVISIBLE,
                                      detail="load-balanced ring attention needs the sequence divisible by 2 x cp")]
    assert found == expected


@pytest.mark.parametrize("seq", [1, 3, 1001])
def test_no_context_parallelism_takes_any_sequence_length(seq):
    assert _structural(req(config_by_name("tiny"), hw(), seq=seq), Layout()) == []


# --- full sharding over a slow network ------------------------------------------------------------


@pytest.fixture(scope="module")
def hybrid_capacity() -> int:
    return exact_capacity(P150, Layout(dp_replicate=2, dp_shard=2, checkpointing=FULL), 2048)


def _two_nodes(capacity: int, network) -> PlanRequest:
    return req(P150, hw(gpu=gpu_with(capacity), nodes=2, per_node=2, network=network))


FULL_SHARD = Refusal(reason=R.FULL_SHARD_OVER_SLOW_INTERCONNECT,
                     detail="full sharding across nodes on a slow network where hybrid sharding fits")


@pytest.mark.parametrize(
    "network,slow",
    [("ethernet", True), ("infiniband", False), ("roce", False),
     (NetworkSpec(kind=Network.ROCE, bandwidth=25 * GB, link_gbit_per_s=200, source="test"), False),
     (NetworkSpec(kind=Network.ROCE, bandwidth=25 * GB - 1, link_gbit_per_s=200, source="test"), True),
     (NetworkSpec(kind=Network.ETHERNET, bandwidth=25 * GB, link_gbit_per_s=200, source="test"), False)],
    ids=["ethernet", "infiniband", "roce", "exactly-25GB", "25GB-less-1", "fast-ethernet"],
)
def test_full_shard_is_wasteful_only_below_25_gb_per_s(hybrid_capacity, network, slow):
    got = refusals_of(_two_nodes(hybrid_capacity, network), Layout(dp_shard=4, checkpointing=FULL))
    assert got == ((FULL_SHARD,) if slow else ())


def test_full_shard_is_needed_when_hybrid_is_one_byte_over(hybrid_capacity):
    assert refusals_of(_two_nodes(hybrid_capacity - 1, "ethernet"), Layout(dp_shard=4, checkpointing=FULL)) == ()


def test_hybrid_and_single_node_sharding_are_never_this_waste(hybrid_capacity):
    assert refusals_of(_two_nodes(hybrid_capacity, "ethernet"), Layout(dp_replicate=2, dp_shard=2, checkpointing=FULL)) == ()
    one_node = req(P150, hw(gpu=gpu_with(hybrid_capacity), per_node=4, network="ethernet"))
    assert refusals_of(one_node, Layout(dp_shard=4, checkpointing=FULL)) == ()  # the span is one node exactly


def test_the_hybrid_alternative_spans_whole_nodes():
    # 4 nodes of 2 GPUs, a 4-GPU shard group replicated twice: not a full shard, so not this waste,
    # even though a 2 x 2 hybrid of it would fit.
    request = req(P150, hw(nodes=4, per_node=2, network="ethernet"))
    assert refusals_of(request, Layout(dp_replicate=2, dp_shard=4, checkpointing=FULL)) == ()
    assert refusals_of(request, Layout(dp_shard=8, checkpointing=FULL)) == (FULL_SHARD,)


# --- tensor parallelism -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tp,per_node,network,gpu,expected",
    [
        (1, 8, "ethernet", "L40S", None),
        (2, 8, "infiniband", "H100-SXM", None),
        (8, 8, "infiniband", "H100-SXM", None),  # exactly one node's NVLink domain
        (8, 4, "infiniband", "H100-SXM", R.TENSOR_PARALLEL_ACROSS_NODES),
        (8, 4, "roce", "H100-SXM", R.TENSOR_PARALLEL_ACROSS_NODES),
        (8, 4, "ethernet", "H100-SXM", R.TENSOR_PARALLEL_OVER_ETHERNET),
        (4, 6, "infiniband", "H100-SXM", R.TENSOR_PARALLEL_ACROSS_NODES),  # 4 does not divide 6: a group straddles
        (4, 6, "ethernet", "H100-SXM", R.TENSOR_PARALLEL_OVER_ETHERNET),
        (2, 8, "infiniband", "L40S", R.TENSOR_PARALLEL_WITHOUT_NVLINK),
        (16, 8, "ethernet", "L40S", R.TENSOR_PARALLEL_OVER_ETHERNET),  # across nodes is named first
    ],
)
def test_tensor_parallel_rules(tp, per_node, network, gpu, expected):
    request = req(P150, hw(gpu=gpu_spec(gpu), nodes=2, per_node=per_node, network=network))
    found = _tensor_parallel(request, Layout(tp=tp))
    assert [r.reason for r in found] == ([] if expected is None else [expected])
    details = {R.TENSOR_PARALLEL_ACROSS_NODES: "a tensor-parallel group spans nodes",
               R.TENSOR_PARALLEL_OVER_ETHERNET: "tensor-parallel collectives every layer over Ethernet",
               R.TENSOR_PARALLEL_WITHOUT_NVLINK: f"{gpu} GPUs talk over PCIe, not NVLink"}
    if expected is not None:
        assert found[0].detail == details[expected]


BASE = dict(name="t", vocab_size=1024, num_layers=4, d_model=256, num_heads=4, d_ff=512)


@pytest.mark.parametrize(
    "change,ok",
    [({}, True), ({"num_heads": 1}, False), ({"num_heads": 2}, True), ({"num_kv_heads": 1}, False),
     ({"num_kv_heads": 2}, True), ({"d_ff": 514}, True), ({"d_ff": 513}, False), ({"vocab_size": 1025}, True),
     ({"vocab_size": 1026}, True), ({"seq": 2047}, False), ({"seq": 2046}, True)],
    ids=["base", "heads-1", "heads-2", "kv-1", "kv-2", "dff-even", "dff-odd", "vocab-odd-whole-head", "vocab-even", "seq-odd",
         "seq-even"],
)
def test_tensor_parallel_must_divide_each_dimension(change, ok):
    seq = change.get("seq", 2048)
    config = ModelConfig(**(BASE | {k: v for k, v in change.items() if k != "seq"}))
    found = _structural(req(config, hw(per_node=2), seq=seq), Layout(tp=2))
    assert found == ([] if ok else [Refusal(
        reason=R.TENSOR_PARALLEL_INDIVISIBLE,
        detail="tp must divide heads, KV heads, d_ff and the sequence (sequence parallelism)")])


# --- the other structural rules -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "per_node,layout,ok",
    [(8, Layout(dp_shard=8), True), (8, Layout(dp_shard=4), False), (8, Layout(dp_shard=16), False),
     (1, Layout(), True), (1, Layout(dp_shard=2), False), (6, Layout(dp_shard=3, tp=2), True),
     (6, Layout(dp_shard=3, cp=2), True), (6, Layout(dp_replicate=3, pp=2), True), (6, Layout(dp_shard=5), False)],
)
def test_degrees_must_multiply_to_the_booked_gpus(per_node, layout, ok):
    config = ModelConfig(**(BASE | {"num_heads": 2}))
    found = _structural(req(config, hw(per_node=per_node), batch=48, seq=4096), layout)
    degree_refusals = [r for r in found if r.reason is R.DEGREES_NOT_WORLD_SIZE]
    if ok:
        assert degree_refusals == []
    else:
        assert degree_refusals == [Refusal(reason=R.DEGREES_NOT_WORLD_SIZE,
                                           detail=f"degrees multiply to {layout.world_size}, the booking has {per_node} GPUs")]


@pytest.mark.parametrize(
    "layout,batch,ok",
    [(Layout(dp_shard=8), 8, True), (Layout(dp_shard=8), 7, False), (Layout(dp_shard=8), 9, False),
     (Layout(dp_shard=8, micro_batch_size=2), 16, True), (Layout(dp_shard=8, micro_batch_size=2), 8, False),
     (Layout(dp_shard=8, micro_batch_size=2), 15, False), (Layout(dp_shard=8, micro_batch_size=2), 17, False),
     (Layout(dp_replicate=2, dp_shard=4, micro_batch_size=2), 16, True),
     (Layout(dp_replicate=2, dp_shard=4, micro_batch_size=2), 12, False),
     (Layout(dp_shard=4, tp=2), 4, True), (Layout(dp_shard=4, tp=2), 6, False),
     (Layout(dp_shard=2, micro_batch_size=3), 6, True), (Layout(dp_shard=2, micro_batch_size=3), 5, False)],
)
def test_batch_must_be_a_multiple_of_dp_times_micro_batch(layout, batch, ok):
    found = _structural(req(P150, hw(per_node=layout.world_size), batch=batch), layout)
    assert found == ([] if ok else [Refusal(reason=R.BATCH_INDIVISIBLE,
                                            detail="the global batch is not a multiple of dp x micro_batch_size")])


@pytest.mark.parametrize("layers,pp,ok", [(12, 4, True), (12, 3, True), (12, 5, False), (12, 8, False), (8, 8, True),
                                          (7, 8, False), (9, 8, False), (16, 8, True)])
def test_pipeline_stages_must_divide_the_layers(layers, pp, ok):
    config = ModelConfig(**(BASE | {"num_layers": layers}))
    found = _structural(req(config, hw(per_node=pp)), Layout(pp=pp))
    assert found == ([] if ok else [Refusal(reason=R.PIPELINE_STAGES_INDIVISIBLE, detail="pp must divide the number of layers")])


def test_structural_refusals_accumulate_in_order():
    found = _structural(req(P150, hw(per_node=8), seq=1001, batch=7), Layout(tp=8, pp=8, cp=8, micro_batch_size=2))
    assert [r.reason for r in found] == [R.DEGREES_NOT_WORLD_SIZE, R.BATCH_INDIVISIBLE, R.TENSOR_PARALLEL_INDIVISIBLE,
                                         R.PIPELINE_STAGES_INDIVISIBLE, R.CONTEXT_PARALLEL_INDIVISIBLE]


def test_wasteful_is_judged_only_when_nothing_else_refuses():
    # pp 2 of proxy-150m on 2 GPUs: sharding fits (wasteful), but the batch is indivisible: only that is said.
    request = req(P150, hw(per_node=2), batch=3)
    assert reasons(request, Layout(pp=2, dp_shard=1, micro_batch_size=2)) == ["BATCH_INDIVISIBLE"]
    assert reasons(req(P150, hw(per_node=2), batch=4), Layout(pp=2)) == ["PIPELINE_WHEN_SHARDING_FITS"]


def test_proposed_layout_message_lists_each_reason_once_sorted():
    request = req(P150, hw(per_node=8), seq=1001, batch=7, layout=Layout(tp=8, pp=8, cp=8, micro_batch_size=2))
    err = refused(request)
    assert err.message == ("the proposed layout is refused: BATCH_INDIVISIBLE, CONTEXT_PARALLEL_INDIVISIBLE, "
                           "DEGREES_NOT_WORLD_SIZE, PIPELINE_STAGES_INDIVISIBLE, TENSOR_PARALLEL_INDIVISIBLE")
    assert err.to_dict()["reasons"] == sorted(err.to_dict()["reasons"])


# --- fp8 ---------------------------------------------------------------------------------------------


def _half(vocab: int) -> ModelConfig:
    # One layer of 7 d x d matmuls (all fp8-eligible at d = 2048) against a vocab x d head that is
    # not: exactly half the matmul FLOPs convert when vocab = 7 d.
    return ModelConfig(name="half", vocab_size=vocab, num_layers=1, d_model=2048, num_heads=16, d_ff=2048)


@pytest.mark.parametrize("vocab,ok", [(14335, True), (14336, True), (14337, False)])
def test_fp8_needs_at_least_half_the_matmul_flops(vocab, ok):
    share = fp8_flop_fraction(_half(vocab))
    assert (share == 0.5) is (vocab == 14336)
    request = req(_half(vocab), hw(per_node=8))
    layout = Layout(dp_shard=8, precision=Precision.FP8)
    if ok:
        assert refusals_of(request, layout) == ()
    else:
        assert refusals_of(request, layout) == (Refusal(reason=R.FP8_LAYERS_TOO_SMALL,
                                                  detail="only 50% of matmul FLOPs are in layers large enough for fp8"),)


def test_fp8_rules_apply_only_to_fp8_and_name_the_gpu():
    request = req(P150, hw(gpu=gpu_spec("A100-80GB")))
    assert _precision(request, Layout()) == []
    assert _precision(request, Layout(precision=Precision.FP8)) == [
        Refusal(reason=R.FP8_UNSUPPORTED_GPU, detail="A100-80GB has no fp8 tensor cores")]
    assert _precision(req(P150, hw()), Layout(precision=Precision.FP8)) == [
        Refusal(reason=R.FP8_LAYERS_TOO_SMALL, detail="only 19% of matmul FLOPs are in layers large enough for fp8")]


def test_fp8_share_is_tp_local():
    assert _precision(req(_half(14336), hw(per_node=2)), Layout(tp=2, precision=Precision.FP8)) == [
        Refusal(reason=R.FP8_LAYERS_TOO_SMALL, detail=f"only {fp8_flop_fraction(_half(14336), 2):.0%} of matmul FLOPs "
                                                      "are in layers large enough for fp8")]
    assert fp8_flop_fraction(_half(14336), 2) < 0.5


# --- the booking and the request ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,message",
    [({"num_nodes": 0}, "num_nodes must be positive"), ({"gpus_per_node": 0}, "gpus_per_node must be positive"),
     ({"price_cents_per_gpu_hour": -1}, "price_cents_per_gpu_hour must be >= 0")],
)
def test_hardware_bounds(kwargs, message):
    base = dict(gpu=H100, network=network_spec("infiniband"), num_nodes=1, gpus_per_node=1, price_cents_per_gpu_hour=0)
    assert Hardware(**base).world_size == 1
    with pytest.raises(ValueError) as info:
        Hardware(**(base | kwargs))
    assert str(info.value) == message


@pytest.mark.parametrize(
    "field", ["sequence_length", "global_batch_sequences", "num_training_tokens"],
)
def test_request_bounds(field):
    base = dict(model=P150, sequence_length=1, global_batch_sequences=1, num_training_tokens=1, hardware=hw())
    PlanRequest(**base)
    with pytest.raises(ValueError) as info:
        PlanRequest(**(base | {field: 0}))
    assert str(info.value) == f"{field} must be positive"


def test_hardware_describes_itself():
    booking = hw(gpu=gpu_spec("L40S"), nodes=3, per_node=4, network="roce", price=199)
    assert booking.world_size == 12
    assert booking.describe() == {"gpu_type": "L40S", "network": "roce", "num_nodes": 3, "gpus_per_node": 4,
                                  "price_cents_per_gpu_hour": 199}


@pytest.mark.parametrize(
    "model,seq,world,expected",
    [("proxy-150m", 2048, 8, 208), ("proxy-150m", 2048, 3, 216), ("proxy-150m", 4096, 16, 112),
     ("tiny", 128, 1, 128), ("llama3-70b", 8192, 64, 3072)],
)
def test_default_batch_rule(model, seq, world, expected):
    got = default_global_batch_sequences(config_by_name(model), seq, world)
    assert got == expected
    assert got % math.lcm(world, 8) == 0


def test_default_batch_is_at_least_one_multiple():
    assert default_global_batch_sequences(config_by_name("micro"), 10**9, 8) == 8


# --- the plan's arithmetic and the search's tie-breaks ---------------------------------------------------


def test_plan_arithmetic_rounds_steps_up():
    base = req(P150, hw(per_node=8), batch=64, layout=Layout(dp_shard=8))
    tokens_per_step = 64 * 2048
    for tokens, steps in ((tokens_per_step * 3, 3), (tokens_per_step * 3 + 1, 4), (1, 1)):
        chosen = plan(replace(base, num_training_tokens=tokens))
        assert isinstance(chosen, Plan)
        assert chosen.step.tokens_per_step == tokens_per_step
        assert chosen.num_steps == steps
        assert chosen.wall_seconds == steps * chosen.step.step_s
        assert chosen.gpu_hours == gpu_hours(8, chosen.wall_seconds) == 8 * chosen.wall_seconds / 3600
        assert chosen.cost_cents == cost_cents(8, chosen.wall_seconds, 250)
        d = chosen.to_dict()
        assert d["num_steps"] == steps and d["cost_cents"] == chosen.cost_cents
        assert d["wall_seconds"] == round(chosen.wall_seconds, 3) and d["gpu_hours"] == round(chosen.gpu_hours, 6)
        assert d["model"] == {"name": "proxy-150m", "num_parameters": parameter_count(P150), "vocab_size": 50304}
        assert d["hardware"] == base.hardware.describe() and d["layout"] == Layout(dp_shard=8).describe()
        assert (d["sequence_length"], d["global_batch_sequences"], d["num_training_tokens"]) == (2048, 64, tokens)
        assert (d["num_candidates"], d["num_refused"]) == (1, 0)
        assert d["memory_per_gpu"] == chosen.memory.to_dict() and d["step"] == chosen.step.to_dict()


def test_complexity_orders_dimensions_then_recomputation_then_fp8():
    assert _complexity(Layout()) == (0, False, False)
    assert _complexity(Layout(dp_replicate=2, dp_shard=4)) == (0, False, False)
    assert _complexity(Layout(tp=2)) == (1, False, False)
    assert _complexity(Layout(tp=2, pp=2, cp=2, checkpointing=FULL, precision=Precision.FP8)) == (3, True, True)
    assert _complexity(Layout(cp=4, checkpointing=FULL)) == (1, True, False)
    assert _complexity(Layout(pp=2, precision=Precision.FP8)) == (1, False, True)


def test_search_breaks_ties_by_simplicity_then_the_largest_micro_batch():
    request = req(config_by_name("tiny"), hw(gpu=gpu_spec("CPU")), seq=128, batch=128)
    chosen = plan(request)
    accepted = [layout for layout in candidate_layouts(request) if not refusals_of(request, layout)]
    fastest = min(round(plan(replace(request, layout=layout)).step.step_s, 9) for layout in accepted)
    assert round(chosen.step.step_s, 9) == fastest
    ties = [layout for layout in accepted if round(plan(replace(request, layout=layout)).step.step_s, 9) == fastest]
    best = min(ties, key=lambda layout: (_complexity(layout), -layout.micro_batch_size))
    assert chosen.layout == best
    assert chosen.layout.checkpointing is Checkpointing.NONE and chosen.layout.precision is Precision.BF16


def test_candidates_cover_every_factorisation_and_micro_batch_up_to_the_batch():
    request = req(P150, hw(per_node=4), batch=2)
    layouts = candidate_layouts(request)
    assert all(layout.world_size == 4 for layout in layouts)
    assert {layout.micro_batch_size for layout in layouts} == {1, 2}
    degrees = {(l.tp, l.pp, l.cp, l.dp_replicate, l.dp_shard) for l in layouts}  # noqa: E741
    # tp x pp x cp x replicate x shard = 4 over powers of two, replicate x shard any split of the rest
    expected = {(t, p, c, r, 4 // (t * p * c * r)) for t in (1, 2, 4) for p in (1, 2, 4) for c in (1, 2, 4)
                for r in (1, 2, 4) if 4 % (t * p * c) == 0 and (4 // (t * p * c)) % r == 0}
    assert degrees == expected
    assert len(layouts) == len(expected) * 2 * 2 * 2  # precisions x checkpointings x micro-batches
    assert len(set(layouts)) == len(layouts)


def test_candidates_on_a_world_of_six():
    layouts = candidate_layouts(req(P150, hw(per_node=6), batch=1))
    degrees = {(l.tp, l.pp, l.cp, l.dp_replicate, l.dp_shard) for l in layouts}  # noqa: E741
    assert (1, 1, 1, 3, 2) in degrees and (1, 1, 1, 6, 1) in degrees and (2, 1, 1, 1, 3) in degrees
    assert all(l.world_size == 6 for l in layouts) and {l.micro_batch_size for l in layouts} == {1}  # noqa: E741
    assert not any(3 in (l.tp, l.pp, l.cp) for l in layouts)  # noqa: E741  powers of two only


def test_default_batch_rule_constants():
    # At one token per "sequence" and one GPU the rounding hides almost nothing: 160 x (N / 108e6)^(2/3)
    # x 2,048 tokens, to the next multiple of 8. This vocabulary sits 8 sequences from a multiple.
    config = ModelConfig(name="v", vocab_size=12768, num_layers=12, d_model=768, num_heads=12, d_ff=3072)
    tokens = 160 * (parameter_count(config) / 108e6) ** (2 / 3) * 2048
    assert default_global_batch_sequences(config, 1, 1) == 357504 == -(-round(tokens) // 8) * 8
    assert default_global_batch_sequences(P150, 1, 1) == 411344


def test_search_refusal_names_every_reason_of_the_smallest_candidate():
    booking = hw(gpu=gpu_spec("L40S"), per_node=8)
    err = refused(req(config_by_name("llama3-70b"), booking, seq=2048, batch=8))
    assert err.message == "no layout of this booking can train this model: OVER_MEMORY, TENSOR_PARALLEL_WITHOUT_NVLINK"
    assert err.reasons == ("OVER_MEMORY", "TENSOR_PARALLEL_WITHOUT_NVLINK")


@pytest.mark.parametrize(
    "model,booking,seq,expected",
    [
        # Hybrid sharding beats full sharding across two nodes (0.10 s vs 0.30 s a step).
        ("proxy-150m", hw(nodes=2, per_node=8), 2048, Layout(dp_replicate=2, dp_shard=8)),
        # fp8 beats bf16 for OLMo-1B on one H100 node (3.5 s vs 4.5 s a step), though it is less simple.
        ("olmo-1b", hw(per_node=8), 4096, Layout(dp_shard=8, precision=Precision.FP8, micro_batch_size=2)),
    ],
)
def test_search_prefers_the_fastest_over_the_simplest(model, booking, seq, expected):
    config = config_by_name(model)
    request = req(config, booking, seq=seq, batch=default_global_batch_sequences(config, seq, booking.world_size))
    chosen = plan(request)
    assert chosen.layout == expected
    accepted = [layout for layout in candidate_layouts(request) if not refusals_of(request, layout)]
    fastest = min(plan(replace(request, layout=layout)).step.step_s for layout in accepted)
    assert round(chosen.step.step_s, 9) == round(fastest, 9)
    assert any(_complexity(layout) <= _complexity(expected) for layout in accepted if layout != expected)
