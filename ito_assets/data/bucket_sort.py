"""Source rows in an order computed on ids, without sorting text in DuckDB: an external bucket sort.

DuckDB orders what is small (ids, hashes, byte counts) and writes a placement table: for every
row to be ordered, its shard, its position in that shard (`shard_row`), its `rank` in the wanted
order and its `bucket`, a run of consecutive ranks holding about `bucket_bytes` of text (a
cumulative sum of the byte counts in rank order). One pass over the source shards, a batch at a time, appends each
row, with its rank, to its bucket's file; each bucket is then small enough to sort in memory,
and the buckets read in turn are the rows in rank order.

Why not let DuckDB sort the rows: measured in benchmarks/data_scaling.py, its keep-order sort of
the text held its 128 MB cap plus ~100 MB that its allocator kept until the connection closed,
and a sort of every column ran out of memory at 64x the fixtures. Here memory is one source
batch, one bucket and a small buffer per open bucket file; at most `fan_out` bucket files are
open at once (more buckets are sorted in two or more passes, `fan_out` at a time).

On a pool (several workers, or Ray) the same placement is spread instead: each source shard is a
task (`spread_shard`) that writes its placed rows to one Arrow IPC file, a record batch per key (a
bucket, a hash partition) and the keys present in its schema's metadata, and each key's task
reads its own batch of every such file (`gathered`). So every key's task reads every file's
footer: right for up to some thousands of source shards and keys; beyond that a gather per range
of keys would be needed (not built). Why IPC and not Parquet row groups, measured
(benchmarks/spread_tasks.py: 78 files of 4,500 texts over 230 keys, one core): a key's gather
took 34 ms from Parquet, every footer's row-group metadata decoded, against 9 ms; writing a file
45 against 41 ms.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from ito_assets.data.units import READ_BATCH_ROWS, compacted, parquet_frames

# Open bucket files in one pass: far under the usual limit of 1,024 file descriptors, and each
# open Arrow stream writer costs only its file handle (its batches go straight to the file).
FAN_OUT = 256
# Scratch data read back once: lz4, fast over small (as the work units).
IPC_OPTIONS = ipc.IpcWriteOptions(compression="lz4")
# A source shard's spread file, in its phase's folder, and the metadata key of the keys it holds
# (int64, ascending: its record batches' keys, in order).
SPREAD_FILE = "spread-{:05d}.arrow"
SPREAD_FILES = "spread-*.arrow"
SPREAD_KEYS = b"ito.spread_keys"

PLACEMENT_SQL = """
CREATE OR REPLACE TABLE {name} AS
SELECT shard, shard_row, {extra} row_number() OVER w - 1 AS rank,
       CAST((sum(num_bytes) OVER w - num_bytes) // {bucket_bytes} AS BIGINT) AS bucket
FROM ({rows}) WINDOW w AS (ORDER BY {order_by} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
"""


def place(db: duckdb.DuckDBPyConnection, name: str, rows: str, order_by: str, bucket_bytes: int, extra: Sequence[str] = ()) -> int:
    """Table `name` (shard, shard_row, *extra, rank, bucket) for the rows of query `rows` (which
    has shard, shard_row, num_bytes and the `order_by` columns), ranked by `order_by`, which must
    be unique per row; -> the number of buckets. Only integers are sorted: the text stays in the shards."""
    columns = "".join(f"{c}, " for c in extra)
    db.execute(PLACEMENT_SQL.format(name=name, extra=columns, rows=rows, order_by=order_by, bucket_bytes=int(bucket_bytes)))
    last = db.execute(f"SELECT max(bucket) FROM {name}").fetchone()[0]
    return 0 if last is None else int(last) + 1


def placements_by_shard(db: duckdb.DuckDBPyConnection, name: str) -> Iterator[tuple[int, pl.DataFrame]]:
    """(shard, its placement less `shard`, in shard_row order) for every shard with placed rows,
    from one ordered scan of table `name` (a scan per shard would read the table once per shard).
    A shard's placement (integers) is held whole; the scan runs on a cursor of its own."""
    cursor = db.cursor()
    try:
        current, pending = None, []
        for batch in cursor.execute(f"SELECT * FROM {name} ORDER BY shard, shard_row").fetch_record_batch(READ_BATCH_ROWS):
            for (shard,), rows in pl.from_arrow(batch).partition_by("shard", as_dict=True, maintain_order=True).items():
                if shard != current and pending:
                    yield current, pl.concat(pending).drop("shard")
                    pending = []
                current = shard
                pending.append(rows)
        if pending:
            yield current, pl.concat(pending).drop("shard")
    finally:
        cursor.close()


def placed_rows(db: duckdb.DuckDBPyConnection, name: str, shard_paths: Sequence[str], columns: list[str]) -> Iterator[pl.DataFrame]:
    """The placed rows of every shard, `columns` plus the placement's own (rank, bucket, extras),
    in shard order, a batch at a time."""
    for shard, placement in placements_by_shard(db, name):
        first = 0
        for batch in parquet_frames([shard_paths[shard]], columns):
            rows = batch.with_columns(pl.int_range(first, first + batch.height, dtype=placement["shard_row"].dtype).alias("shard_row"))
            first += batch.height
            yield rows.join(placement, on="shard_row", how="inner").drop("shard_row")


def bucket_sort(frames: Iterable[pl.DataFrame], folder: Path, num_buckets: int, fan_out: int = FAN_OUT) -> Iterator[pl.DataFrame]:
    """Frames with `rank` and `bucket` (0 .. num_buckets - 1, non-decreasing in rank) -> the same
    rows ordered by rank, one bucket at a time (the `bucket` column dropped)."""
    folder.mkdir(parents=True, exist_ok=True)
    width = -(-num_buckets // fan_out)  # buckets per file in this pass: 1 when they all fit
    paths = _spread(frames, folder, pl.col("bucket") // width)
    for part, path in enumerate(paths):
        if not path.exists():
            continue
        if width == 1:
            yield pl.read_ipc_stream(path).sort("rank").drop("bucket")
        else:  # a run of `width` buckets, sorted in further passes of its own
            shifted = (frame.with_columns(pl.col("bucket") - part * width) for frame in _stream(path))
            yield from bucket_sort(shifted, folder / f"pass-{part:05d}", width, fan_out)
        path.unlink()


def _spread(frames: Iterable[pl.DataFrame], folder: Path, key: pl.Expr) -> list[Path]:
    """Append each frame's rows to the file of their `key` (an Arrow stream per key) -> the
    files by key (a key with no rows has no file)."""
    writers: dict[int, ipc.RecordBatchStreamWriter] = {}
    try:
        for frame in frames:
            for (k,), part in frame.with_columns(key.alias("_key")).partition_by("_key", as_dict=True, include_key=False).items():
                table = part.to_arrow()
                if k not in writers:
                    writers[k] = ipc.new_stream(str(folder / f"bucket-{k:05d}.arrows"), table.schema, options=IPC_OPTIONS)
                writers[k].write_table(table)
    finally:
        for writer in writers.values():
            writer.close()
    return [folder / f"bucket-{k:05d}.arrows" for k in range(max(writers, default=-1) + 1)]


def _stream(path: Path) -> Iterator[pl.DataFrame]:
    """A bucket file's rows a few record batches at a time (never the whole file)."""
    with pa.OSFile(str(path)) as source:
        reader = ipc.open_stream(source)
        pending: list[pa.RecordBatch] = []
        num_pending = 0
        for batch in reader:
            pending.append(batch)
            num_pending += batch.num_rows
            if num_pending >= READ_BATCH_ROWS:
                yield pl.from_arrow(pa.Table.from_batches(pending))
                pending, num_pending = [], 0
        if pending:
            yield pl.from_arrow(pa.Table.from_batches(pending))


@dataclass(frozen=True)
class SpreadTask:
    """One source shard's placed rows (`placement_path`: shard_row, `key` and the placement's other
    columns), with `columns` of the shard, to `output`, a row group per value of `key`."""

    shard: int
    shard_path: str
    placement_path: str
    columns: tuple[str, ...]
    key_column: str
    output: str

    def key(self) -> dict:
        return {"shard": self.shard, "columns": list(self.columns), "by": self.key_column}

    def inputs(self) -> tuple[str, ...]:
        return (self.shard_path, self.placement_path)

    def outputs(self) -> tuple[str, ...]:
        return (self.output,)


def spread_tasks(db: duckdb.DuckDBPyConnection, placement: str, shard_paths: Sequence[str], columns: Sequence[str],
                 key_column: str, placements: Path, outputs: Path) -> list[SpreadTask]:
    """A task for every source shard with rows in table `placement` (shard, shard_row, key_column,
    ...), its placement written under `placements` (in shard_row order, integers and ids only)."""
    tasks = []
    for shard, rows in placements_by_shard(db, placement):
        path = placements / f"placement-{shard:05d}.parquet"
        rows.write_parquet(path)
        tasks.append(SpreadTask(shard=shard, shard_path=shard_paths[shard], placement_path=str(path),
                                columns=tuple(columns), key_column=key_column, output=str(outputs / SPREAD_FILE.format(shard))))
    return tasks


def spread_shard(task: SpreadTask) -> int:
    """-> the rows written: the shard's placed rows, read a batch at a time, with their placement
    (less shard_row), sorted by key, a record batch per key (so that a key's task reads only its
    own). A shard's placed rows are held together: at most the shard."""
    placement = pl.read_parquet(task.placement_path)
    shard_schema = pl.read_parquet_schema(task.shard_path)
    schema = {**{c: shard_schema[c] for c in task.columns}, **{c: t for c, t in placement.schema.items() if c != "shard_row"}}
    found, first = [], 0
    for batch in parquet_frames([task.shard_path], list(task.columns)):
        rows = batch.with_columns(pl.int_range(first, first + batch.height, dtype=placement["shard_row"].dtype).alias("shard_row"))
        first += batch.height
        found.append(compacted(rows.join(placement, on="shard_row", how="inner").drop("shard_row")))
    rows = pl.concat(found).select(list(schema)).cast(schema) if found else pl.DataFrame(schema=schema)
    groups = rows.sort(task.key_column, maintain_order=True).partition_by(task.key_column, maintain_order=True) if rows.height else []
    keys = np.array([group[task.key_column][0] for group in groups], dtype=np.int64)
    arrow_schema = pl.DataFrame(schema=schema).to_arrow().schema.with_metadata({SPREAD_KEYS: keys.tobytes()})
    with ipc.new_file(task.output, arrow_schema, options=IPC_OPTIONS) as writer:
        for group in groups:
            writer.write_table(group.to_arrow().cast(arrow_schema))
    return rows.height


@dataclass(frozen=True)
class GatherTask:
    """One key's rows, read from every spread file in `spread_folder` (`spread`: their markers'
    digest, which vouches for what they hold), to `files`. The folder, not a list of its files: a
    task stays a few hundred bytes however many source shards were spread."""

    key_value: int
    spread_folder: str
    spread: str
    files: tuple[str, ...]

    def key(self) -> dict:
        return {"key": self.key_value, "spread": self.spread}

    def inputs(self) -> tuple[str, ...]:
        return ()

    def outputs(self) -> tuple[str, ...]:
        return self.files


def gathered(spread_folder: str, key: int) -> pl.DataFrame:
    """The rows of one key from every spread file of the folder (a footer and the key's batch of
    each are read). After its phase, the folder holds exactly its tasks' files: the phase's
    markers removed any other before it ran."""
    batches, schema = [], None
    for path in sorted(Path(spread_folder).glob(SPREAD_FILES)):
        with pa.OSFile(str(path)) as source:
            reader = ipc.open_file(source)
            schema = reader.schema
            keys = np.frombuffer(schema.metadata[SPREAD_KEYS], dtype=np.int64)
            at = int(np.searchsorted(keys, key))
            if at < len(keys) and keys[at] == key:
                batches.append(reader.get_batch(at))
    if schema is None:
        raise FileNotFoundError(f"no spread file in {spread_folder}")
    return pl.from_arrow(pa.Table.from_batches(batches, schema=schema.remove_metadata()))
