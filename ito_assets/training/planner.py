"""The parallelism and precision planner: a pure function from a model, a batch and the booked
hardware to the fastest layout that is neither impossible nor wasteful, with its memory, step
time, MFU and cost. A proposed layout is judged by the same rules; every refusal carries a stable
reason (`RefusalReason`) and surfaces as PLAN_REFUSED.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from itertools import product

from ito_assets.training.capabilities import Capabilities, runtime_capabilities
from ito_assets.training.cost import cost_cents, gpu_hours
from ito_assets.training.hardware import SLOW_INTERCONNECT_BANDWIDTH, GpuSpec, Network, NetworkSpec
from ito_assets.training.layout import Checkpointing, Layout, PlanRefused, Precision, Refusal, RefusalReason as R
from ito_assets.training.memory import MemoryEstimate, estimate_memory
from ito_assets.training.model_config import ModelConfig, parameter_count
from ito_assets.training.throughput import StepEstimate, estimate_step, fp8_flop_fraction

# 1F1B keeps the bubble (p - 1) / m at most 1/4 when m >= 4 (p - 1) micro-batches (Narayanan et al.
# 2021, section 2.2: "m >> p" for a small bubble; 25% is the most we accept).
MAX_PIPELINE_BUBBLE = 0.25
# fp8 must convert at least half of the matmul FLOPs to pay for its casts and scaling.
MIN_FP8_FLOP_FRACTION = 0.5
_POWERS_OF_TWO = (1, 2, 4, 8, 16, 32, 64)


def _require(condition: bool, name: str, rule: str) -> None:
    if not condition:
        raise ValueError(f"{name} {rule}")


@dataclass(frozen=True, kw_only=True)
class Hardware:
    gpu: GpuSpec
    network: NetworkSpec
    num_nodes: int
    gpus_per_node: int
    price_cents_per_gpu_hour: int

    def __post_init__(self) -> None:
        _require(self.num_nodes >= 1, "num_nodes", "must be positive")
        _require(self.gpus_per_node >= 1, "gpus_per_node", "must be positive")
        _require(self.price_cents_per_gpu_hour >= 0, "price_cents_per_gpu_hour", "must be >= 0")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def describe(self) -> dict:
        return {"gpu_type": self.gpu.name, "network": self.network.kind.value, "num_nodes": self.num_nodes,
                "gpus_per_node": self.gpus_per_node, "price_cents_per_gpu_hour": self.price_cents_per_gpu_hour}


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    model: ModelConfig
    sequence_length: int
    global_batch_sequences: int
    num_training_tokens: int
    hardware: Hardware
    layout: Layout | None = None  # a proposed layout to judge instead of searching
    # What the runtime can execute; the search never leaves it, a proposed layout outside it is refused.
    capabilities: Capabilities = field(default_factory=runtime_capabilities)

    def __post_init__(self) -> None:
        _require(self.sequence_length >= 1, "sequence_length", "must be positive")
        _require(self.global_batch_sequences >= 1, "global_batch_sequences", "must be positive")
        _require(self.num_training_tokens >= 1, "num_training_tokens", "must be positive")


@dataclass(frozen=True, kw_only=True)
class Plan:
    request: PlanRequest
    layout: Layout
    memory: MemoryEstimate
    step: StepEstimate
    num_steps: int
    wall_seconds: float
    gpu_hours: float
    cost_cents: int
    num_candidates: int
    num_refused: int

    def to_dict(self) -> dict:
        r = self.request
        return {
            "model": {"name": r.model.name, "num_parameters": parameter_count(r.model), "vocab_size": r.model.vocab_size},
            "sequence_length": r.sequence_length, "global_batch_sequences": r.global_batch_sequences,
            "num_training_tokens": r.num_training_tokens, "hardware": r.hardware.describe(),
            "layout": self.layout.describe(), "memory_per_gpu": self.memory.to_dict(), "step": self.step.to_dict(),
            "num_steps": self.num_steps, "wall_seconds": round(self.wall_seconds, 3),
            "gpu_hours": round(self.gpu_hours, 6), "cost_cents": self.cost_cents,
            "num_candidates": self.num_candidates, "num_refused": self.num_refused,
        }


def default_global_batch_sequences(config: ModelConfig, sequence_length: int, world_size: int) -> int:
    """The OLMo model-ladder batch rule that DataDecide uses (Bhagia et al. 2024):
    160 x (N / 108M)^(2/3) sequences of 2,048 tokens, as sequences of `sequence_length`, rounded up
    to a multiple of lcm(world size, 8): every data-parallel layout divides it, with micro-batches
    of up to 8 sequences on one GPU."""
    tokens = 160 * (parameter_count(config) / 108e6) ** (2 / 3) * 2048
    sequences = max(1, round(tokens / sequence_length))
    multiple = math.lcm(world_size, 8)
    return -(-sequences // multiple) * multiple


# --- the rules --------------------------------------------------------------------------------


def _structural(request: PlanRequest, layout: Layout) -> list[Refusal]:
    cfg, hw = request.model, request.hardware
    found: list[Refusal] = []
    if layout.world_size != hw.world_size:
        found.append(Refusal(reason=R.DEGREES_NOT_WORLD_SIZE, detail=f"degrees multiply to {layout.world_size}, the booking has {hw.world_size} GPUs"))
    if request.global_batch_sequences % (layout.dp * layout.micro_batch_size):
        found.append(Refusal(reason=R.BATCH_INDIVISIBLE, detail="the global batch is not a multiple of dp x micro_batch_size"))
    if (cfg.num_heads % layout.tp or cfg.kv_heads % layout.tp or cfg.d_ff % layout.tp
            or request.sequence_length % layout.tp):
        found.append(Refusal(reason=R.TENSOR_PARALLEL_INDIVISIBLE,
                             detail="tp must divide heads, KV heads, d_ff and the sequence (sequence parallelism)"))
    if cfg.num_layers % layout.pp:
        found.append(Refusal(reason=R.PIPELINE_STAGES_INDIVISIBLE, detail="pp must divide the number of layers"))
    if request.sequence_length % (2 * layout.cp) and layout.cp > 1:
        found.append(Refusal(reason=R.CONTEXT_PARALLEL_INDIVISIBLE, detail="load-balanced ring attention needs the sequence divisible by 2 x cp"))
    return found


def _tensor_parallel(request: PlanRequest, layout: Layout) -> list[Refusal]:
    hw = request.hardware
    if layout.tp == 1:
        return []
    # Megatron-LM keeps tensor parallelism inside a node's NVLink domain (Narayanan et al. 2021, 3.3).
    if layout.tp > hw.gpus_per_node or hw.gpus_per_node % layout.tp:
        if hw.network.kind is Network.ETHERNET:
            return [Refusal(reason=R.TENSOR_PARALLEL_OVER_ETHERNET, detail="tensor-parallel collectives every layer over Ethernet")]
        return [Refusal(reason=R.TENSOR_PARALLEL_ACROSS_NODES, detail="a tensor-parallel group spans nodes")]
    if not hw.gpu.has_nvlink:
        return [Refusal(reason=R.TENSOR_PARALLEL_WITHOUT_NVLINK, detail=f"{hw.gpu.name} GPUs talk over PCIe, not NVLink")]
    return []


def _precision(request: PlanRequest, layout: Layout) -> list[Refusal]:
    if layout.precision is Precision.FP32:
        return [Refusal(reason=R.FP32_NOT_PRICED, detail="the price model is of bf16 matmuls; fp32 is for exactness tests")]
    if layout.precision is not Precision.FP8:
        return []
    if not request.hardware.gpu.supports_fp8:
        return [Refusal(reason=R.FP8_UNSUPPORTED_GPU, detail=f"{request.hardware.gpu.name} has no fp8 tensor cores")]
    share = fp8_flop_fraction(request.model, layout.tp)
    if share < MIN_FP8_FLOP_FRACTION:
        return [Refusal(reason=R.FP8_LAYERS_TOO_SMALL, detail=f"only {share:.0%} of matmul FLOPs are in layers large enough for fp8")]
    return []


def _capability(request: PlanRequest, layout: Layout) -> list[Refusal]:
    can, missing = request.capabilities, []
    if layout.tp > 1 and not can.tensor_parallel:
        missing.append("tensor parallelism")
    if layout.pp > 1 and not can.pipeline_parallel:
        missing.append("pipeline parallelism")
    if layout.cp > 1 and not can.context_parallel:
        missing.append("context parallelism")
    if layout.precision is Precision.FP8 and not can.fp8:
        missing.append("fp8")
    if not missing:
        return []
    return [Refusal(reason=R.RUNTIME_CANNOT_TRAIN, detail="the stage runtime has no " + ", ".join(missing))]


def _fits(request: PlanRequest, layout: Layout) -> bool:
    return estimate_memory(request.model, layout, request.sequence_length, request.hardware.gpu).fits


def _simpler_fits(request: PlanRequest, layout: Layout) -> bool:
    """Whether `layout` fits at one sequence per micro-batch, with or without recomputation: the
    most memory-frugal form of a simpler layout, the one a wasteful dimension is compared with."""
    return any(_fits(request, replace(layout, micro_batch_size=1, checkpointing=c)) for c in Checkpointing)


def _wasteful(request: PlanRequest, layout: Layout) -> list[Refusal]:
    """Dimensions that cost communication when a simpler layout of the same world would fit."""
    hw, found = request.hardware, []
    if layout.pp > 1:
        if _simpler_fits(request, replace(layout, pp=1, dp_shard=layout.dp_shard * layout.pp)):
            found.append(Refusal(reason=R.PIPELINE_WHEN_SHARDING_FITS, detail="sharded data parallelism fits without pipeline stages"))
        microbatches = request.global_batch_sequences // max(1, layout.dp * layout.micro_batch_size)
        if microbatches == 0 or (layout.pp - 1) / microbatches > MAX_PIPELINE_BUBBLE:
            found.append(Refusal(reason=R.PIPELINE_TOO_FEW_MICROBATCHES, detail=f"{microbatches} micro-batches for {layout.pp} stages"))
    if layout.cp > 1 and _simpler_fits(request, replace(layout, cp=1, dp_shard=layout.dp_shard * layout.cp)):
        found.append(Refusal(reason=R.CONTEXT_PARALLEL_WHEN_SEQUENCE_FITS, detail="the sequence fits on one GPU without context parallelism"))
    span = layout.shard_group * layout.tp
    if layout.dp_replicate == 1 and span > hw.gpus_per_node and hw.network.bandwidth < SLOW_INTERCONNECT_BANDWIDTH:
        nodes = span // hw.gpus_per_node
        if span % hw.gpus_per_node == 0 and layout.dp_shard % nodes == 0:
            hybrid = replace(layout, dp_replicate=nodes, dp_shard=layout.dp_shard // nodes)
            if _simpler_fits(request, hybrid):
                found.append(Refusal(reason=R.FULL_SHARD_OVER_SLOW_INTERCONNECT, detail="full sharding across nodes on a slow network where hybrid sharding fits"))
    return found


def refusals_of(request: PlanRequest, layout: Layout) -> tuple[Refusal, ...]:
    """Every reason to refuse `layout` for `request`; empty when the layout is acceptable."""
    found = (_capability(request, layout) + _structural(request, layout) + _tensor_parallel(request, layout)
             + _precision(request, layout))
    memory = estimate_memory(request.model, layout, request.sequence_length, request.hardware.gpu)
    if not memory.fits:
        found.append(Refusal(reason=R.OVER_MEMORY, detail=f"needs {memory.total / 2**30:.1f} GiB of {memory.capacity / 2**30:.1f} GiB per GPU"))
    if not found:
        found = _wasteful(request, layout)
    return tuple(found)


# --- the search -------------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    """The divisors of `n`, ascending, in O(sqrt n) steps: a world of a billion GPUs (the offline
    flags take any count) must not cost a billion trial divisions per stage."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def candidate_layouts(request: PlanRequest) -> list[Layout]:
    """Every layout of the booking's world within the runtime's capabilities."""
    world, can = request.hardware.world_size, request.capabilities
    per_rank = request.global_batch_sequences
    layouts = []
    degrees = [d for d in _POWERS_OF_TWO if world % d == 0]
    precisions = [Precision.BF16, *([Precision.FP8] if can.fp8 else [])]
    for tp, pp, cp in product(*(degrees if able else [1] for able in
                                (can.tensor_parallel, can.pipeline_parallel, can.context_parallel))):
        if world % (tp * pp * cp):
            continue
        rest = world // (tp * pp * cp)
        for replicate in _divisors(rest):
            for precision, checkpointing, micro in product(precisions, Checkpointing, _POWERS_OF_TWO):
                if micro > per_rank:
                    continue
                layouts.append(Layout(dp_replicate=replicate, dp_shard=rest // replicate, tp=tp, pp=pp, cp=cp,
                                      precision=precision, checkpointing=checkpointing, micro_batch_size=micro))
    return layouts


