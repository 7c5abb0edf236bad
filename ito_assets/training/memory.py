"""Memory per GPU of a layout: model states, parameters in flight, activations, logits, reserve.

- Model states: 16 bytes per parameter for mixed-precision Adam (ZeRO, Rajbhandari et al. 2020,
  section 3.1: fp32 master weights 4 + Adam moments 8, with 2 + 2 for the half-precision copy and
  gradient; FSDP2 keeps fp32 sharded parameters and fp32 gradients instead: 4 + 4 + 8 = 16),
  sharded over dp_shard x cp, one pipeline stage's share; the blocks' linear weights split by tp,
  the norms, the embedding and the head not (the runtime keeps them whole on every tensor-parallel
  rank).
- Parameters in flight: FSDP all-gathers one layer ahead, so two layers are unsharded at a time,
  each as a bf16 parameter (2 bytes) and an fp32 gradient before its reduce-scatter (4 bytes).
  Together with the states this is the "16-18 bytes per parameter" of the issue.
- Activations per layer and micro-batch, in bytes, after Korthikanti et al. (2022, section 4.1):
  attention block 11 s b h, two norms' inputs 4 s b h, MLP input 2 s b h plus, for GELU,
  4 s b f + s b h (f = 4h gives the paper's 19 s b h, and 34 s b h per layer in all), for SwiGLU
  8 s b f (gate, up, SiLU output, product). The 5 a s^2 b score term is absent: fused attention
  never stores the scores. Tensor + sequence parallelism divides all of it by t; context
  parallelism divides s by cp; full recomputation keeps 2 s b h (the layer input) per layer plus
  one layer recomputed. With 1F1B pipelining the first stage holds p micro-batches of L/p layers:
  L layers' worth in all (Korthikanti et al. 2022, section 4.2.3).
- Logits: s b V elements at 10 bytes (bf16 output 2, fp32 upcast 4, fp32 log-softmax kept for the
  backward 4) on the last stage, split by cp; every tensor-parallel rank computes all of them (the
  last block gives the whole sequence back to the whole head: no loss parallelism).
- Reserve: 2 GiB for the CUDA context, NCCL buffers and the allocator's slack, and 5% of the
  device for fragmentation: our margin, to be checked by benchmarks/gpu_proxy150m.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ito_assets.training.hardware import GIB, GpuSpec
from ito_assets.training.layout import Checkpointing, Layout
from ito_assets.training.model_config import ModelConfig, layer_parameter_count

BYTES_PER_PARAMETER_STATES = 16
BYTES_PER_PARAMETER_IN_FLIGHT = 2 + 4
LAYERS_IN_FLIGHT = 2
BYTES_PER_LOGIT = 10
FIXED_RESERVE_BYTES = 2 * GIB
FRAGMENTATION_FRACTION = 0.05


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    model_states: int
    parameters_in_flight: int
    activations: int
    logits: int
    reserve: int
    capacity: int

    @property
    def total(self) -> int:
        return self.model_states + self.parameters_in_flight + self.activations + self.logits + self.reserve

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def to_dict(self) -> dict:
        gib = {k: round(v / GIB, 3) for k, v in vars(self).items()}
        return {**{f"{k}_gib": v for k, v in gib.items()}, "total_gib": round(self.total / GIB, 3), "fits": self.fits}


def stage_parameter_count(config: ModelConfig, pp: int) -> int:
    """Parameters on the heaviest pipeline stage: L/pp layers plus one embedding-sized matrix
    (the input embedding on the first stage, the head on the last); everything when pp == 1."""
    layers = -(-config.num_layers // pp) * layer_parameter_count(config)
    embedding = config.vocab_size * config.d_model
    if pp == 1:
        return layers + embedding * (1 if config.tie_embeddings else 2) + config.d_model
    return layers + embedding + config.d_model


def rank_parameter_count(config: ModelConfig, layout: Layout) -> int:
    """Parameters a tensor-parallel rank holds of its pipeline stage, before data-parallel
    sharding: the blocks' linear weights split over tp; their norm gains (sequence parallel), the
    embedding, the head and the final norm whole on every tensor-parallel rank, as the runtime
    runs them."""
    split = -(-config.num_layers // layout.pp) * (layer_parameter_count(config) - 2 * config.d_model)
    return split // layout.tp + stage_parameter_count(config, layout.pp) - split


def layer_activation_bytes(config: ModelConfig, tokens: int) -> int:
    """Bytes one layer keeps for the backward, for `tokens` = s x b tokens on one GPU."""
    h, f = config.d_model, config.d_ff
    mlp = 8 * f if config.mlp == "swiglu" else 4 * f + h
    return tokens * (11 * h + 4 * h + 2 * h + mlp)


def activation_bytes(config: ModelConfig, layout: Layout, sequence_length: int) -> int:
    tokens = layout.micro_batch_size * -(-sequence_length // layout.cp)
    per_layer = layer_activation_bytes(config, tokens) // layout.tp
    if layout.checkpointing is Checkpointing.FULL:
        kept = config.num_layers * 2 * tokens * config.d_model // layout.tp
        return kept + per_layer
    return config.num_layers * per_layer


def estimate_memory(config: ModelConfig, layout: Layout, sequence_length: int, gpu: GpuSpec) -> MemoryEstimate:
    states = BYTES_PER_PARAMETER_STATES * rank_parameter_count(config, layout) // layout.shard_group
    in_flight = 0
    if layout.shard_group > 1:
        in_flight = LAYERS_IN_FLIGHT * BYTES_PER_PARAMETER_IN_FLIGHT * layer_parameter_count(config) // layout.tp
    tokens = layout.micro_batch_size * -(-sequence_length // layout.cp)
    return MemoryEstimate(
        model_states=states,
        parameters_in_flight=in_flight,
        activations=activation_bytes(config, layout, sequence_length),
        logits=BYTES_PER_LOGIT * tokens * config.vocab_size,
        reserve=FIXED_RESERVE_BYTES + int(FRAGMENTATION_FRACTION * gpu.memory_bytes),
        capacity=gpu.memory_bytes,
    )
