"""A step's scratch space: a folder for work units and worker outputs, and a DuckDB database in it
whose memory is capped, so that joins, groupings and sorts larger than the cap spill to disk
instead of growing the step's memory with the corpus. The folder is removed when the step ends,
whether it succeeds or not (a rerun starts from a clean folder)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb

from ito_assets.data.config import ScaleConfig


@dataclass(frozen=True)
class Scratch:
    folder: Path
    db: duckdb.DuckDBPyConnection
    scale: ScaleConfig

    def sub(self, name: str) -> Path:
        path = self.folder / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def sql_list(paths: Sequence[str]) -> str:
    """A DuckDB list literal of file paths (read_parquet takes a list; quotes doubled)."""
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def connect(folder: Path, scale: ScaleConfig) -> duckdb.DuckDBPyConnection:
    # A database file (not :memory:) so that large tables, too, can leave memory.
    db = duckdb.connect(str(folder / "scratch.duckdb"))
    spill = str(folder / "spill").replace("'", "''")
    db.execute(f"SET memory_limit = '{int(scale.memory_limit_mb)}MB'")
    # Each thread needs its own working memory under the cap (ScaleConfig.duckdb_threads).
    db.execute(f"SET threads = {scale.duckdb_threads}")
    db.execute(f"SET temp_directory = '{spill}'")
    # Without it DuckDB keeps every operator's output in input order, which costs memory; every
    # query here that needs an order says ORDER BY.
    db.execute("SET preserve_insertion_order = false")
    return db


@contextmanager
def scratch_space(folder: Path, scale: ScaleConfig) -> Iterator[Scratch]:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    db = connect(folder, scale)
    try:
        yield Scratch(folder=folder, db=db, scale=scale)
    finally:
        db.close()
        shutil.rmtree(folder, ignore_errors=True)
