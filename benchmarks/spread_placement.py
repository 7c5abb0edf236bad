"""The spread tasks' placement files written from one ordered scan of the placement table, against
a scan per source shard (what `bucket_sort.spread_tasks` did before), in the same run.

A placement table of `--rows` rows (shard, shard_row, part: integers, as the exact copies' and the
representatives' placements hold) over `--shards` source shards is built in a scratch DuckDB
database with its default settings; each way then writes one Parquet file per shard with rows. Printed per
shard count: seconds of each way, the ratio, and whether every shard's file holds the same rows.

    .venv/bin/python benchmarks/spread_placement.py [--rows 2000000] [--shards 100 1000 4000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import polars as pl  # noqa: E402
from polars.testing import assert_frame_equal  # noqa: E402

from ito_assets.data.bucket_sort import spread_tasks  # noqa: E402
from ito_assets.data.config import ScaleConfig  # noqa: E402
from ito_assets.data.scratch import scratch_space, sql_list  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--shards", type=int, nargs="+", default=[100, 1000, 4000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        for shards in args.shards:
            print(run(args.rows, shards, Path(root)), flush=True)


if __name__ == "__main__":
    main()
