"""A step's scratch space: a folder for work units and worker outputs, and a DuckDB database in it
whose memory is capped, so that joins, groupings and sorts larger than the cap spill to disk
instead of growing the step's memory with the corpus. The folder is removed when the step ends,
whether it succeeds or not (a rerun starts from a clean folder). A full disk under it (work units,
DuckDB's spill) is STORAGE_FULL.

Beside it, `_finished/` holds what the step's work units wrote, with their completion markers
(completion.py). It outlives a failed or killed step, so that the rerun redoes only the units
that did not finish, and goes when the step succeeds."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import duckdb

from ito_assets.data.completion import CompletionMarkers
from ito_assets.data.config import ScaleConfig
from ito_assets.errors import disk_full, storage_full
from ito_assets.errors import ItoError


FINISHED = "_finished"  # the units' outputs and completion markers, kept until the step succeeds


class Scratch:
    """The folder, the scale and the connection to the scratch database (`db`), opened at its
    first use: a step that never queries (deduplication in memory, the sources step) skips
    creating the database file, 0.02 s of CPU each."""

    def __init__(self, folder: Path, scale: ScaleConfig) -> None:
        self.folder, self.scale = folder, scale
        self._db: duckdb.DuckDBPyConnection | None = None
        self._phases: list[CompletionMarkers] = []

    @property
    def db(self) -> duckdb.DuckDBPyConnection:
        if self._db is None:
            self._db = connect(self.folder, self.scale)
        return self._db

    def sub(self, name: str) -> Path:
        path = self.folder / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def finished(self, phase: str) -> CompletionMarkers:
        """The folder where a phase's units write, and their completion markers."""
        markers = CompletionMarkers(self.folder.parent / FINISHED / phase)
        self._phases.append(markers)
        return markers

    @property
    def units_resumed(self) -> int:
        """Units of this step's phases that an earlier attempt finished and this one did not redo."""
        return sum(markers.resumed for markers in self._phases)

    def reconnect(self) -> None:
        """Close the database and open it again: its tables stay in the file, and the memory
        DuckDB's allocator kept after the last query (~100 MB beyond the cap, measured in
        benchmarks/data_scaling.py; its flush settings and malloc_trim did not return it) goes
        back to the system. Registered frames and settings do not survive; `connect` sets them."""
        if self._db is not None:
            self._db.close()
            self._db = connect(self.folder, self.scale)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


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
    scratch = None
    try:
        folder.mkdir(parents=True)
        scratch = Scratch(folder, scale)
        yield scratch
    except Exception as error:
        if not isinstance(error, ItoError) and disk_full(error):
            raise storage_full(f"a step's scratch space ({folder.parent.name}/{folder.name})") from None
        raise
    else:
        shutil.rmtree(folder.parent / FINISHED, ignore_errors=True)
    finally:
        if scratch is not None:
            scratch.close()
        shutil.rmtree(folder, ignore_errors=True)
