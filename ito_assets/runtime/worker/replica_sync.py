"""A worker's side of torchft replica groups (`replicas.py` runs the groups).

Every step, after the group's own backward pass (DDP or FSDP2 inside the group, unchanged), the
gradients are averaged across the groups in the quorum with `Manager.allreduce`, and the step is
committed only if every group in the quorum agrees (`torchft.Optimizer`: `zero_grad` starts the
quorum, `step` asks `should_commit`). torchft's own `DistributedDataParallel` is not used: with
torch 2.13 its communication hook asserts in the surviving group when a peer dies, where
`Manager.allreduce` reports the error and lets the survivor go on alone.

A group that joins behind the quorum's step (restarted, or resumed from an older checkpoint) heals:
torchft fetches the state of an up-to-date peer (model, optimizer, step, data position) and loads
it before the step commits; the healing group's own gradients are zeroed that step, so every
group applies the same averaged gradient to the same weights and stays identical afterwards.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map

from ito_assets.runtime.supervision import heartbeat
from ito_assets.runtime.worker.batches import ResumableBatches
from ito_assets.runtime.stage.config import WorkerConfig
from ito_assets.training.trainer import TrainConfig, learning_rate_at

# How often a group about to join looks whether its peers' workers are loaded (a listing of each
# peer's heartbeat folder, on storage the groups share).
PEER_POLL_S = 0.25
# Gradients travel in buckets of at most this many bytes: DDP's default `bucket_cap_mb` (25 MiB),
# few collectives per step without a second copy of all gradients at once.
BUCKET_BYTES = 25 * 1024 * 1024


def await_peers(folders: tuple[str, ...], bound_s: float, *, ranks: int = 1, on_wait: Callable[[], None] = lambda: None,
                stopped: Callable[[], bool] = lambda: False) -> list[str]:
    """Wait, at most `bound_s`, until every rank of every other group's worker (`ranks` a group:
    the groups are equal shares) is loaded and about to ask for its first quorum, or past that (a
    beat in any phase but starting: its supervisor clears the folder at each launch, so a beat is
    its current attempt's); returns the folders still starting, silent or short of ranks. A group
    asks for a quorum once all its ranks have, so one rank ready said nothing of the group. A peer
    already training ends the wait at once: the groups' quorum exists, and this one joins it behind
    and heals. A group that asked for the stage's first quorum before its peers'
    torchft Managers existed formed a quorum alone and kept it while they, at its step on its
    checkpoint, formed another: two quorums at one step train it on other rows, and torchft never
    heals groups at equal steps. And a group that asked while a peer still loaded a checkpoint waited
    inside torchft, bounded by the quorum's timeout, which a long load outlasts. `on_wait`: called at
    each look (the worker's own heartbeat); `stopped`: a stop request ends the wait."""
    deadline = time.monotonic() + bound_s
    waiting = list(folders)
    while waiting:
        phases = {f: [(b.phase, b.step) for b in heartbeat.read_all(Path(f)).values()] for f in waiting}
        if any(phase == "training" and step >= 0 for beats in phases.values() for phase, step in beats):
            return []
        waiting = [f for f in waiting if sum(phase != "starting" for phase, _ in phases[f]) < ranks]
        if not waiting or time.monotonic() >= deadline or stopped():
            return waiting
        on_wait()
        time.sleep(PEER_POLL_S)
    return []


def replica_name(stage: str, replica_id: int) -> str:
    """torchft derives the group's global rank from the trailing digits of its replica id."""
    return f"{stage}-replica-{replica_id}"


class ReplicaSync:
    """The torchft Manager of one replica group, on every rank of the group."""

    def __init__(self, config: WorkerConfig, device: torch.device, model: nn.Module,
                 optimizer: torch.optim.Optimizer, train_config: TrainConfig):
        import torchft  # the optional `ft` extra: only replica groups need it

        self.model, self.optimizer, self.train_config = model, optimizer, train_config
        timeout = timedelta(seconds=config.replica_timeout_s)
        pg = torchft.ProcessGroupNCCL(timeout=timeout) if device.type == "cuda" else torchft.ProcessGroupGloo(timeout=timeout)
        # min_replica_size=1: one group may carry the stage alone while a peer restarts.
        # init_sync=False: every group builds the same weights (same seed, or the same `init_from`).
        self.manager = torchft.Manager(pg=pg, min_replica_size=1, load_state_dict=self._load, state_dict=self._state,
                                       replica_id=replica_name(config.stage, config.replica_id), timeout=timeout,
                                       quorum_timeout=timeout, connect_timeout=timeout, init_sync=False)
        self.optimizer_step = torchft.Optimizer(self.manager, optimizer)
        self._served: dict[str, Any] | None = None
        self._healed: tuple[int, int] | None = None  # (step, position) loaded from a peer this step

    def start(self, step: int, position: int) -> None:
        """Before the first step: the quorum compares steps, so a resumed group joins at its own."""
        self.manager.load_state_dict({"step": step, "batches_committed": 0})
        self._remember(step, position)

    def reduce_gradients(self) -> None:
        grads = [_local(p.grad) for p in self.model.parameters() if p.grad is not None]
        for bucket in _buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            self.manager.allreduce(flat).wait()  # averaged over the participants; zeroed while healing
            for grad, part in zip(bucket, flat.split([g.numel() for g in bucket])):
                grad.copy_(part.view_as(grad))

    def settle(self, step: int, position: int, batches: ResumableBatches) -> tuple[int, bool, int]:
        """After `step` (tried on the batch at `position`): (step reached, committed, position of
        the batch the quorum trained on), with `batches` moved to the batch after it."""
        committed_step, base_step = self.manager.current_step(), step - 1
        if self._healed is not None:
            base_step, batches.position = self._healed
            self._healed = None
            if committed_step > base_step:  # the quorum trained on the batch after the peer's state
                position, _, _ = batches.next_batch()
        elif committed_step == base_step:
            batches.position = position  # not committed: the same batch again
        self._remember(committed_step, batches.position)
        return committed_step, committed_step > base_step, position

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)

    # --- what a healing peer receives ----------------------------------------------------------

    def _remember(self, step: int, position: int) -> None:
        """References, taken on the training thread after each commit, to what a peer would be
        served during the next quorum; the weights do not change before torchft stops serving
        them (`should_commit`). DTensor shards travel as plain tensors."""
        self._served = {"model": tree_map(_local, self.model.state_dict()),
                        "optim": tree_map(_local, self.optimizer.state_dict()),
                        "train": {"step": step, "position": position}}

    def _state(self) -> dict[str, Any]:  # torchft's quorum thread
        assert self._served is not None, "start() runs before the first quorum"
        return self._served

    def _load(self, state: dict[str, Any]) -> None:
        """A peer's state, on the training thread inside `should_commit`, before the optimizer step."""
        own = self.model.state_dict()
        self.model.load_state_dict({k: _like(v, own[k]) for k, v in state["model"].items()})
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        optim = state["optim"]
        optim["state"] = {i: {k: _like(v, params[i]) for k, v in s.items()} for i, s in optim["state"].items()}
        self.optimizer.load_state_dict(optim)
        step, position = int(state["train"]["step"]), int(state["train"]["position"])
        # The step about to commit is step + 1: its learning rate, as the peers set it.
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate_at(step, self.train_config)
        self._healed = (step, position)


def _local(value: Any) -> Any:
    return value.to_local() if isinstance(value, DTensor) else value


def _like(value: Any, own: Any) -> Any:
    """A received plain tensor as the receiver's own shard layout (a DTensor under FSDP2)."""
    if not isinstance(own, DTensor) or not isinstance(value, torch.Tensor) or value.shape != own.to_local().shape:
        return value
    local = value.to(own.to_local().device)
    return DTensor.from_local(local, own.device_mesh, own.placements, shape=own.shape, stride=own.stride(),
                              run_check=False)


def _buckets(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    buckets: list[list[torch.Tensor]] = [[]]
    size = 0
    for grad in grads:
        nbytes = grad.numel() * grad.element_size()
        if buckets[-1] and size + nbytes > BUCKET_BYTES:
            buckets.append([])
            size = 0
        buckets[-1].append(grad)
        size += nbytes
    return [b for b in buckets if b]