def _complexity(layout: Layout) -> tuple:
    extra = sum(1 for d in (layout.tp, layout.pp, layout.cp) if d > 1)
    return (extra, layout.checkpointing is Checkpointing.FULL, layout.precision is Precision.FP8)


def _evaluate(request: PlanRequest, layout: Layout, *, num_candidates: int, num_refused: int) -> Plan:
    hw = request.hardware
    memory = estimate_memory(request.model, layout, request.sequence_length, hw.gpu)
    step = estimate_step(request.model, layout, sequence_length=request.sequence_length,
                         global_batch_sequences=request.global_batch_sequences, gpu=hw.gpu,
                         network=hw.network, gpus_per_node=hw.gpus_per_node)
    num_steps = math.ceil(request.num_training_tokens / step.tokens_per_step)
    seconds = num_steps * step.step_s
    return Plan(request=request, layout=layout, memory=memory, step=step, num_steps=num_steps, wall_seconds=seconds,
                gpu_hours=gpu_hours(hw.world_size, seconds), cost_cents=cost_cents(hw.world_size, seconds, hw.price_cents_per_gpu_hour),
                num_candidates=num_candidates, num_refused=num_refused)


# Every confirm and train plans its manifest on its booking again (a search over a few hundred
# layouts, 8-14 ms for 8-16 H100s): the request is frozen and the plan a pure function of it.
@functools.lru_cache(maxsize=512)
def plan(request: PlanRequest) -> Plan:
    """The proposed layout if acceptable, else the fastest acceptable candidate (ties: fewer
    parallel dimensions, no recomputation, bf16). Raises PlanRefused (PLAN_REFUSED), which is not
    cached."""
    if request.layout is not None:
        refusals = refusals_of(request, request.layout)
        if refusals:
            raise PlanRefused(refusals, "the proposed layout is refused: " + ", ".join(sorted({r.reason.value for r in refusals})))
        return _evaluate(request, request.layout, num_candidates=1, num_refused=0)
    candidates = candidate_layouts(request)
    verdicts = [(layout, refusals_of(request, layout)) for layout in candidates]
    accepted = [layout for layout, refusals in verdicts if not refusals]
    if not accepted:
        smallest = min(verdicts, key=lambda v: estimate_memory(request.model, v[0], request.sequence_length, request.hardware.gpu).total)
        raise PlanRefused(smallest[1], "no layout of this booking can train this model: " + ", ".join(sorted({r.reason.value for r in smallest[1]})))
    plans = [_evaluate(request, layout, num_candidates=len(candidates), num_refused=len(candidates) - len(accepted)) for layout in accepted]
    return min(plans, key=lambda p: (round(p.step.step_s, 9), _complexity(p.layout), -p.layout.micro_batch_size))
