"""The spread and gather tasks (`bucket_sort`), each against what it replaced, in the same run.

1. Placement files: one per source shard, written from one ordered scan of the placement table
   (`spread_tasks`), against a filtered scan per shard (what it did before). A placement table
   of `--rows` rows (shard, shard_row, part: integers, as the exact copies' and the
   representatives' placements hold) over each of `--shards` source shard counts is built in a
   scratch DuckDB database with its default settings. Printed: seconds of each way, the ratio,
   and whether every shard's file holds the same rows.
2. Spread files: `--files` source shards of `--rows-per-file` texts of 80 words each, spread over
   `--keys` keys, written by `spread_shard` (an Arrow IPC file, a record batch per key) and by
   the Parquet `spread_shard` it replaced (a row group per key, statistics on the key alone); then a
   gather of every `keys / 20`-th key from all the files, `gathered` against a filtered scan of
   the Parquet files. Printed: CPU milliseconds per file written and per gather, one core, and
   whether every gather found the same rows.

    .venv/bin/python benchmarks/spread_tasks.py [--rows 2000000] [--shards 100 1000 4000] [--files 78] [--keys 230] [--rows-per-file 4500]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import polars as pl  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from polars.testing import assert_frame_equal  # noqa: E402

from ito_assets.data.bucket_sort import SPREAD_FILE, SpreadTask, gathered, spread_shard, spread_tasks  # noqa: E402
from ito_assets.data.config import ScaleConfig  # noqa: E402
from ito_assets.data.scratch import scratch_space, sql_list  # noqa: E402
from ito_assets.data.units import compacted, parquet_frames  # noqa: E402


def per_shard_scans(db, placement: str, folder: Path) -> list[Path]:
    """The baseline: a filtered, ordered COPY per shard."""
    paths = []
    for (shard,) in db.execute(f"SELECT DISTINCT shard FROM {placement} ORDER BY shard").fetchall():
        path = folder / f"placement-{shard:05d}.parquet"
        db.execute(f"COPY (SELECT * EXCLUDE (shard) FROM {placement} WHERE shard = {int(shard)} ORDER BY shard_row) "
                   f"TO {sql_list([str(path)])[1:-1]} (FORMAT parquet)")
        paths.append(path)
    return paths


def run(rows: int, shards: int, root: Path) -> dict:
    with scratch_space(root / f"_scratch-{shards}", ScaleConfig()) as scratch:
        db = scratch.db
        # Rows in random order, as a semi join leaves them: every shard's rows spread over the table.
        db.execute(f"""CREATE TABLE placement AS SELECT CAST(hash(i) % {shards} AS INTEGER) AS shard, i AS shard_row,
                       CAST(hash(i + 1) % 997 AS INTEGER) AS part FROM range({rows}) t(i) ORDER BY hash(i + 2)""")
        start = time.perf_counter()
        before = per_shard_scans(db, "placement", scratch.sub("before"))
        seconds_before = time.perf_counter() - start
        start = time.perf_counter()
        tasks = spread_tasks(db, "placement", [f"shard-{i}" for i in range(shards)], ["text"], "part", scratch.sub("after"), scratch.sub("spread"))
        seconds_after = time.perf_counter() - start
        same = len(before) == len(tasks)
        for path, task in zip(before, tasks):
            assert_frame_equal(pl.read_parquet(path), pl.read_parquet(task.placement_path), check_dtypes=False)
        return {"rows": rows, "shards": shards, "per_shard_scans_s": round(seconds_before, 2), "one_scan_s": round(seconds_after, 2),
                "speedup": round(seconds_before / seconds_after, 2), "same_rows": same}


def parquet_spread(task: SpreadTask) -> int:
    """The baseline `spread_shard`: the same read and join, then a Parquet row group per key,
    statistics on the key alone."""
    placement = pl.read_parquet(task.placement_path)
    found, first = [], 0
    for batch in parquet_frames([task.shard_path], list(task.columns)):
        rows = batch.with_columns(pl.int_range(first, first + batch.height, dtype=placement["shard_row"].dtype).alias("shard_row"))
        first += batch.height
        found.append(compacted(rows.join(placement, on="shard_row", how="inner").drop("shard_row")))
    rows = pl.concat(found)
    empty = rows.clear().to_arrow()
    with pq.ParquetWriter(task.output, empty.schema, compression="lz4", write_statistics=[task.key_column]) as writer:
        for group in rows.sort(task.key_column, maintain_order=True).partition_by(task.key_column, maintain_order=True):
            writer.write_table(group.to_arrow().cast(empty.schema))
    return rows.height


def spread_files(files: int, keys: int, rows_per_file: int, root: Path) -> dict:
    rng, words = random.Random(0), [f"w{i}" for i in range(5000)]
    ipc_folder, parquet_folder = root / "ipc", root / "parquet"
    ipc_folder.mkdir(), parquet_folder.mkdir()
    write_ipc = write_parquet = 0.0
    for shard in range(files):
        texts = [" ".join(rng.choices(words, k=80)) for _ in range(rows_per_file)]
        shard_path, placement_path = root / f"shard-{shard}.parquet", root / f"placement-{shard}.parquet"
        pl.DataFrame({"text": texts}).write_parquet(shard_path)
        placement = pl.DataFrame({"shard_row": range(rows_per_file), "bucket": [rng.randrange(keys) for _ in texts]},
                                 schema={"shard_row": pl.Int64, "bucket": pl.Int64})
        placement.write_parquet(placement_path)
        task = SpreadTask(shard=shard, shard_path=str(shard_path), placement_path=str(placement_path), columns=("text",),
                          key_column="bucket", output=str(ipc_folder / SPREAD_FILE.format(shard)))
        start = time.process_time()
        spread_shard(task)
        write_ipc += time.process_time() - start
        start = time.process_time()
        parquet_spread(replace(task, output=str(parquet_folder / f"spread-{shard:05d}.parquet")))
        write_parquet += time.process_time() - start
    asked = range(0, keys, max(1, keys // 20))
    start = time.process_time()
    from_ipc = [gathered(str(ipc_folder), key).sort("text") for key in asked]
    gather_ipc = time.process_time() - start
    start = time.process_time()
    from_parquet = [pl.scan_parquet(str(parquet_folder / "spread-*.parquet")).filter(pl.col("bucket") == key).collect().sort("text") for key in asked]
    gather_parquet = time.process_time() - start
    same = all(a.equals(b) for a, b in zip(from_ipc, from_parquet))
    return {"files": files, "keys": keys, "rows_per_file": rows_per_file,
            "write_ms_per_file": {"parquet": round(write_parquet / files * 1000, 1), "ipc": round(write_ipc / files * 1000, 1)},
            "gather_ms": {"parquet": round(gather_parquet / len(asked) * 1000, 1), "ipc": round(gather_ipc / len(asked) * 1000, 1)},
            "gather_speedup": round(gather_parquet / gather_ipc, 2), "same_rows": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--shards", type=int, nargs="+", default=[100, 1000, 4000])
    parser.add_argument("--files", type=int, default=78)
    parser.add_argument("--keys", type=int, default=230)
    parser.add_argument("--rows-per-file", type=int, default=4500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        for shards in args.shards:
            print(run(args.rows, shards, Path(root)), flush=True)
        print(spread_files(args.files, args.keys, args.rows_per_file, Path(root)), flush=True)


if __name__ == "__main__":
    main()
