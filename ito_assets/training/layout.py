"""A parallel layout (degrees, precision, activation checkpointing, micro-batch) and the stable
reasons a layout is refused.

Degrees follow torchtitan's ParallelDims: the world is pp x dp_replicate x dp_shard x cp x tp, in
that order from the outermost mesh dimension to the innermost, so tensor-parallel ranks are
neighbours on one node and pipeline stages are the farthest apart.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ito_assets.errors import ErrorCode, ItoError


class Precision(str, enum.Enum):
    BF16 = "bf16"
    FP8 = "fp8"  # fp8 matmuls (torchao float8, tensorwise scaling) with bf16 everywhere else
    # Full precision: the worker's exactness tests and debugging. The price model is of bf16
    # matmuls, so the planner neither proposes nor accepts it.
    FP32 = "fp32"


class Checkpointing(str, enum.Enum):
    # Korthikanti et al. (2022)'s "selective" recomputation removes the attention-score activations;
    # fused attention (FlashAttention, Dao et al. 2022) never stores them, so "none" here is their
    # selective case, and "full" keeps only each layer's input.
    NONE = "none"
    FULL = "full"


MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass(frozen=True, kw_only=True)
class Layout:
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    precision: Precision = Precision.BF16
    checkpointing: Checkpointing = Checkpointing.NONE
    micro_batch_size: int = 1  # sequences per GPU per forward/backward
    # Regional torch.compile of the transformer blocks: the price model's matmul efficiency is a
    # compiled step's, so every plan asks for it; the worker records why it ran eager if it did.
    compile: bool = True

    def __post_init__(self) -> None:
        for name in (*MESH_DIMS, "micro_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer")
        object.__setattr__(self, "precision", Precision(self.precision))
        object.__setattr__(self, "checkpointing", Checkpointing(self.checkpointing))
        if not isinstance(self.compile, bool):
            raise ValueError("compile must be a boolean")

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        """Ranks that see different sequences."""
        return self.dp_replicate * self.dp_shard

    @property
    def shard_group(self) -> int:
        """Ranks over which FSDP shards parameters, gradients and optimizer state (dp_shard x cp,
        as torchtitan's `dp_shard_cp` mesh)."""
        return self.dp_shard * self.cp

    def degrees(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in MESH_DIMS}

    def describe(self) -> dict:
        return {**self.degrees(), "precision": self.precision.value, "checkpointing": self.checkpointing.value,
                "micro_batch_size": self.micro_batch_size, "compile": self.compile}

    @classmethod
    def from_dict(cls, body: dict) -> "Layout":
        """The inverse of `describe` (a plan's or a worker config's JSON)."""
        return cls(**body)


class RefusalReason(str, enum.Enum):
    """Stable reasons (never renamed): why a layout is wasteful or impossible."""

    DEGREES_NOT_WORLD_SIZE = "DEGREES_NOT_WORLD_SIZE"
    BATCH_INDIVISIBLE = "BATCH_INDIVISIBLE"
    TENSOR_PARALLEL_INDIVISIBLE = "TENSOR_PARALLEL_INDIVISIBLE"
    TENSOR_PARALLEL_ACROSS_NODES = "TENSOR_PARALLEL_ACROSS_NODES"
    TENSOR_PARALLEL_OVER_ETHERNET = "TENSOR_PARALLEL_OVER_ETHERNET"
    TENSOR_PARALLEL_WITHOUT_NVLINK = "TENSOR_PARALLEL_WITHOUT_NVLINK"
    PIPELINE_STAGES_INDIVISIBLE = "PIPELINE_STAGES_INDIVISIBLE"
    PIPELINE_WHEN_SHARDING_FITS = "PIPELINE_WHEN_SHARDING_FITS"
    PIPELINE_TOO_FEW_MICROBATCHES = "PIPELINE_TOO_FEW_MICROBATCHES"
    CONTEXT_PARALLEL_WHEN_SEQUENCE_FITS = "CONTEXT_PARALLEL_WHEN_SEQUENCE_FITS"
    CONTEXT_PARALLEL_INDIVISIBLE = "CONTEXT_PARALLEL_INDIVISIBLE"
    FP8_UNSUPPORTED_GPU = "FP8_UNSUPPORTED_GPU"
    FP8_LAYERS_TOO_SMALL = "FP8_LAYERS_TOO_SMALL"
    FP32_NOT_PRICED = "FP32_NOT_PRICED"
    FULL_SHARD_OVER_SLOW_INTERCONNECT = "FULL_SHARD_OVER_SLOW_INTERCONNECT"
    OVER_MEMORY = "OVER_MEMORY"
    UNKNOWN_MODEL_SIZE = "UNKNOWN_MODEL_SIZE"
    RUNTIME_CANNOT_TRAIN = "RUNTIME_CANNOT_TRAIN"


@dataclass(frozen=True, kw_only=True)
class Refusal:
    reason: RefusalReason
    detail: str

    def to_dict(self) -> dict:
        return {"reason": self.reason.value, "detail": self.detail}


class PlanRefused(ItoError):
    """PLAN_REFUSED with the stable reasons that refused the layout (or every candidate)."""

    def __init__(self, refusals: tuple[Refusal, ...], message: str):
        super().__init__(ErrorCode.PLAN_REFUSED, message)
        self.refusals = refusals

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(sorted({r.reason.value for r in self.refusals}))

    def to_dict(self) -> dict:
        return {**super().to_dict(), "reasons": list(self.reasons)}
