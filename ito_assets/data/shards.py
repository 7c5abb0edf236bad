"""Parquet shards: frames written in parts of at most `max_rows` rows, each with its sha256.

A shard set is described by a small frozen value (paths, digests, row counts) that Dagster passes
between assets; the frames themselves stay on disk. Files are written to a temporary name and
renamed, so a crashed write never leaves a partial shard under a final name, and a completed
set is marked by its `_SUCCESS` file listing every part and digest (a rerun replaces the folder).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

SUCCESS_MARKER = "_SUCCESS"
# zstd level 3: polars' default codec and level, a good size/speed trade-off for text.
COMPRESSION = "zstd"
# Rows per Parquet row group. Readers that stream a shard (pyarrow's iter_batches, DuckDB) decode
# a whole row group at a time, so this, not the shard's size, bounds what one batch costs: 8k
# documents of a few kB, a few tens of MB (polars' default, 512^2 rows, is a whole shard).
ROW_GROUP_ROWS = 8192


@dataclass(frozen=True)
class Shard:
    path: str
    sha256: str
    num_rows: int

    def changed(self) -> bool:
        """Whether the file no longer hashes to the recorded digest (or is gone)."""
        path = Path(self.path)
        return not path.is_file() or file_sha256(path) != self.sha256


@dataclass(frozen=True)
class ShardSet:
    """What a shard-writing step hands downstream: where the parts are and what they hash to."""

    folder: str
    shards: tuple[Shard, ...]

    @property
    def num_rows(self) -> int:
        return sum(s.num_rows for s in self.shards)

    def read(self, columns: list[str] | None = None) -> pl.DataFrame:
        if not self.shards:
            raise ValueError("an empty shard set has no schema to read")
        return pl.concat([pl.read_parquet(s.path, columns=columns) for s in self.shards], how="vertical")

    def verify(self) -> list[str]:
        """Paths of shards whose bytes no longer hash to the recorded digest."""
        return [s.path for s in self.shards if s.changed()]

    def as_dicts(self) -> list[dict]:
        return [asdict(s) for s in self.shards]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_shards(frame: pl.DataFrame, folder: Path, *, prefix: str, max_rows: int) -> ShardSet:
    """Replace `folder` with `frame` split into parts `<prefix>-NNNNN.parquet` of <= max_rows rows.

    An empty frame still writes one (empty) part, so that the schema travels downstream."""
    return write_shard_stream([frame], folder, prefix=prefix, max_rows=max_rows, schema=frame.schema)


def write_shard_stream(frames: Iterable[pl.DataFrame], folder: Path, *, prefix: str, max_rows: int, schema: Mapping) -> ShardSet:
    """`write_shards` for frames that arrive a batch at a time: the same parts, holding at most
    one part (plus one batch) in memory."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    shards: list[Shard] = []
    pending: list[pl.DataFrame] = []
    num_pending = 0
    for frame in frames:
        pending.append(frame)
        num_pending += frame.height
        while num_pending >= max_rows:
            rows = pl.concat(pending)
            shards.append(_write_part(rows.head(max_rows), folder, prefix, len(shards)))
            pending, num_pending = [rows.slice(max_rows)], rows.height - max_rows
    if num_pending or not shards:
        rows = pl.concat(pending) if pending else pl.DataFrame(schema=schema)
        shards.append(_write_part(rows, folder, prefix, len(shards)))
    shard_set = ShardSet(folder=str(folder), shards=tuple(shards))
    (folder / SUCCESS_MARKER).write_text(json.dumps(shard_set.as_dicts(), indent=2) + "\n")
    return shard_set


def _write_part(chunk: pl.DataFrame, folder: Path, prefix: str, part: int) -> Shard:
    final = folder / f"{prefix}-{part:05d}.parquet"
    temporary = folder / f".{final.name}.tmp"
    chunk.rechunk().write_parquet(temporary, compression=COMPRESSION, statistics=True, row_group_size=ROW_GROUP_ROWS)
    os.replace(temporary, final)
    return Shard(path=str(final), sha256=file_sha256(final), num_rows=chunk.height)


def write_table(frame: pl.DataFrame, path: Path) -> Shard:
    """One side table (decisions, duplicates, hits) as a single Parquet file with its digest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    frame.write_parquet(temporary, compression=COMPRESSION)
    os.replace(temporary, path)
    return Shard(path=str(path), sha256=file_sha256(path), num_rows=frame.height)


def write_table_batches(batches: pa.RecordBatchReader, path: Path) -> Shard:
    """`write_table` for a table that arrives a record batch at a time (a DuckDB query's result):
    one batch in memory, whatever the table's size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    num_rows = 0
    with pq.ParquetWriter(temporary, batches.schema, compression=COMPRESSION) as writer:
        for batch in batches:
            writer.write_batch(batch, row_group_size=ROW_GROUP_ROWS)
            num_rows += batch.num_rows
    os.replace(temporary, path)
    return Shard(path=str(path), sha256=file_sha256(path), num_rows=num_rows)


def record_batches(frames: Iterable[pl.DataFrame], schema: Mapping) -> pa.RecordBatchReader:
    """Polars frames of one schema as an Arrow stream (what DuckDB and `write_table_batches`
    read), converted a frame at a time."""
    arrow_schema = pl.DataFrame(schema=schema).to_arrow().schema
    return pa.RecordBatchReader.from_batches(arrow_schema, (b for frame in frames for b in frame.cast(schema).to_arrow().to_batches()))
