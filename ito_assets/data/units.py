"""Work units: a step's documents cut into parts of about `unit_bytes` bytes of text, each an
independent piece of work that a worker process can do alone.

A unit is a Parquet file of consecutive documents in the step's order (columns `doc_id`, `text`)
plus where it starts in that order, so that a unit's local document positions map back to the
step's by one addition. Units are written from a stream of frames, one unit in memory at a time;
a document is never split. `map_units` runs a top-level function over tasks, in this
process (one worker) or in a pool of fresh ("spawn") processes: forking a process that already
runs polars' or DuckDB's thread pools can deadlock a child on a lock another thread held.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from ito_assets.data.completion import Checked, CompletionMarkers, run_checked, task_key
from ito_assets.data.shards import Shard
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.progress import Progress

UNIT_SCHEMA = {"doc_id": pl.String, "text": pl.String}
# Rows read per batch when streaming a Parquet file: ~8k documents of a few kB, a few tens of MB.
READ_BATCH_ROWS = 8192

Task = TypeVar("Task")
Result = TypeVar("Result")


class Pool(Protocol):
    """What `map_units` needs of a pool: an Executor's `submit` (ProcessPoolExecutor; threads in
    tests), or ray_engine.RayPool's `map_finished`."""


@dataclass(frozen=True)
class WorkUnit:
    index: int
    path: str
    first: int  # position of the unit's first document in the step's order
    num_docs: int
    num_bytes: int  # UTF-8 bytes of text (rows of a larger file: their uncompressed bytes)
    rows: tuple[int, int] | None = None  # the file's rows [first, end) that are the unit; None: the whole file

    def read(self, columns: list[str] | None = None) -> pl.DataFrame:
        if self.rows is None:
            return pl.read_parquet(self.path, columns=columns)
        # polars reads only the row groups the slice touches (their footers say which).
        start, end = self.rows
        frame = pl.scan_parquet(self.path).slice(start, end - start)
        return (frame if columns is None else frame.select(columns)).collect()

    def key(self) -> dict:
        """Where the unit sits in the step's order (its bytes are digested from its file)."""
        key = {"index": self.index, "first": self.first, "num_docs": self.num_docs}
        return key if self.rows is None else key | {"rows": list(self.rows)}


class _UnitWriter:
    def __init__(self, folder: Path, target_bytes: int) -> None:
        self.folder, self.target = folder, target_bytes
        self.units: list[WorkUnit] = []
        self.pending: list[pl.DataFrame] = []
        self.pending_bytes = 0
        self.next_first = 0

    def add(self, frame: pl.DataFrame) -> None:
        while frame.height:
            sizes = frame["text"].str.len_bytes().cast(pl.Int64).to_numpy()
            # Rows needed to reach the target: the unit closes on the document that crosses it.
            take = int(np.searchsorted(np.cumsum(sizes), self.target - self.pending_bytes, side="left")) + 1
            self.pending.append(frame.head(take))
            self.pending_bytes += int(sizes[:take].sum())
            frame = frame.slice(take)
            if self.pending_bytes >= self.target:
                self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        unit = pl.concat(self.pending).cast(UNIT_SCHEMA)
        path = self.folder / f"unit-{len(self.units):05d}.parquet"
        unit.write_parquet(path, compression="lz4")  # scratch data: fast over small
        self.units.append(WorkUnit(index=len(self.units), path=str(path), first=self.next_first, num_docs=unit.height, num_bytes=self.pending_bytes))
        self.next_first += unit.height
        self.pending, self.pending_bytes = [], 0


def write_units(frames: Iterable[pl.DataFrame], folder: Path, target_bytes: int) -> tuple[WorkUnit, ...]:
    """Frames (doc_id, text) in the step's order -> unit files under `folder` (none when empty)."""
    folder.mkdir(parents=True, exist_ok=True)
    writer = _UnitWriter(folder, target_bytes)
    for frame in frames:
        writer.add(frame.select(list(UNIT_SCHEMA)))
    writer.flush()
    return tuple(writer.units)


