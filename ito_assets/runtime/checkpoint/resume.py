"""Resume from the newest whole checkpoint of a stage, skipping partial and corrupt ones.

Candidates are tried newest first. A folder is skipped when its marker is missing, a digest does
not match, or DCP fails to load it; the ranks agree on every decision, so that two ranks never
resume from different steps. Rank 0 reads the marker and checks the listing, and broadcasts both;
then every rank hashes its own share of the files (`markers.shares`, balanced by bytes) on a few
threads, and an all_reduce(MIN) of the first bad file's index gives every rank the same verdict,
naming the same file. A checkpoint's check then takes one share's time, not the whole folder's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ito_assets.runtime.checkpoint import markers


@dataclass(frozen=True, kw_only=True)
class Skipped:
    step: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class ResumePoint:
    step: int | None  # None: no whole checkpoint, start fresh
    path: str | None
    skipped: tuple[Skipped, ...]


def _agree(value: Any, group: dist.ProcessGroup | None) -> Any:
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def _all_ok(ok: bool, group: dist.ProcessGroup | None) -> bool:
    if not dist.is_initialized():
        return ok
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return int(flag) == 0


def load_latest(stage_dir: Path, state: dict[str, Any], *, rank: int,
                group: dist.ProcessGroup | None, owner: dict | None = None) -> ResumePoint:
    """Load the newest whole checkpoint of the stage (`owner`'s, when given) into `state` in place."""
    skipped: list[Skipped] = []
    paths = _agree([str(p) for p in markers.candidates(stage_dir)] if rank == 0 else None, group)
    for path in map(Path, paths):
        reason = load_checkpoint(path, state, rank=rank, group=group, owner=owner)
        if reason is None:
            return ResumePoint(step=markers.step_of(path), path=str(path), skipped=tuple(skipped))
        skipped.append(Skipped(step=markers.step_of(path), reason=reason))
    return ResumePoint(step=None, path=None, skipped=tuple(skipped))


def load_checkpoint(path: Path, state: dict[str, Any], *, rank: int, group: dist.ProcessGroup | None,
                    owner: dict | None = None) -> str | None:
    """Verify (every rank its share, agreed by all) and load one checkpoint; None on success, else why not."""
    reason = verify(path, rank=rank, group=group, owner=owner)
    return reason if reason is not None else _try_load(path, state, group)


def verify(path: Path, *, rank: int, group: dist.ProcessGroup | None, owner: dict | None = None) -> str | None:
    """None when the checkpoint is whole (and `owner`'s), else why not: the same answer on every rank."""
    if not dist.is_initialized():
        return markers.validate(path, owner=owner)
    marker, reason = _agree(markers.precheck(path, owner) if rank == 0 else None, group)
    if marker is None:
        return reason
    share = markers.shares(marker, dist.get_world_size(group))[dist.get_rank(group)]
    first = markers.first_mismatch(path, marker, share)
    flag = torch.tensor([len(marker.files) if first is None else first], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return None if int(flag) == len(marker.files) else markers.mismatch_reason(marker, int(flag))


def _try_load(path: Path, state: dict[str, Any], group: dist.ProcessGroup | None) -> str | None:
    try:
        dcp.load(state, checkpoint_id=str(path), process_group=group)
        ok = True
    except Exception:  # a corrupt shard surfaces as any of several DCP / pickle / IO errors
        ok = False
    return None if _all_ok(ok, group) else "DCP failed to load it"
