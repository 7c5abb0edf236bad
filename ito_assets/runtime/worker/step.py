"""One data-parallel optimizer step: `ito_assets.training.trainer.train_step` with the forward pass
routed through DDP or FSDP2 (whose hooks all-reduce or reduce-scatter the gradients), a hook before
the weights change (the checkpoint's staging copy), an optional reduction of the gradients across
replica groups (torchft, `replica_sync`), and the loss averaged over ranks for reporting and spike
detection."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

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


def train_step(parallel: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor, step: int, config: TrainConfig,
               before_update: Callable[[], object] | None = None,
               reduce_gradients: Callable[[], object] | None = None) -> tuple[float, float, float]:
    """Returns (loss averaged over the group's ranks, gradient norm, learning rate) for 1-based
    `step`. `before_update` runs after the backward pass, before the weights change (a
    checkpoint's staging copy may still be reading them until then); `reduce_gradients` after it,
    before clipping, so that every replica group clips the same averaged gradient."""
    lr = learning_rate_at(step - 1, config)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss = parallel(x, y)
    loss.backward()
    if before_update is not None:
        before_update()
    if reduce_gradients is not None:
        reduce_gradients()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    if isinstance(grad_norm, DTensor):  # FSDP2: the norm of sharded gradients, reduced over ranks
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    reported = loss.detach().clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(reported, op=dist.ReduceOp.SUM)  # gloo has no AVG
        reported /= dist.get_world_size()
    return float(reported), float(grad_norm), lr
