"""One optimizer step of the worker: `ito_assets.training.trainer.train_step` with the layout's
micro-batches, precision and parallel wrapper (`execution.Execution`: DDP, FSDP2 or tensor
parallelism, whose hooks all-reduce or reduce-scatter the gradients), a hook before
the weights change (the checkpoint's staging copy), an optional reduction of the gradients across
replica groups (torchft, `replica_sync`), and the loss averaged over ranks for reporting and spike
detection."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from ito_assets.runtime.worker.batches import IGNORE
from ito_assets.runtime.worker.execution import Execution
from ito_assets.training.trainer import TrainConfig, learning_rate_at


@dataclass(frozen=True, kw_only=True)
class StepResult:
    step: int  # 1-based: the number of optimizer steps taken after this one
    position: int  # the data-loader position of its global batch
    loss: float  # mean over ranks
    grad_norm: float  # of the all-reduced gradient, before clipping
    learning_rate: float
    seconds: float
    # False: replica groups whose quorum did not commit the step (a peer failed mid-step); the
    # weights did not change and `step` is the step reached (a healed group's may have jumped).
    committed: bool = True
    # False: the loss or the gradient norm was not finite; the update was dropped, not applied.
    applied: bool = True
    metrics: dict[str, float] = field(default_factory=dict)  # the objective's own (DPO's accuracy, margin)


def train_step(execution: Execution, model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor, step: int, config: TrainConfig,
               before_update: Callable[[], object] | None = None,
               reduce_gradients: Callable[[], object] | None = None,
               count_targets: bool = False, beside: torch.Tensor | None = None) -> tuple[float, float, float, bool]:
    """Returns (loss averaged over the group's ranks, gradient norm, learning rate, applied) for
    1-based `step`; not applied when the loss or the gradient norm is not finite (every rank
    agrees: both are reduced over the ranks), so that a NaN never reaches the weights. The rank's
    rows run as micro-batches of the layout's size; each one's loss is scaled by 1 / (number of
    micro-batches), so that the accumulated gradient is the whole batch's, and gradients are
    reduced across ranks on the last one only. `before_update` runs after the
    backward passes, before the weights change (a checkpoint's staging copy may still be reading
    them until then); `reduce_gradients` after it, before clipping, so that every replica group
    clips the same averaged gradient. `count_targets` (rows whose targets may be -100, every rank
    alike): each micro-batch weighs by its number of targets instead, so that the step's loss and
    gradient are the mean over every target of the global batch, however the ranks' shares differ.
    `beside`: a value per row that the objective reads with it (DPO's reference log-probabilities),
    split into the same micro-batches."""
    lr = learning_rate_at(step - 1, config)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    micro = execution.layout.micro_batch_size
    if x.shape[0] % micro:
        raise ValueError(f"{x.shape[0]} rows do not split into micro-batches of {micro}")
    pieces = list(zip(x.split(micro), y.split(micro)))
    extras = [()] * len(pieces) if beside is None else [(b,) for b in beside.split(micro)]
    divisors = target_divisors([targets for _, targets in pieces]) if count_targets else [len(pieces)] * len(pieces)
    total = torch.zeros((), device=x.device)
    for index, (tokens, targets) in enumerate(pieces):
        with execution.gradient_sync(index == len(pieces) - 1):
            with execution.autocast():
                loss = execution.parallel(tokens, targets, *extras[index]) / divisors[index]
            loss.backward()
        total += loss.detach().float()
    if before_update is not None:
        before_update()
    if reduce_gradients is not None:
        reduce_gradients()
    grad_norm = clip_gradients(model, config.grad_clip)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)  # gloo has no AVG
        total /= dist.get_world_size()
    applied = math.isfinite(float(total)) and math.isfinite(grad_norm)
    if not applied:
        # No gradient, no update: AdamW leaves a parameter without one untouched (no decay, no
        # moment), and torchft's optimizer still takes part in its quorum's commit.
        optimizer.zero_grad(set_to_none=True)
    optimizer.step()
    return float(total), grad_norm, lr, applied


def target_divisors(pieces: list[torch.Tensor]) -> list[float]:
    """What each micro-batch's mean loss is divided by for a gradient that is the mean over the
    global batch's targets: N / (n * W), with n its own targets, N those of every rank, and W the
    ranks, since the data-parallel wrappers average gradients over ranks. Tensor-parallel peers
    hold the same rows: they count N and W alike, so the ratio holds. (Equal windows give W * k * n
    / (n * W) = k micro-batches: the windows' divisor.)"""
    counts = [int((targets != IGNORE).sum()) for targets in pieces]
    total, world = torch.tensor(sum(counts), dtype=torch.int64, device=pieces[0].device), 1
    if dist.is_initialized() and dist.get_world_size() > 1:
        world = dist.get_world_size()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    # Every rank reaches the all-reduce above. A micro-batch without a target (the loader refuses
    # such rows) averages nothing: its NaN loss makes the step non-finite on every rank, and the
    # step is dropped as any non-finite one is, rather than one rank raising while the others wait.
    return [int(total) / (max(count, 1) * world) for count in counts]


def clip_gradients(model: nn.Module, max_norm: float) -> float:
    """`clip_grad_norm_` over parameters that live on different meshes (tensor-parallel blocks
    beside replicated norms and embeddings, or FSDP2 shards beside plain tensors): each mesh's
    norm is reduced over its ranks, then combined. Returns the norm before clipping."""
    groups: dict[object, list[torch.Tensor]] = {}
    for parameter in model.parameters():
        if parameter.grad is not None:
            mesh = parameter.grad.device_mesh if isinstance(parameter.grad, DTensor) else None
            groups.setdefault(mesh, []).append(parameter.grad)
    squares = []
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        squares.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).float() ** 2)
    if not squares:
        return 0.0
    total = float(torch.stack(squares).sum().sqrt())
    coefficient = max_norm / (total + 1e-6)  # clip_grad_norm_'s epsilon
    if coefficient < 1.0:
        for grads in groups.values():
            torch._foreach_mul_(grads, coefficient)
    return total