def row_group_runs(path: Path | str, uri: str, target_bytes: int) -> list[tuple[int, int, int]]:
    """(first group, end group, first row) of runs of whole row groups of about `target_bytes`
    uncompressed; a footer that does not read is SOURCE_INVALID, as in one pass."""
    try:
        metadata = pq.ParquetFile(path).metadata
    except Exception:  # noqa: BLE001 - any parse failure is the same user-facing error
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: not a readable Parquet file") from None
    runs: list[tuple[int, int, int]] = []
    first = row = size = 0
    first_row = 0
    for group in range(metadata.num_row_groups):
        size += metadata.row_group(group).total_byte_size
        row += metadata.row_group(group).num_rows
        if size >= target_bytes:
            runs.append((first, group + 1, first_row))
            first, first_row, size = group + 1, row, 0
    if first < metadata.num_row_groups or not runs:
        runs.append((first, metadata.num_row_groups, first_row))
    return runs


def shard_units(shards: Sequence[Shard], target_bytes: int) -> tuple[WorkUnit, ...]:
    """Work units cut from the shards' footers alone, in shard order: runs of whole row groups of
    about `target_bytes` uncompressed, and a group of two targets or more (long documents: a
    group is `shards.ROW_GROUP_ROWS` documents) cut into slices of equal rows of about the
    target (each slice's worker still decodes its whole group, briefly: the unit's own work is
    what the slice bounds). Each document is read by its unit's worker only, where `write_units`
    passes every text through the step to copy it. A shard with no rows gives no unit."""
    units: list[WorkUnit] = []
    first = 0
    for shard in shards:
        metadata = pq.ParquetFile(shard.path).metadata
        for start, end, first_row in row_group_runs(shard.path, shard.name, target_bytes):
            num_docs = sum(metadata.row_group(g).num_rows for g in range(start, end))
            num_bytes = sum(metadata.row_group(g).total_byte_size for g in range(start, end))
            slices = max(1, min(num_docs, num_bytes // target_bytes)) if end - start == 1 else 1
            size = -(-num_docs // slices) if num_docs else 1
            for low in range(0, num_docs, size):
                high = min(num_docs, low + size)
                units.append(WorkUnit(index=len(units), path=shard.path, first=first + first_row + low, num_docs=high - low,
                                      num_bytes=num_bytes * (high - low) // num_docs, rows=(first_row + low, first_row + high)))
        first += metadata.num_rows
    return tuple(units)


def parquet_frames(paths: Sequence[str], columns: list[str], batch_rows: int = READ_BATCH_ROWS) -> Iterator[pl.DataFrame]:
    """The rows of several Parquet files, in order, a bounded batch at a time.

    Read by polars' streaming engine, not pyarrow's `iter_batches`: reading 50,000-row shards
    and writing them again peaked ~100 MB lower (benchmarks/data_scaling.py, 64x), as pyarrow's
    default (mimalloc) pool kept what its reader had freed."""
    for path in paths:
        for frame in pl.scan_parquet(path).select(columns).collect_batches(chunk_size=batch_rows):
            if frame.height:
                yield frame


def compacted(frame: pl.DataFrame) -> pl.DataFrame:
    """The same rows, holding only their own bytes. A filtered polars frame's strings still point
    into the buffers of the batch they came from (string views), so keeping a few rows of every
    batch kept every batch's text: the hits' documents held the whole kept corpus (~180 MB at
    128x in benchmarks/data_scaling.py). Arrow's plain string layout has no views: the round
    trip copies the rows kept, and nothing else."""
    return pl.from_arrow(frame.to_arrow(compat_level=pl.CompatLevel.oldest())).cast(frame.schema)


# The pool a step opened, which the phases it calls join rather than start their own.
_open_pool: ContextVar[tuple[tuple[int, str], Pool] | None] = ContextVar("open_pool", default=None)


@contextmanager
def worker_pool(num_workers: int, engine: str = "local") -> Iterator[Pool | None]:
    """Where a step's units run: for the local engine a pool of `num_workers` fresh processes
    (each start imports polars and numpy, ~1-2 s), or None for one worker (the step's own process
    does the work); for "ray", tasks on a Ray cluster (ray_engine.py). Inside a pool of the same
    workers and engine, that pool: a stage's phases start their workers once."""
    held = _open_pool.get()
    if held is not None and held[0] == (num_workers, engine):
        yield held[1]
        return
    with _new_pool(num_workers, engine) as pool:
        token = _open_pool.set(None if pool is None else ((num_workers, engine), pool))
        try:
            yield pool
        finally:
            _open_pool.reset(token)


@contextmanager
def _new_pool(num_workers: int, engine: str) -> Iterator[Pool | None]:
    if engine == "ray":
        from ito_assets.data.ray_engine import ray_pool

        with ray_pool() as pool:
            yield pool
        return
    if num_workers <= 1:
        yield None
        return
    with ProcessPoolExecutor(max_workers=num_workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


def map_units(function: Callable[[Task], Result], tasks: Sequence[Task], pool: Pool | None, *,
              phase: str, unit: str = "work units", markers: CompletionMarkers | None = None,
              known: Mapping[str, str] | None = None) -> list[Result]:
    """function(task) for every task, results in task order; progress in the run's log at every
    tenth of the tasks (`phase` names the work, `unit` what a task is). With `markers`, the tasks
    an earlier attempt finished are not done again, and each task finished now is marked;
    `known`: the digests of inputs already hashed (`completion.task_key`)."""
    from ito_assets.data.ray_engine import WorkUnitFailed

    keys = [task_key(function, task, known) for task in tasks] if markers is not None else []
    results: dict[int, Result] = markers.finished(keys, unit) if markers is not None else {}
    todo = [i for i in range(len(tasks)) if i not in results]
    progress = Progress(phase, len(todo), unit)
    work, run = ([tasks[i] for i in todo], function) if markers is None else ([Checked(function, tasks[i]) for i in todo], run_checked)
    try:
        # One task is not worth a process start; on Ray it still goes to the cluster (memory).
        in_process = pool is None or (len(work) <= 1 and isinstance(pool, ProcessPoolExecutor))
        for position, result in enumerate(map(run, work)) if in_process else _as_finished(pool, run, work):
            index = todo[position]
            if markers is not None:
                result, digests = result
                markers.record(index, keys[index], result, digests)
            results[index] = result
            progress.advance()
    except WorkUnitFailed as failed:
        raise ItoError(ErrorCode.DATA_WORK_UNIT_FAILED, f"{phase}: {failed.renumbered(todo)}") from None
    return [results[i] for i in range(len(tasks))]


def _as_finished(pool: Pool, function: Callable[[Task], Result], tasks: Sequence[Task]) -> Iterator[tuple[int, Result]]:
    """(position, result) of each task as it finishes. After a failure, the tasks not started are
    cancelled, those running are waited for, and their results still come (so their completion
    markers are written: a rerun redoes the failed unit and those never run, not every unit
    after it); then the first failure is raised."""
    if not isinstance(pool, Executor):
        yield from pool.map_finished(function, tasks)
        return
    futures = {pool.submit(function, task): position for position, task in enumerate(tasks)}
    failure: BaseException | None = None
    try:
        for future in as_completed(futures):
            if future.cancelled():
                continue
            if future.exception() is not None:
                failure = failure or future.exception()
                _cancel(futures)
                continue
            yield futures[future], future.result()
    finally:  # the caller's own error, or an iterator it closed: nothing more is started
        _cancel(futures)
    if failure is not None:
        raise failure


def _cancel(futures: Iterable[Future]) -> None:
    for future in futures:
        future.cancel()  # a running or finished one is left to end as it does
