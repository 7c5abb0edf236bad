"""Resume from the newest whole checkpoint of a stage, skipping partial and corrupt ones.

Candidates are tried newest first. A folder is skipped when its marker is missing or names
another owner or data order, a digest does not match, or DCP fails to load it (a key the state
asks for that it lacks, a corrupt shard); the ranks agree on every decision, so that two ranks
never resume from different steps. Rank 0 reads the marker and checks the listing, and broadcasts both;
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
from torch.distributed.checkpoint.api import CheckpointException

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


def all_ok(ok: bool, group: dist.ProcessGroup | None) -> bool:
    """True on every rank when `ok` is true on all of them: a collective, every rank calls it."""
    if not dist.is_initialized():
        return ok
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return int(flag) == 0


def load_latest(stage_dir: Path, state: dict[str, Any], *, rank: int, group: dist.ProcessGroup | None,
                owner: dict | None = None, optional: tuple[str, ...] = (),
                trained_with: dict | None = None) -> ResumePoint:
    """Load the newest whole checkpoint of the stage (`owner`'s, when given; one `trained_with` the
    same way, `markers.precheck`) into `state` in place.
    Entries of `state`'s `optional` parts that a checkpoint lacks are dropped from `state`, not
    refused: per-rank generator states, which a checkpoint written by fewer ranks does not hold."""
    skipped: list[Skipped] = []
    paths = _agree([str(p) for p in markers.candidates(stage_dir)] if rank == 0 else None, group)
    for path in map(Path, paths):
        reason = load_checkpoint(path, state, rank=rank, group=group, owner=owner, optional=optional,
                                 trained_with=trained_with)
        if reason is None:
            return ResumePoint(step=markers.step_of(path), path=str(path), skipped=tuple(skipped))
        skipped.append(Skipped(step=markers.step_of(path), reason=reason))
    return ResumePoint(step=None, path=None, skipped=tuple(skipped))


def load_checkpoint(path: Path, state: dict[str, Any], *, rank: int, group: dist.ProcessGroup | None,
                    owner: dict | None = None, optional: tuple[str, ...] = (),
                    trained_with: dict | None = None) -> str | None:
    """Verify (every rank its share, agreed by all) and load one checkpoint; None on success, else why not."""
    reason = verify(path, rank=rank, group=group, owner=owner, trained_with=trained_with)
    return reason if reason is not None else _try_load(path, state, group, optional)


def verify(path: Path, *, rank: int, group: dist.ProcessGroup | None, owner: dict | None = None,
           trained_with: dict | None = None) -> str | None:
    """None when the checkpoint is whole (and `owner`'s), else why not: the same answer on every rank."""
    if not dist.is_initialized():
        return markers.validate(path, owner=owner, trained_with=trained_with)
    marker, reason = _agree(markers.precheck(path, owner, trained_with) if rank == 0 else None, group)
    if marker is None:
        return reason
    share = markers.shares(marker, dist.get_world_size(group))[dist.get_rank(group)]
    first = markers.first_mismatch(path, marker, share)
    flag = torch.tensor([len(marker.files) if first is None else first], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return None if int(flag) == len(marker.files) else markers.mismatch_reason(marker, int(flag))


def _try_load(path: Path, state: dict[str, Any], group: dist.ProcessGroup | None,
              optional: tuple[str, ...]) -> str | None:
    # DCP raises CheckpointException, a BaseException, for a key the checkpoint lacks.
    try:
        loading = _held_parts(path, state, optional)
        dcp.load(loading, checkpoint_id=str(path), process_group=group)
        ok = True
    except (Exception, CheckpointException):  # a corrupt shard surfaces as any of several DCP / pickle / IO errors
        ok = False
    if not all_ok(ok, group):
        return "DCP failed to load it"
    state.update(loading)
    return None


def _held_parts(path: Path, state: dict[str, Any], optional: tuple[str, ...]) -> dict[str, Any]:
    """`state` with its `optional` parts cut to the entries the checkpoint holds (the same tensors)."""
    if not optional:
        return state
    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    return {part: ({key: value for key, value in entries.items() if f"{part}.{key}" in saved}
                   if part in optional else entries) for part, entries in state.items()}
