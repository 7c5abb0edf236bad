"""The worker's process groups, launched by `torch.distributed.run`: gloo on CPU, nccl on GPU,
and the data-parallel wrapper the plan's layout asks for (DDP, or FSDP2 over the plan's mesh from
`ito_assets.training.mesh`).

Two groups: the default one for the training step's collectives and a separate gloo group for
checkpoint saves (see `checkpoint.py`). A stop request (SIGTERM from torchrun, forwarded from the
supervisor or from Dagster) is agreed by all ranks at the step boundary, so that every rank flushes
the same checkpoint instead of one rank waiting in a collective the other never joins.
"""

from __future__ import annotations

import datetime
import os
import signal
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ito_assets.runtime.stage.config import DataParallel
from ito_assets.training.layout import Layout
from ito_assets.training.mesh import build_device_mesh, parallelize


@dataclass(frozen=True, kw_only=True)
class Distributed:
    rank: int
    world_size: int
    device: torch.device
    checkpoint_group: dist.ProcessGroup | None


def init(collective_timeout_s: float) -> Distributed:
    """Join the group that torchrun's environment describes (RANK, WORLD_SIZE, MASTER_ADDR...)."""
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=collective_timeout_s)
    dist.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=timeout)
    checkpoint_group = dist.new_group(backend="gloo", timeout=timeout)
    return Distributed(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device,
                       checkpoint_group=checkpoint_group)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class StopFlag:
    """Set by SIGTERM/SIGINT; `agreed()` is true on every rank once any rank has it set."""

    def __init__(self, device: torch.device):
        self.device = device
        self.requested = False
        self.signal_number: int | None = None
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self._handle)

    def _handle(self, number: int, frame) -> None:
        self.requested = True
        self.signal_number = number

    def agreed(self) -> bool:
        flag = torch.tensor([1 if self.requested else 0], device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


class LossModule(nn.Module):
    """Puts the model's loss behind `forward`, so that DDP's hooks see the forward pass."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.model.loss(tokens, targets)


def data_parallel(model: nn.Module, strategy: DataParallel, world_size: int, device: torch.device) -> nn.Module:
    """The module the training step calls, `(tokens, targets) -> loss`, for `strategy` over the
    default group; one rank needs no wrapper. Build the optimizer after this: FSDP2 replaces the
    parameters with sharded DTensors."""
    wrapped = LossModule(model)
    if world_size == 1:
        return wrapped
    if strategy is DataParallel.FSDP2:
        shard(model, world_size, device)
        return wrapped
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(wrapped, device_ids=ids)


def shard(model: nn.Module, world_size: int, device: torch.device) -> None:
    """FSDP2 (`fully_shard`) over all ranks: the plan's mesh for a layout that only shards (1-D,
    dp_shard), each block its own unit (its parameters are gathered just before its forward and
    freed after, torchtitan's wrapping), then the root, which holds the embedding and the output
    head (tied weights must share a unit). Parameters stay fp32: the bit-exact resume is defined at
    full precision."""
    layout = Layout(dp_shard=world_size)
    parallelize(model, build_device_mesh(layout, device.type), layout)
