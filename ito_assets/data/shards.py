"""Parquet shards: frames written in parts of at most `max_rows` rows, each with its sha256.

A shard set is described by a small frozen value (paths, digests, row counts) that Dagster passes
between assets; the frames themselves stay on disk. A file is written to a temporary name and a
set into a hidden sibling folder, each renamed into place only once complete (the set with its
`_SUCCESS` file listing every part and digest), so a failed write — a full disk is STORAGE_FULL —
leaves the previous file or set, never part of a new one. A reader verifies a shard's bytes
against its recorded sha256 before it reads them (`verified_path`): a changed, truncated or
unreadable file is SHARD_CORRUPT, named relative to its store.
"""

from __future__ import annotations

import hmac
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ito_assets.digests import file_sha256
from ito_assets.errors import ErrorCode, ItoError, disk_full, storage_full

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
    # The folder the shard is named relative to in messages (a stage's `<state>/shards`): an
    # absolute path would show a user's home. Empty (shards written before it existed): the name.
    store: str = ""

    @property
    def name(self) -> str:
        return store_name(self.path, self.store)

    def changed(self) -> bool:
        """Whether the file no longer hashes to the recorded digest (or is gone, or unreadable)."""
        return shard_problem(self) is not None


@dataclass(frozen=True)
class ShardSet:
    """What a shard-writing step hands downstream: where the parts are and what they hash to."""

    folder: str
    shards: tuple[Shard, ...]

    @property
    def num_rows(self) -> int:
        return sum(s.num_rows for s in self.shards)

    def read(self, columns: list[str] | None = None) -> pl.DataFrame:
        """Every part, each verified against its digest just before it is read (SHARD_CORRUPT)."""
        if not self.shards:
            raise ValueError("an empty shard set has no schema to read")
        return pl.concat([pl.read_parquet(verified_path(s), columns=columns) for s in self.shards], how="vertical")

    def iter_column(self, column: str, batch_rows: int = ROW_GROUP_ROWS) -> Iterator[list]:
        """One column's values in row order, `batch_rows` at a time, each part verified against
        its digest just before it is read (SHARD_CORRUPT): a whole corpus never in memory."""
        for shard in self.shards:
            parquet = pq.ParquetFile(verified_path(shard))
            for batch in parquet.iter_batches(batch_size=batch_rows, columns=[column]):
                yield batch.column(0).to_pylist()

    def verified_paths(self) -> list[str]:
        return verified_paths(self.shards)

    def verify(self) -> list[str]:
        """Names (relative to the store) of shards whose bytes no longer hash to the recorded digest."""
        return [s.name for s in self.shards if s.changed()]

    def as_dicts(self) -> list[dict]:
        return [asdict(s) for s in self.shards]


def store_name(path: str | Path, store: str | Path = "") -> str:
    """`path` relative to `store` when it lies under it, else its file name: never absolute."""
    path = Path(path)
    if store and path.is_relative_to(store):
        return path.relative_to(store).as_posix()
    return path.name


def shard_problem(shard: Shard) -> str | None:
    """What is wrong with the shard's file (missing, unreadable, other bytes than recorded), or None."""
    expected = f"expected sha256 {shard.sha256}"
    try:
        actual = file_sha256(Path(shard.path))
    except FileNotFoundError:
        return f"shard {shard.name} is missing ({expected})"
    except OSError as error:
        return f"shard {shard.name} cannot be read ({error.strerror or type(error).__name__}; {expected})"
    if not hmac.compare_digest(actual, shard.sha256):
        return f"shard {shard.name} does not hash to its recorded digest ({expected}, found {actual})"
    return None


def verified_path(shard: Shard) -> str:
    """The shard's path, once its bytes hash to the recorded sha256. Hashed by this process just
    before the read, so replaced bytes (even a valid Parquet file of the same schema), a flipped
    byte or a truncated file are SHARD_CORRUPT here rather than a parser's error or wrong rows."""
    problem = shard_problem(shard)
    if problem is not None:
        raise ItoError(ErrorCode.SHARD_CORRUPT, f"{problem}; re-materialize the asset that wrote it")
    return shard.path


def verified_paths(shards: Iterable[Shard]) -> list[str]:
    return [verified_path(s) for s in shards]


@contextmanager
def writing(what: str, *leftovers: Path) -> Iterator[None]:
    """A write that leaves nothing behind when it fails: `leftovers` (temporary files or folders)
    are removed, and a full disk is STORAGE_FULL (retryable) naming `what`."""
    try:
        yield
    except BaseException as error:
        for leftover in leftovers:
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
        if not isinstance(error, ItoError) and disk_full(error):
            raise storage_full(what) from None
        raise


