"""The external bucket sort: source rows in an order DuckDB computes on integers, one bucket in memory."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from ito_assets.data import bucket_sort as bucket_sort_module
from ito_assets.data.bucket_sort import bucket_sort, place, placed_rows
from ito_assets.data.config import ScaleConfig
from ito_assets.data.dedup_units import written_aside
from ito_assets.data.scratch import scratch_space
from ito_assets.data.shards import write_shards

SCALE = ScaleConfig(memory_limit_mb=128)


def _shards(tmp_path: Path, n: int, rows_per_shard: int) -> tuple[pl.DataFrame, list[str]]:
    """Rows (doc_id, key, text) in a shuffled key order, written as several shards."""
    rng = random.Random(0)
    keys = list(range(n))
    rng.shuffle(keys)
    rows = pl.DataFrame({"doc_id": [f"d{k:04d}" for k in keys], "key": keys, "text": ["x" * rng.randint(0, 50) for _ in keys]})
    shards = write_shards(rows, tmp_path / "source", prefix="s", max_rows=rows_per_shard)
    return rows, [s.path for s in shards.shards]


def _positions(rows: pl.DataFrame, rows_per_shard: int) -> pl.DataFrame:
    """What the placement query reads: each row's shard, position in it, bytes and sort key."""
    return rows.with_row_index("i").select(
        (pl.col("i") // rows_per_shard).cast(pl.Int32).alias("shard"),
        (pl.col("i") % rows_per_shard).cast(pl.Int64).alias("shard_row"),
        pl.col("text").str.len_bytes().cast(pl.Int64).alias("num_bytes"),
        "key",
    )


@pytest.mark.parametrize("fan_out", [256, 3])
def test_rows_come_back_in_the_placement_order_whatever_the_fan_out(tmp_path: Path, fan_out: int) -> None:
    rows, paths = _shards(tmp_path, 300, 70)
    with scratch_space(tmp_path / "_scratch", SCALE) as scratch:
        scratch.db.register("positions", _positions(rows, 70).to_arrow())
        # Only the rows with an even key, ordered by key descending; buckets of ~200 bytes.
        num_buckets = place(scratch.db, "placement", "SELECT * FROM positions WHERE key % 2 = 0", "key DESC", 200, extra=("key",))
        frames = list(bucket_sort(placed_rows(scratch.db, "placement", paths, ["doc_id", "text"]), tmp_path / "buckets", num_buckets, fan_out=fan_out))
    expected = rows.filter(pl.col("key") % 2 == 0).sort("key", descending=True)
    assert num_buckets > fan_out or fan_out == 256
    assert len(frames) == num_buckets  # one frame per bucket: never more than a bucket in memory
    got = pl.concat(frames)
    assert got["rank"].to_list() == list(range(expected.height))
    assert_frame_equal(got.select("doc_id", "key", "text"), expected.select("doc_id", "key", "text"))


def test_buckets_hold_about_bucket_bytes_of_text(tmp_path: Path) -> None:
    rows, paths = _shards(tmp_path, 200, 50)
    with scratch_space(tmp_path / "_scratch", SCALE) as scratch:
        scratch.db.register("positions", _positions(rows, 50).to_arrow())
        num_buckets = place(scratch.db, "placement", "SELECT * FROM positions", "key", 300)
        frames = list(bucket_sort(placed_rows(scratch.db, "placement", paths, ["text"]), tmp_path / "buckets", num_buckets))
    sizes = [int(f["text"].str.len_bytes().sum()) for f in frames]
    # A bucket starts where the bytes before it first reach a multiple of 300: at most one text over.
    assert all(size <= 300 + 50 for size in sizes) and sum(sizes) == int(rows["text"].str.len_bytes().sum())
    assert all(size >= 300 - 50 for size in sizes[:-1])


def test_nothing_placed_sorts_to_nothing(tmp_path: Path) -> None:
    rows, paths = _shards(tmp_path, 20, 10)
    with scratch_space(tmp_path / "_scratch", SCALE) as scratch:
        scratch.db.register("positions", _positions(rows, 10).to_arrow())
        num_buckets = place(scratch.db, "placement", "SELECT * FROM positions WHERE key < 0", "key", 100)
        assert num_buckets == 0
        assert list(bucket_sort(placed_rows(scratch.db, "placement", paths, ["text"]), tmp_path / "buckets", num_buckets)) == []


def test_reconnect_keeps_the_tables_and_the_settings(tmp_path: Path) -> None:
    with scratch_space(tmp_path / "_scratch", SCALE) as scratch:
        scratch.db.execute("CREATE TABLE t AS SELECT 42 AS x")
        before = scratch.db
        scratch.reconnect()
        assert scratch.db is not before
        assert scratch.db.execute("SELECT x FROM t").fetchone() == (42,)
        assert scratch.db.execute("SELECT current_setting('memory_limit')").fetchone()[0] == "122.0 MiB"


def test_written_aside_passes_frames_on_and_keeps_them(tmp_path: Path) -> None:
    frames = [pl.DataFrame({"a": [1, 2]}), pl.DataFrame({"a": [3]})]
    passed = list(written_aside(iter(frames), tmp_path / "aside.parquet"))
    assert all(p is f for p, f in zip(passed, frames))
    assert_frame_equal(pl.read_parquet(tmp_path / "aside.parquet"), pl.concat(frames))
    assert list(written_aside(iter([]), tmp_path / "none.parquet")) == [] and not (tmp_path / "none.parquet").exists()


@pytest.mark.parametrize("batch_rows", [1, 7, 8192])
def test_one_scan_gives_each_shard_its_own_placement_in_row_order(tmp_path: Path, monkeypatch, batch_rows: int) -> None:
    """Batches of the ordered scan cut through shards (1 and 7 rows) or hold them all: each shard
    with placed rows still comes once, whole, in shard order; a shard with none does not come."""
    monkeypatch.setattr(bucket_sort_module, "READ_BATCH_ROWS", batch_rows)
    rng = random.Random(11)
    rows = [(shard, row, rng.randrange(5)) for shard in (0, 1, 3, 4, 9) for row in rng.sample(range(100), rng.randrange(1, 30))]
    rng.shuffle(rows)
    with scratch_space(tmp_path / "_scratch", ScaleConfig()) as scratch:
        scratch.db.execute("CREATE TABLE placement (shard INTEGER, shard_row BIGINT, part INTEGER)")
        scratch.db.executemany("INSERT INTO placement VALUES (?, ?, ?)", rows)
        found = list(bucket_sort_module.placements_by_shard(scratch.db, "placement"))
        assert [shard for shard, _ in found] == [0, 1, 3, 4, 9]
        for shard, placement in found:
            expected = scratch.db.execute(f"SELECT shard_row, part FROM placement WHERE shard = {shard} ORDER BY shard_row").pl()
            assert_frame_equal(placement, expected)
        scratch.db.execute("DELETE FROM placement")
        assert list(bucket_sort_module.placements_by_shard(scratch.db, "placement")) == []


def test_a_key_s_gather_reads_its_batch_of_every_spread_file(tmp_path: Path) -> None:
    """Three source shards: one with keys 0 and 2, one with 2 and 5, one with no placed row (its
    spread file holds no batch). A key's rows come from every file that has it, none from the
    others; a key no file has gives no rows, with the spread's columns."""
    placements = {0: {0: 2, 1: 0, 3: 2}, 1: {0: 5, 2: 2}, 2: {}}
    spread = tmp_path / "spread"
    spread.mkdir()
    for shard, placed in placements.items():
        texts = [f"shard {shard} row {row}" for row in range(4)]
        pl.DataFrame({"text": texts}).write_parquet(tmp_path / f"shard-{shard}.parquet")
        pl.DataFrame({"shard_row": list(placed), "part": list(placed.values())}, schema={"shard_row": pl.Int64, "part": pl.Int32}) \
            .write_parquet(tmp_path / f"placement-{shard}.parquet")
        task = bucket_sort_module.SpreadTask(shard=shard, shard_path=str(tmp_path / f"shard-{shard}.parquet"),
                                             placement_path=str(tmp_path / f"placement-{shard}.parquet"), columns=("text",),
                                             key_column="part", output=str(spread / bucket_sort_module.SPREAD_FILE.format(shard)))
        assert bucket_sort_module.spread_shard(task) == len(placed)
    gathered = {key: bucket_sort_module.gathered(str(spread), key).sort("text") for key in range(7)}
    assert gathered[2]["text"].to_list() == ["shard 0 row 0", "shard 0 row 3", "shard 1 row 2"]
    assert gathered[0]["text"].to_list() == ["shard 0 row 1"] and gathered[5]["text"].to_list() == ["shard 1 row 0"]
    for key in (1, 3, 4, 6):
        assert gathered[key].height == 0 and gathered[key].schema == {"text": pl.String, "part": pl.Int32}
    assert set(gathered[2]["part"].to_list()) == {2}
