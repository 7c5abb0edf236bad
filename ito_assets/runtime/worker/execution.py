"""How one worker executes its stage's layout: every field of it applied to the model, and every
field it could not apply named with its reason.

    degrees        tensor parallelism and FSDP2 (HSDP over replicate x shard) through the plan's
                   mesh (`ito_assets.training.mesh`); DDP where the layout only replicates
    precision      bf16: FSDP2's MixedPrecisionPolicy (bf16 parameters in the forward and backward,
                   fp32 gradient reduction, fp32 master weights and AdamW state), else autocast,
                   on CPU as on GPU; fp32 runs as it is
    checkpointing  "full": each block keeps only its input for the backward pass (`Block.recompute`)
    compile        each block's residual compiled (regional torch.compile); a toolchain that
                   cannot compile (no C compiler, no Triton) runs eager, agreed by every rank
    micro-batch    the step's rows split into micro-batches whose gradients accumulate, synced
                   only on the last (`step.train_step`)

Build the optimizer after `prepare`: FSDP2 replaces the parameters with sharded DTensors.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

from ito_assets.runtime.stage.fitting import Fallback, changes, per_group
from ito_assets.training.layout import Checkpointing, Layout, Precision
from ito_assets.training.mesh import build_device_mesh, parallelize
from ito_assets.training.model import DecoderLM


class LossModule(nn.Module):
    """Puts the model's loss behind `forward`, so that DDP's hooks see the forward pass."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.model.loss(tokens, targets)


@dataclass(frozen=True, kw_only=True)
class Execution:
    layout: Layout  # what runs: the worker config's layout after this device's fallbacks
    fallbacks: tuple[Fallback, ...]  # the fitting's and this device's, in that order
    parallel: nn.Module  # (tokens, targets[, reference]) -> loss: the objective under its parallel wrapper
    sharded: bool  # under FSDP2
    device_type: str

    def describe(self) -> dict:
        return {"ran": self.layout.describe(), "fallbacks": [f.to_dict() for f in self.fallbacks]}

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast where FSDP2's policy does not already cast the parameters."""
        if self.layout.precision is Precision.FP32 or self.sharded:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=torch.bfloat16)

    def gradient_sync(self, enabled: bool) -> contextlib.AbstractContextManager:
        """Around one micro-batch's forward and backward: reduce its gradients only when `enabled`."""
        if isinstance(self.parallel, nn.parallel.DistributedDataParallel):
            return contextlib.nullcontext() if enabled else self.parallel.no_sync()
        if self.sharded:
            self.parallel.model.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()


def device_fallbacks(layout: Layout, device: torch.device) -> tuple[Layout, list[Fallback]]:
    """What this device cannot run: fp8 (no conversion in the worker yet), bf16 on a GPU without it."""
    ran = layout
    if ran.precision is Precision.FP8:
        ran = replace(ran, precision=Precision.BF16)
        found = changes(layout, ran, "the worker has no fp8 conversion; bf16 instead", ("precision",))
    else:
        found = []
    if ran.precision is Precision.BF16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        before, ran = ran, replace(ran, precision=Precision.FP32)
        found += changes(before, ran, f"{torch.cuda.get_device_name(device)} has no bf16", ("precision",))
    return ran, found


def native_cpu_bf16() -> bool:
    """Whether this host's CPU computes bf16 natively (AVX512-BF16 or AMX tiles), where autocast
    runs bf16 matmuls at speed rather than emulating them. torch's probes are private (torch.cpu,
    as inductor uses them); a torch without them reads as no."""
    probes = (getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None))
    return any(probe is not None and bool(probe()) for probe in probes)


def compile_problem(device: torch.device) -> str | None:
    """Why torch.compile cannot run here (None when it can): one small block compiled and
    differentiated, outside any collective, so that a failing toolchain is found before training."""
    from ito_assets.training.model_config import ModelConfig

    probe = DecoderLM(ModelConfig(name="compile-probe", vocab_size=16, num_layers=1, d_model=16, num_heads=2,
                                  d_ff=32, max_seq_len=8)).to(device)
    block = probe.blocks[0]
    x = torch.randn(1, 8, 16, device=device, requires_grad=True)
    try:
        torch.compile(block.residual)(x, probe.rope_cos[:8], probe.rope_sin[:8]).sum().backward()
    except Exception as error:  # noqa: BLE001 - any failure of the toolchain means eager
        return f"torch.compile failed on this host: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    finally:
        torch._dynamo.reset()
    return None


def _agree(problem: str | None, device: torch.device) -> str | None:
    """Every rank compiles or none does: a rank's failure turns compile off on all of them."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return problem
    failed = torch.tensor([0 if problem is None else 1], device=device)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    return problem or ("torch.compile failed on another rank" if failed.item() else None)


def prepare(model: DecoderLM, layout: Layout, fitted: tuple[Fallback, ...], *, device: torch.device,
            world_size: int, replica_groups: int = 1, objective: nn.Module | None = None) -> Execution:
    """Apply `layout` (the attempt's, over every replica group) to `model` in place; this process
    group is one replica group of `world_size` ranks. `objective`: a module around `model` whose
    forward is the loss (DPO's `preference.Preference`); None: next-token loss (`LossModule`)."""
    ran, found = device_fallbacks(layout, device)
    if ran.compile:
        problem = _agree(compile_problem(device), device)
        if problem is not None:
            before, ran = ran, replace(ran, compile=False)
            found += changes(before, ran, problem, ("compile",))
    for block in model.blocks:
        block.recompute = ran.checkpointing is Checkpointing.FULL
        if ran.compile:
            block.body = torch.compile(block.residual)
    group = per_group(ran, replica_groups)
    if group.world_size != world_size:
        raise ValueError(f"the layout's degrees multiply to {group.world_size} per group, this group has {world_size} ranks")
    parallel = LossModule(model) if objective is None else objective
    if world_size > 1 and group.tp == 1 and group.dp_shard == 1:
        ids = [device.index] if device.type == "cuda" else None
        parallel = nn.parallel.DistributedDataParallel(parallel, device_ids=ids)
    elif world_size > 1:
        policy = (MixedPrecisionPolicy() if ran.precision is Precision.FP32 else
                  MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
        parallelize(model, build_device_mesh(group, device.type), group, policy)
    return Execution(layout=ran, fallbacks=(*fitted, *found), parallel=parallel,
                     sharded=isinstance(model, FSDPModule), device_type=device.type)
