"""The plan's layout fitted to the ranks and batch a stage attempt really has, every change with its
reason.

On the booked hardware nothing changes: the planner searched the booking's world within the
runtime's capabilities (`ito_assets.training.capabilities`). A host that is not the booking (the
embedded CPU default, a smaller test machine, the runtime resource's batch override) keeps what it
can: tensor parallelism where tp divides its ranks, the plan's replicate x shard split where its
ranks allow it, the largest micro-batch that divides each rank's share of the batch. The worker
adds the device's own fallbacks (bf16, fp8, compile; `ito_assets.runtime.worker.execution`) and
records the whole list beside the layout it ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.training.layout import Layout, Precision


@dataclass(frozen=True, kw_only=True)
class Fallback:
    field: str
    planned: object
    ran: object
    reason: str

    def to_dict(self) -> dict:
        return {"field": self.field, "planned": self.planned, "ran": self.ran, "reason": self.reason}

    @classmethod
    def from_dict(cls, body: dict) -> "Fallback":
        return cls(field=str(body["field"]), planned=body["planned"], ran=body["ran"], reason=str(body["reason"]))


def changes(planned: Layout, ran: Layout, reason: str, fields: tuple[str, ...]) -> list[Fallback]:
    return [Fallback(field=f, planned=_plain(getattr(planned, f)), ran=_plain(getattr(ran, f)), reason=reason)
            for f in fields if getattr(planned, f) != getattr(ran, f)]


def _plain(value: object) -> object:
    return getattr(value, "value", value)


def fit_layout(planned: Layout, *, world_size: int, replica_groups: int, batch_size: int,
               eager_reason: str | None = None, fp32_reason: str | None = None) -> tuple[Layout, tuple[Fallback, ...]]:
    """The layout of the whole attempt: `world_size` ranks (over every replica group), a global
    batch of `batch_size` sequences. torchft replica groups are its dp_replicate degree
    (`per_group`); `eager_reason`: why this host runs without torch.compile, if it does;
    `fp32_reason`: why it trains a bf16 plan in fp32, if it does. Raises
    CAPABILITY_MISSING for pipeline or context parallelism, which the worker has not (a plan made
    before the planner knew that)."""
    if planned.pp > 1 or planned.cp > 1:
        raise ItoError(ErrorCode.CAPABILITY_MISSING,
                       "the plan needs pipeline or context parallelism, which this runtime does not train")
    if world_size < 1 or replica_groups < 1 or world_size % replica_groups:
        raise ValueError("world_size must be a positive multiple of replica_groups")
    found: list[Fallback] = []
    tp = planned.tp if (world_size // replica_groups) % planned.tp == 0 else 1
    fitted = replace(planned, tp=tp, **_data_degrees(planned, world_size // tp, replica_groups))
    where = f"{world_size} rank(s) here, the plan's {planned.world_size} on the booking"
    found += changes(planned, fitted, where, ("tp", "dp_replicate", "dp_shard"))
    if batch_size % fitted.dp:
        raise ValueError(f"the global batch of {batch_size} sequences does not split over {fitted.dp} data-parallel ranks")
    per_rank = batch_size // fitted.dp
    micro = math.gcd(planned.micro_batch_size, per_rank)
    if micro != planned.micro_batch_size:
        ran = replace(fitted, micro_batch_size=micro)
        found += changes(fitted, ran, f"each rank's share of the batch is {per_rank} sequence(s)", ("micro_batch_size",))
        fitted = ran
    if planned.compile and eager_reason is not None:
        ran = replace(fitted, compile=False)
        found += changes(fitted, ran, eager_reason, ("compile",))
        fitted = ran
    if planned.precision is Precision.BF16 and fp32_reason is not None:
        ran = replace(fitted, precision=Precision.FP32)
        found += changes(fitted, ran, fp32_reason, ("precision",))
        fitted = ran
    return fitted, tuple(found)


def per_group(layout: Layout, replica_groups: int) -> Layout:
    """The layout inside one torchft replica group: the groups are the outer replicas."""
    return replace(layout, dp_replicate=layout.dp_replicate // replica_groups)


def _data_degrees(planned: Layout, data_ranks: int, replica_groups: int) -> dict[str, int]:
    """Replicate x shard over the data ranks: torchft groups are the replicas; a plan that only
    replicates stays replication (DDP); a sharded plan keeps its replicate degree where the ranks
    split into shards of at least two, else shards over every rank."""
    if replica_groups > 1:
        return {"dp_replicate": replica_groups, "dp_shard": data_ranks // replica_groups}
    if planned.dp_shard == 1:
        return {"dp_replicate": data_ranks, "dp_shard": 1}
    replicate = planned.dp_replicate
    if data_ranks % replicate or data_ranks // replicate < 2:
        replicate = 1
    return {"dp_replicate": replicate, "dp_shard": data_ranks // replicate}
