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
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

SUCCESS_MARKER = "_SUCCESS"
# zstd level 3: polars' default codec and level, a good size/speed trade-off for text.
COMPRESSION = "zstd"


@dataclass(frozen=True)
class Shard:
    path: str
    sha256: str
    num_rows: int


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
        return [s.path for s in self.shards if file_sha256(Path(s.path)) != s.sha256]

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
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    shards = []
    num_parts = max(1, -(-frame.height // max_rows))
    for part in range(num_parts):
        chunk = frame.slice(part * max_rows, max_rows)
        final = folder / f"{prefix}-{part:05d}.parquet"
        temporary = folder / f".{final.name}.tmp"
        chunk.write_parquet(temporary, compression=COMPRESSION, statistics=True)
        os.replace(temporary, final)
        shards.append(Shard(path=str(final), sha256=file_sha256(final), num_rows=chunk.height))
    shard_set = ShardSet(folder=str(folder), shards=tuple(shards))
    (folder / SUCCESS_MARKER).write_text(json.dumps(shard_set.as_dicts(), indent=2) + "\n")
    return shard_set


def write_table(frame: pl.DataFrame, path: Path) -> Shard:
    """One side table (decisions, duplicates, hits) as a single Parquet file with its digest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    frame.write_parquet(temporary, compression=COMPRESSION)
    os.replace(temporary, path)
    return Shard(path=str(path), sha256=file_sha256(path), num_rows=frame.height)
