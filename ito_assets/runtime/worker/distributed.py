"""The worker's process groups, launched by `torch.distributed.run` or alone as a world of one:
gloo on CPU, nccl on GPU (the layout's mesh and wrappers are `execution.py`'s).

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


@dataclass(frozen=True, kw_only=True)
class Distributed:
    rank: int
    world_size: int
    device: torch.device
    checkpoint_group: dist.ProcessGroup | None


def init(collective_timeout_s: float) -> Distributed:
    """Join the group that torchrun's environment describes (RANK, WORLD_SIZE, MASTER_ADDR...), or,
    started without one, be the only rank of a world of one (`launch.local` starts one rank so)."""
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=collective_timeout_s)
    backend = "nccl" if use_cuda else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend=backend, timeout=timeout)
    else:
        dist.init_process_group(backend=backend, timeout=timeout, store=_host_own_store(timeout), rank=0, world_size=1)
    checkpoint_group = dist.new_group(backend="gloo", timeout=timeout)
    return Distributed(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device,
                       checkpoint_group=checkpoint_group)


def _host_own_store(timeout: datetime.timedelta) -> dist.TCPStore:
    """The rendezvous store torchrun's agent would host, on a free loopback port, and the
    environment torchrun would set: a replica group's torchft manager finds the store by it."""
    store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=timeout)
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port))
    return store


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
