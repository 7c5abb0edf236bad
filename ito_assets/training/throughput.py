"""Step time and MFU of a layout: compute at an assumed matmul efficiency, communication over the
links each parallel dimension uses, and the pipeline bubble.

An analytical model, not a measurement: its assumed constants are stated here and compared
with measured figures by benchmarks/gpu_proxy150m.py. MFU is model FLOPs (6 N + 12 L D T per
token, `model_config.flops_per_token`) over the bf16 dense peak of the GPUs, the PaLM convention.
"""

from __future__ import annotations

from dataclasses import dataclass

from ito_assets.training.hardware import GpuSpec, NetworkSpec
from ito_assets.training.layout import Checkpointing, Layout, Precision
from ito_assets.training.memory import rank_parameter_count
from ito_assets.training.model_config import ModelConfig, flops_per_token, matmul_parameter_count

# Fraction of the bf16 peak a well-compiled transformer step reaches when the matmuls are large:
# 0.5, the upper end of published large-run MFU (PaLM 46%, Llama 3 38-43% on H100, torchtitan
# Llama 3 8B with torch.compile ~40%); smaller hidden sizes reach less, h / (h + 512) of it, since
# matmuls narrower than a few thousand columns fill fewer tensor-core waves (NVIDIA "Matrix
# Multiplication Background" guide, tile and wave quantization). Assumed; see the benchmark.
PEAK_MATMUL_EFFICIENCY = 0.5
EFFICIENCY_HALF_WIDTH = 512
# fp8 speed-up of the converted matmuls: 1.3x, inside torchao float8's reported 1.2-1.5x
# end-to-end training speed-ups on H100 (pytorch/ao, torchao/float8 README).
FP8_MATMUL_SPEEDUP = 1.3


@dataclass(frozen=True, kw_only=True)
class StepEstimate:
    compute_s: float
    tensor_parallel_s: float
    exposed_data_parallel_s: float
    bubble_fraction: float
    step_s: float
    tokens_per_step: int
    mfu: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.step_s

    def to_dict(self) -> dict:
        return {**{k: round(v, 6) if isinstance(v, float) else v for k, v in vars(self).items()},
                "tokens_per_second": round(self.tokens_per_second, 1)}


def matmul_efficiency(config: ModelConfig) -> float:
    return PEAK_MATMUL_EFFICIENCY * config.d_model / (config.d_model + EFFICIENCY_HALF_WIDTH)


def fp8_eligible(out_features: int, in_features: int) -> bool:
    """torchao's auto-filter for tensorwise float8 (`_auto_filter_for_tensorwise`): dimensions
    multiples of 16, and not both out <= 4096 and in <= 1024 (smaller layers ran slower on H100)."""
    if out_features % 16 or in_features % 16:
        return False
    return not (out_features <= 4096 and in_features <= 1024)


