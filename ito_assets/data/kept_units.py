"""The kept shards in parts, on a step's workers or Ray: each part of the representatives' side
file (a bucket of the keep order, `dedup_units.representative_unit`) is a task that drops the rows
of the near-duplicates removed and writes the survivors to a file of its own (`kept_part`), then
each kept shard is a task cut from those files (`shards.write_shards_in_parts`). The bytes of the
one pass (`write_shard_stream` over `dedup_units.kept_frames`): the same rows in the same order."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ito_assets.data.dedup_units import kept_frames, load_removals, representative_parts
from ito_assets.data.scratch import Scratch
from ito_assets.data.shards import ShardSet, write_part, write_shard_stream, write_shards_in_parts
from ito_assets.data.sources import DOCUMENT_SCHEMA
from ito_assets.data.units import map_units, worker_pool

PREFIX = "kept"


@dataclass(frozen=True)
class KeptTask:
    """One part of the side file, its first position in keep order, and the positions removed in it."""

    rows_path: str
    first: int
    removed: tuple[int, ...]
    output: str

    def key(self) -> dict:
        return {"first": self.first, "removed": hashlib.sha256(np.asarray(self.removed, dtype=np.int64).tobytes()).hexdigest()}

    def inputs(self) -> tuple[str, ...]:
        return (self.rows_path,)

    def outputs(self) -> tuple[str, ...]:
        return (self.output,)


def kept_part(task: KeptTask) -> int:
    """-> the rows kept: the part's rows less those at the removed positions, written to `task.output`."""
    rows = pl.read_parquet(task.rows_path)
    kept = ~np.isin(np.arange(task.first, task.first + rows.height), np.asarray(task.removed, dtype=np.int64))
    rows.filter(pl.Series(kept)).cast(DOCUMENT_SCHEMA).write_parquet(task.output, compression="lz4")  # scratch data: fast over small
    return int(kept.sum())


def kept_shards(scratch: Scratch, folder: Path, max_rows: int, store: Path | None) -> ShardSet:
    """The kept shards of `folder` (shards of `max_rows`): in parts, a task each, where a pool made
    the side file's parts; otherwise the one pass over the side file."""
    parts = representative_parts(scratch)
    if parts is None:
        return write_shard_stream(kept_frames(scratch), folder, prefix=PREFIX, max_rows=max_rows, schema=DOCUMENT_SCHEMA, store=store)
    removed = np.sort(load_removals(scratch)[0])
    markers = scratch.finished("kept-rows")
    tasks = []
    for index, part in enumerate(parts):
        first, end = part["first"], part["first"] + part["num_docs"]
        inside = removed[np.searchsorted(removed, first):np.searchsorted(removed, end)]
        tasks.append(KeptTask(rows_path=part["path"], first=first, removed=tuple(int(p) for p in inside),
                              output=str(markers.folder / f"kept-{index:05d}.parquet")))
    with worker_pool(scratch.scale.num_workers, scratch.scale.engine) as pool:
        counts = map_units(kept_part, tasks, pool, phase="kept rows", unit="representatives' parts", markers=markers,
                           known={part["path"]: part["sha256"] for part in parts})
        files = [(task.output, rows) for task, rows in zip(tasks, counts)]
        return write_shards_in_parts(files, folder, prefix=PREFIX, max_rows=max_rows, schema=DOCUMENT_SCHEMA, store=store,
                                     run_parts=lambda shards: map_units(write_part, shards, pool, phase="kept shards", unit="shards"))
