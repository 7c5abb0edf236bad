"""The clean shards in parts, on a step's workers or Ray: each kept shard is a task that writes its
clean rows to a file of its own (`clean_shard`), then each clean shard is a task cut from those
files (`shards.write_shards_in_parts`). The same bytes as the one pass (`stages.write_clean_shards`):
a kept shard's clean rows are the one pass's rows for that shard, in its order (a cut document's
pieces stay beside it), and the files are read back in kept-shard order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from ito_assets.data import clean
from ito_assets.data.scratch import Scratch
from ito_assets.data.shards import Shard, ShardSet, write_part, write_shards_in_parts
from ito_assets.data.sources import DOCUMENT_SCHEMA
from ito_assets.data.units import Pool, map_units, parquet_frames

PREFIX = "clean"


@dataclass(frozen=True)
class CleanTask:
    """One kept shard, and the decontamination's actions and pieces (every shard verified by the
    step before any task runs: their digests are the task's key)."""

    kept: Shard
    actions: Shard
    pieces: Shard
    output: str

    def key(self) -> dict:
        return {"kept": self.kept.sha256, "actions": self.actions.sha256, "pieces": self.pieces.sha256}

    def inputs(self) -> tuple[str, ...]:
        return ()

    def outputs(self) -> tuple[str, ...]:
        return (self.output,)


def clean_schema(actions: Path | str, pieces: Path | str) -> dict:
    """The clean rows' columns, from the actions' and pieces' files (their schemas, not their rows)."""
    empty = (pl.DataFrame(schema=pl.read_parquet_schema(path)) for path in (actions, pieces))
    return dict(clean.clean_documents(pl.DataFrame(schema=DOCUMENT_SCHEMA), *empty).schema)


def clean_shard(task: CleanTask) -> int:
    """-> the clean rows written to `task.output`, a batch of kept documents at a time; only the
    actions and pieces of this shard's documents are read into memory."""
    ids = pl.scan_parquet(task.kept.path).select("doc_id")
    actions, pieces = (pl.scan_parquet(table.path).join(ids, on="doc_id", how="semi").collect()
                       for table in (task.actions, task.pieces))
    batches = (frame.cast(DOCUMENT_SCHEMA) for frame in parquet_frames([task.kept.path], list(DOCUMENT_SCHEMA)))
    empty = pl.DataFrame(schema=clean_schema(task.actions.path, task.pieces.path)).to_arrow()
    num_rows = 0
    with pq.ParquetWriter(task.output, empty.schema, compression="lz4") as writer:  # scratch data: fast over small
        for rows in clean.clean_batches(batches, actions, pieces):
            writer.write_table(rows.to_arrow().cast(empty.schema))
            num_rows += rows.height
    return num_rows


def clean_in_parts(kept: ShardSet, actions: Shard, pieces: Shard, scratch: Scratch, pool: Pool, folder: Path,
                   max_rows: int, store: Path | None) -> ShardSet:
    """The clean shards of `folder` from verified inputs, each kept shard and then each clean
    shard a task on `pool`; the kept shards a failed attempt finished are not cleaned again."""
    markers = scratch.finished("clean-rows")
    tasks = [CleanTask(kept=shard, actions=actions, pieces=pieces, output=str(markers.folder / f"rows-{i:05d}.parquet"))
             for i, shard in enumerate(kept.shards)]
    counts = map_units(clean_shard, tasks, pool, phase="clean rows", unit="kept shards", markers=markers)
    files = [(task.output, rows) for task, rows in zip(tasks, counts)]
    return write_shards_in_parts(files, folder, prefix=PREFIX, max_rows=max_rows, schema=clean_schema(actions.path, pieces.path),
                                 store=store, run_parts=lambda parts: map_units(write_part, parts, pool, phase="clean shards", unit="shards"))