def fp8_flop_fraction(config: ModelConfig, tp: int = 1) -> float:
    """Share of matmul FLOPs in linear layers that float8 would convert (tp-local shapes)."""
    d, kv, f = config.d_model, config.kv_heads * config.head_dim, config.d_ff
    shapes = [(d // tp, d), (kv // tp, d), (kv // tp, d), (d, d // tp), (f // tp, d), (d, f // tp)]
    if config.mlp == "swiglu":
        shapes.append((f // tp, d))
    total = sum(o * i for o, i in shapes) * config.num_layers + config.vocab_size * d  # the head is whole on every rank
    converted = sum(o * i for o, i in shapes if fp8_eligible(o, i)) * config.num_layers
    return converted / total


def _compute_seconds(config: ModelConfig, layout: Layout, sequence_length: int, tokens: int, gpu: GpuSpec) -> float:
    per_gpu = flops_per_token(config, sequence_length) * tokens / layout.world_size
    # Every tensor-parallel rank runs the whole output head on the whole sequence: tp - 1 copies more.
    per_gpu += 6 * config.vocab_size * config.d_model * (layout.tp - 1) * tokens / layout.world_size
    if layout.checkpointing is Checkpointing.FULL:
        # One more forward of the layers: 2 N_layers + 4 L D T more per token (Korthikanti et al.).
        layers = matmul_parameter_count(config) - config.vocab_size * config.d_model
        per_gpu += (2 * layers + 4 * config.num_layers * config.d_model * sequence_length) * tokens / layout.world_size
    seconds = per_gpu / (gpu.peak_bf16_flops * matmul_efficiency(config))
    if layout.precision is Precision.FP8:
        share = fp8_flop_fraction(config, layout.tp)
        seconds *= (1 - share) + share / FP8_MATMUL_SPEEDUP
    return seconds


def ring_seconds(volume_bytes: float, group: int, bandwidth: float) -> float:
    """A ring collective moves (n - 1) / n of the buffer over each rank's link."""
    return 0.0 if group <= 1 else volume_bytes * (group - 1) / group / bandwidth


def _tensor_parallel_seconds(config: ModelConfig, layout: Layout, sequence_length: int, num_microbatches: int, gpu: GpuSpec) -> float:
    # Per layer: two all-gather/reduce-scatter pairs forward and two backward over bf16 s b h
    # (Korthikanti et al. 2022, section 4.2.2); not overlapped with compute here.
    tokens = layout.micro_batch_size * sequence_length // layout.cp
    per_layer = 4 * 2 * tokens * config.d_model * 2
    layers = -(-config.num_layers // layout.pp)
    return ring_seconds(per_layer * layers * num_microbatches, layout.tp, gpu.intra_node_bandwidth)


def _data_parallel_seconds(config: ModelConfig, layout: Layout, num_microbatches: int, gpu: GpuSpec, network: NetworkSpec, gpus_per_node: int) -> float:
    """FSDP: bf16 all-gather forward and backward (2 + 2 bytes) and an fp32 reduce-scatter (4) per
    micro-batch; HSDP replicas: an fp32 all-reduce (2 x 4 bytes) of the shard per step."""
    params = rank_parameter_count(config, layout)
    shard_span = layout.shard_group * layout.tp
    shard_link = gpu.intra_node_bandwidth if shard_span <= gpus_per_node else min(network.bandwidth, gpu.intra_node_bandwidth)
    replica_link = gpu.intra_node_bandwidth if shard_span * layout.dp_replicate <= gpus_per_node else network.bandwidth
    fsdp = ring_seconds(8 * params * num_microbatches, layout.shard_group, shard_link)
    replicate = ring_seconds(8 * params / layout.shard_group, layout.dp_replicate, replica_link)
    return fsdp + replicate


def estimate_step(
    config: ModelConfig, layout: Layout, *, sequence_length: int, global_batch_sequences: int,
    gpu: GpuSpec, network: NetworkSpec, gpus_per_node: int,
) -> StepEstimate:
    tokens = global_batch_sequences * sequence_length
    num_microbatches = max(1, global_batch_sequences // (layout.dp * layout.micro_batch_size))
    compute = _compute_seconds(config, layout, sequence_length, tokens, gpu)
    tensor = _tensor_parallel_seconds(config, layout, sequence_length, num_microbatches, gpu)
    # FSDP prefetch and HSDP all-reduce overlap with compute; only the excess is exposed.
    exposed = max(0.0, _data_parallel_seconds(config, layout, num_microbatches, gpu, network, gpus_per_node) - compute)
    # 1F1B bubble: (p - 1) / m of the ideal time (Narayanan et al. 2021, section 2.2).
    bubble = (layout.pp - 1) / num_microbatches
    step = (compute + tensor) * (1 + bubble) + exposed
    model_flops = flops_per_token(config, sequence_length) * tokens
    return StepEstimate(
        compute_s=compute, tensor_parallel_s=tensor, exposed_data_parallel_s=exposed, bubble_fraction=bubble,
        step_s=step, tokens_per_step=tokens, mfu=model_flops / (layout.world_size * gpu.peak_bf16_flops * step),
    )