def write_bytes_atomic(path: Path, data: bytes, *, what: str) -> None:
    """`data` under `path`, or (on any failure) nothing new under it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with writing(what, temporary):
        with temporary.open("wb") as handle:
            handle.write(data)
        os.replace(temporary, path)


class _Sink:
    """The file polars writes a Parquet file through, keeping the OS error of a failed write:
    polars reports some failures (a footer written to a full disk) only as "Invalid thrift:
    transport error", without the OS's reason."""

    def __init__(self, handle) -> None:
        self.handle, self.error = handle, None

    def write(self, data) -> int:
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        try:
            self.handle.flush()
        except OSError as error:
            self.error = error
            raise

    def __getattr__(self, name: str):
        return getattr(self.handle, name)


def _write_parquet(frame: pl.DataFrame, path: Path, **options) -> None:
    with path.open("wb") as handle:
        sink = _Sink(handle)
        try:
            frame.write_parquet(sink, **options)
        except Exception as error:
            if sink.error is not None:
                raise sink.error from error
            raise


def write_shards(frame: pl.DataFrame, folder: Path, *, prefix: str, max_rows: int, store: Path | None = None) -> ShardSet:
    """Replace `folder` with `frame` split into parts `<prefix>-NNNNN.parquet` of <= max_rows rows.

    An empty frame still writes one (empty) part, so that the schema travels downstream."""
    return write_shard_stream([frame], folder, prefix=prefix, max_rows=max_rows, schema=frame.schema, store=store)


def write_shard_stream(frames: Iterable[pl.DataFrame], folder: Path, *, prefix: str, max_rows: int, schema: Mapping, store: Path | None = None) -> ShardSet:
    """`write_shards` for frames that arrive a batch at a time: the same parts, holding at most
    one part (plus one batch) in memory. The parts are written into a hidden sibling folder that
    replaces `folder` once the set is complete (the recorded paths are the final ones)."""
    store_text = str(store or "")
    with _staged(folder, store_text) as staging:
        shards: list[Shard] = []
        pending: list[pl.DataFrame] = []
        num_pending = 0
        for frame in frames:
            pending.append(frame)
            num_pending += frame.height
            while num_pending >= max_rows:
                rows = pl.concat(pending)
                shards.append(_write_part(rows.head(max_rows), staging, folder, prefix, len(shards), store_text))
                pending, num_pending = [rows.slice(max_rows)], rows.height - max_rows
        if num_pending or not shards:
            rows = pl.concat(pending) if pending else pl.DataFrame(schema=schema)
            shards.append(_write_part(rows, staging, folder, prefix, len(shards), store_text))
        shard_set = ShardSet(folder=str(folder), shards=tuple(shards))
        _seal(staging, shard_set)
    return shard_set


@contextmanager
def _staged(folder: Path, store: str) -> Iterator[Path]:
    """A hidden sibling folder for a set's parts, which replaces `folder` once the block has
    sealed it (`_seal`); on a failure it goes, and `folder` keeps the previous set."""
    staging = folder.with_name(f".{folder.name}.tmp")
    with writing(f"shards under {store_name(folder, store)}", staging):
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
        yield staging
        _swap_in(staging, folder)


def _seal(staging: Path, shard_set: ShardSet) -> None:
    """The `_SUCCESS` file listing every part and digest: the set is complete."""
    (staging / SUCCESS_MARKER).write_text(json.dumps(shard_set.as_dicts(), indent=2) + "\n")


@dataclass(frozen=True)
class PartTask:
    """One part of a shard set, cut from files of rows (`slices`: path, first row, rows) whose
    concatenation is the set's rows in order."""

    slices: tuple[tuple[str, int, int], ...]
    staging: str
    name: str
    schema: tuple[tuple[str, pl.DataType], ...]  # the set's columns, for a part of no rows

    def frame(self) -> pl.DataFrame:
        schema = dict(self.schema)
        parts = [pl.scan_parquet(path).slice(first, rows).collect() for path, first, rows in self.slices]
        return pl.concat([pl.DataFrame(schema=schema), *parts]).cast(schema)


def write_part(task: PartTask) -> tuple[str, int]:
    """-> (sha256, rows) of the part written under `task.staging`: `write_shard_stream`'s bytes."""
    frame, path = task.frame(), Path(task.staging) / task.name
    _write_parquet(frame.rechunk(), path, compression=COMPRESSION, statistics=True, row_group_size=ROW_GROUP_ROWS)
    return file_sha256(path), frame.height


def part_tasks(files: Sequence[tuple[str, int]], staging: Path, *, prefix: str, max_rows: int, schema: Mapping) -> list[PartTask]:
    """The parts `write_shard_stream` writes from the rows of `files` (path, rows) in order: each
    a task of its own, cut from slices of those files."""
    types = tuple(schema.items())
    total = sum(rows for _, rows in files)
    bounds = [(first, min(first + max_rows, total)) for first in range(0, total, max_rows)] or [(0, 0)]
    tasks, file_index, file_first = [], 0, 0  # file_first: the first row of files[file_index]
    for part, (first, end) in enumerate(bounds):
        slices = []
        while first < end:
            path, rows = files[file_index]
            if first >= file_first + rows:
                file_index, file_first = file_index + 1, file_first + rows
                continue
            take = min(end, file_first + rows) - first
            slices.append((path, first - file_first, take))
            first += take
        tasks.append(PartTask(slices=tuple(slices), staging=str(staging), name=f"{prefix}-{part:05d}.parquet", schema=types))
    return tasks


def write_shards_in_parts(files: Sequence[tuple[str, int]], folder: Path, *, prefix: str, max_rows: int, schema: Mapping,
                          store: Path | None, run_parts: Callable[[list[PartTask]], list[tuple[str, int]]]) -> ShardSet:
    """`write_shard_stream`'s set, the same bytes, from files of rows (path, rows) already on disk:
    each part written by a task of its own (`run_parts` maps `write_part` over them, on a step's
    workers) instead of one after another by the step."""
    store_text = str(store or "")
    with _staged(folder, store_text) as staging:
        tasks = part_tasks(files, staging, prefix=prefix, max_rows=max_rows, schema=schema)
        shards = tuple(Shard(path=str(folder / task.name), sha256=sha256, num_rows=rows, store=store_text)
                       for task, (sha256, rows) in zip(tasks, run_parts(tasks)))
        shard_set = ShardSet(folder=str(folder), shards=shards)
        _seal(staging, shard_set)
    return shard_set


def _swap_in(staging: Path, folder: Path) -> None:
    """`staging` renamed to `folder`; the previous `folder`, if any, removed after."""
    retired = folder.with_name(f".{folder.name}.old")
    if retired.exists():
        shutil.rmtree(retired)
    if folder.exists():
        os.replace(folder, retired)
    os.replace(staging, folder)
    shutil.rmtree(retired, ignore_errors=True)


def _write_part(chunk: pl.DataFrame, staging: Path, folder: Path, prefix: str, part: int, store: str) -> Shard:
    name = f"{prefix}-{part:05d}.parquet"
    _write_parquet(chunk.rechunk(), staging / name, compression=COMPRESSION, statistics=True, row_group_size=ROW_GROUP_ROWS)
    return Shard(path=str(folder / name), sha256=file_sha256(staging / name), num_rows=chunk.height, store=store)


def write_table(frame: pl.DataFrame, path: Path, store: Path | None = None) -> Shard:
    """One side table (decisions, duplicates, hits) as a single Parquet file with its digest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with writing(store_name(path, store or ""), temporary):
        _write_parquet(frame, temporary, compression=COMPRESSION)
        os.replace(temporary, path)
    return Shard(path=str(path), sha256=file_sha256(path), num_rows=frame.height, store=str(store or ""))


def write_table_batches(batches: pa.RecordBatchReader, path: Path, store: Path | None = None) -> Shard:
    """`write_table` for a table that arrives a record batch at a time (a DuckDB query's result):
    one batch in memory, whatever the table's size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    num_rows = 0
    with writing(store_name(path, store or ""), temporary):
        with pq.ParquetWriter(temporary, batches.schema, compression=COMPRESSION) as writer:
            for batch in batches:
                writer.write_batch(batch, row_group_size=ROW_GROUP_ROWS)
                num_rows += batch.num_rows
        os.replace(temporary, path)
    return Shard(path=str(path), sha256=file_sha256(path), num_rows=num_rows, store=str(store or ""))


def record_batches(frames: Iterable[pl.DataFrame], schema: Mapping) -> pa.RecordBatchReader:
    """Polars frames of one schema as an Arrow stream (what DuckDB and `write_table_batches`
    read), converted a frame at a time."""
    arrow_schema = pl.DataFrame(schema=schema).to_arrow().schema
    return pa.RecordBatchReader.from_batches(arrow_schema, (b for frame in frames for b in frame.cast(schema).to_arrow().to_batches()))
