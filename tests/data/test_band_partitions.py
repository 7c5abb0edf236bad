"""The LSH band join in hash partitions: every partition count gives the one-partition decisions
and counters, each candidate pair is settled by exactly one partition, and a rerun redoes only the
partitions that did not finish."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from ito_assets.data import band_join, dedup_units
from ito_assets.data.band_join import (MAX_PARTITIONS, AnchorBounds, BoundTask, anchor_bounds, candidate_batches, num_partitions, owned,
                                      partition_of, write_band_rows)
from ito_assets.data.config import DedupConfig, ScaleConfig
from ito_assets.data.dedup_units import deduplicate_units
from ito_assets.data.near_dedup import band_keys, band_rows, candidate_pairs
from ito_assets.data.scratch import FINISHED, scratch_space
from ito_assets.data.shards import write_shards
from ito_assets.errors import ItoError
from reference_impl import deduplicate
from test_dedup_units import TINY, corpus


def scale(partition_rows: int, num_workers: int = 1) -> ScaleConfig:
    return ScaleConfig(unit_bytes=TINY.unit_bytes, pair_batch=TINY.pair_batch, memory_limit_mb=128, num_workers=num_workers, partition_rows=partition_rows, in_memory_mb=0)


def test_one_partition_per_partition_rows_band_rows_and_one_per_worker_at_least() -> None:
    bands = 20
    assert num_partitions(0, bands, scale(100)) == 1
    assert num_partitions(5, bands, scale(100)) == 1  # exactly 100 band rows
    assert num_partitions(5, bands, scale(99)) == 2  # one row more than a partition holds
    assert num_partitions(5, bands, scale(101)) == 1
    assert num_partitions(5, bands, scale(100, num_workers=3)) == 3
    assert num_partitions(10**9, bands, scale(1)) == MAX_PARTITIONS


def test_each_partition_s_duckdb_shares_the_step_s_cap_down_to_duckdb_s_floor() -> None:
    assert ScaleConfig(memory_limit_mb=512, num_workers=4).partition_memory_mb == 128
    assert ScaleConfig(memory_limit_mb=512, num_workers=3).partition_memory_mb == 170
    assert ScaleConfig(memory_limit_mb=512, num_workers=5).partition_memory_mb == 128  # 102 is under the floor
    with pytest.raises(ValueError, match="partition_rows"):
        ScaleConfig(partition_rows=0)


def test_partitions_cover_the_key_space_evenly() -> None:
    keys = np.random.default_rng(0).integers(0, 2**64 - 1, size=200_000, dtype=np.uint64, endpoint=True)
    keys[:2] = [0, 2**64 - 1]
    for count in (1, 2, 7, MAX_PARTITIONS):
        parts = partition_of(keys, count)
        assert parts.min() == 0 and parts.max() == count - 1
    sizes = np.bincount(partition_of(keys, 7), minlength=7)
    assert sizes.min() > 0.97 * sizes.mean() and sizes.max() < 1.03 * sizes.mean()


def test_a_unit_s_band_file_has_one_row_group_per_partition(tmp_path: Path) -> None:
    signatures = np.random.default_rng(1).integers(0, 1_000, size=(50, 12), dtype=np.uint32)
    rows = band_rows(signatures, 4, 3).with_columns(pl.lit(0, dtype=pl.Int32).alias("unit"))
    path = str(tmp_path / "bands.parquet")
    assert write_band_rows(rows, path, 5) == 200
    metadata = pq.ParquetFile(path).metadata
    assert metadata.num_row_groups == 5
    parts = partition_of(rows["key"].to_numpy(), 5)
    db = duckdb.connect()
    for p in range(5):
        got = db.execute(f"SELECT doc, band, key FROM read_parquet('{path}') WHERE part = {p}").pl().sort("doc", "band")
        assert got.height == metadata.row_group(p).num_rows
        assert_frame_equal(got, rows.filter(pl.Series(parts == p)).select("doc", "band", "key").sort("doc", "band"))
    empty = str(tmp_path / "empty.parquet")
    assert write_band_rows(rows.clear(), empty, 5) == 0
    assert db.execute(f"SELECT count(*) FROM read_parquet('{empty}') WHERE part = 0").fetchone() == (0,)


@pytest.mark.parametrize("anchors", [0, 3])
@pytest.mark.parametrize("partitions", [1, 3, 8])
def test_every_candidate_pair_is_owned_by_exactly_one_partition(tmp_path: Path, partitions: int, anchors: int) -> None:
    rng = np.random.default_rng(0)
    # Small slot values make pairs that share several bands, in several partitions, and buckets
    # of about 11 members: with 3 anchors, the partition of the first band that paired a pair owns
    # it, which may hold it past another partition's anchors (read from the first phase's bounds).
    signatures = rng.integers(0, 3, size=(300, 12), dtype=np.uint32)
    signatures[::17] = np.uint32(0xFFFFFFFF)
    config = DedupConfig(bands=4, rows=3, num_perm=12, bucket_anchors=anchors)
    a, b = candidate_pairs(signatures, 4, 3, anchors)
    keys = band_keys(signatures, 4, 3)
    assert np.any(np.unique(partition_of(keys, partitions), axis=1).shape[1] > 1) or partitions == 1
    files = []
    for i, start in enumerate(range(0, 300, 64)):
        path = str(tmp_path / f"bands-{i}.parquet")
        rows = band_rows(signatures[start : start + 64], 4, 3, first=start).with_columns(pl.lit(i, dtype=pl.Int32).alias("unit"))
        write_band_rows(rows, path, partitions)
        files.append(path)
    bounds = None
    if anchors:  # every partition's buckets past their anchors, as the first phase writes them
        tasks = [BoundTask(partition=p, num_partitions=partitions, band_files=tuple(files), anchors=anchors, arrays_digest="",
                           bounds_path=str(tmp_path / f"bounds-{p}.parquet"), memory_limit_mb=128, spill=str(tmp_path / f"spill-{p}"))
                 for p in range(partitions)]
        assert sum(anchor_bounds(task) for task in tasks) > 0
        bounds = AnchorBounds.read([task.bounds_path for task in tasks], 4)
    settled, seen = [], 0
    for p in range(partitions):
        for x, y, band in candidate_batches(duckdb.connect(), files, 500, None if partitions == 1 else p, anchors):
            seen += len(x)
            mine = owned(signatures, x, y, band, config, x, bounds)
            settled.append(np.stack([x[mine], y[mine]], axis=1))
    got = np.concatenate(settled)
    got = got[np.lexsort((got[:, 0], got[:, 1]))]
    assert np.array_equal(got, np.stack([a, b], axis=1))  # each pair once, none missing
    assert (seen > len(a)) == (partitions > 1)  # pairs shared across partitions were seen twice


@pytest.mark.parametrize("partition_rows, num_workers", [(10**9, 1), (300, 1), (97, 2), (60, 1)])
def test_partitioned_band_join_gives_the_in_memory_decisions_and_counts(tmp_path: Path, partition_rows: int, num_workers: int) -> None:
    docs = corpus()
    expected, expected_counts = deduplicate(docs, DedupConfig())
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=37)
    with scratch_space(tmp_path / "_scratch", scale(partition_rows, num_workers)) as scratch:
        table, counts = deduplicate_units(scratch, shards.shards, DedupConfig(), tmp_path / "decisions.parquet")
        pairs = sorted((tmp_path / FINISHED / "dedup-pairs").glob("pairs-*.parquet"))
    expected_partitions = num_partitions(expected_counts.exact.num_distinct_texts, DedupConfig().bands, scale(partition_rows, num_workers))
    assert len(pairs) == expected_partitions and (expected_partitions > 1) == (partition_rows < 10**9 or num_workers > 1)
    assert_frame_equal(pl.read_parquet(table.path), expected)
    assert counts == expected_counts


PARTITION_PAIRS = band_join.partition_pairs


def _counting(calls: list[int], fail_at: int | None = None):
    original = PARTITION_PAIRS

    @functools.wraps(original)  # the marker's key names the function: the wrapper keeps its name
    def wrapper(task):
        calls.append(task.partition)
        if task.partition == fail_at:
            raise OSError("No space left on device")
        return original(task)
    return wrapper


def test_a_rerun_redoes_only_the_partitions_that_did_not_finish(tmp_path: Path, monkeypatch) -> None:
    shards = write_shards(corpus(), tmp_path / "source", prefix="d", max_rows=37).shards

    def run(folder: Path):
        with scratch_space(folder / "_scratch", scale(300)) as scratch:
            return deduplicate_units(scratch, shards, DedupConfig(), folder / "decisions.parquet")

    reference, reference_counts = run(tmp_path / "reference")
    calls: list[int] = []
    monkeypatch.setattr(band_join, "partition_pairs", _counting(calls, fail_at=2))
    with pytest.raises(ItoError):  # the disk filled at partition 2; space came back after
        run(tmp_path / "run")
    assert calls == [0, 1, 2]
    calls.clear()
    monkeypatch.setattr(band_join, "partition_pairs", _counting(calls))
    table, counts = run(tmp_path / "run")
    assert calls[0] == 2 and len(calls) >= 2
    assert Path(table.path).read_bytes() == Path(reference.path).read_bytes() and counts == reference_counts


def test_a_rerun_with_another_partition_count_computes_the_signature_units_again(tmp_path: Path, monkeypatch) -> None:
    shards = write_shards(corpus(), tmp_path / "source", prefix="d", max_rows=37).shards
    signatures: list[int] = []
    original = dedup_units.signature_unit

    @functools.wraps(original)  # the marker's key names the function: the wrapper keeps its name
    def counted(task):
        signatures.append(task.unit.index)
        return original(task)

    monkeypatch.setattr(dedup_units, "signature_unit", counted)
    monkeypatch.setattr(band_join, "partition_pairs", _counting([], fail_at=2))
    with pytest.raises(ItoError), scratch_space(tmp_path / "_scratch", scale(300)) as scratch:
        deduplicate_units(scratch, shards, DedupConfig(), tmp_path / "decisions.parquet")
    num_units = len(signatures)
    signatures.clear()
    monkeypatch.setattr(band_join, "partition_pairs", PARTITION_PAIRS)
    with scratch_space(tmp_path / "_scratch", scale(200)) as scratch:  # another partition count
        table, counts = deduplicate_units(scratch, shards, DedupConfig(), tmp_path / "decisions.parquet")
    assert num_units > 3 and signatures == list(range(num_units))
    expected, expected_counts = deduplicate(corpus(), DedupConfig())
    assert_frame_equal(pl.read_parquet(table.path), expected)
    assert counts == expected_counts


KILLED_STEP = """
import os, signal, sys
sys.path[:0] = {paths!r}
from pathlib import Path
from ito_assets.data import band_join, dedup_units
from ito_assets.data.dedup_units import deduplicate_units
from ito_assets.data.config import DedupConfig
from ito_assets.data.scratch import scratch_space
from ito_assets.data.shards import Shard
from test_band_partitions import scale
original = band_join.partition_pairs
def dies(task):
    if task.partition == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(task)
dies.__module__, dies.__qualname__ = original.__module__, original.__qualname__
band_join.partition_pairs = dies
with scratch_space(Path({root!r}) / "_scratch", scale(300)) as scratch:
    deduplicate_units(scratch, {shards!r}, DedupConfig(), Path({root!r}) / "decisions.parquet")
"""


def test_a_step_killed_in_the_band_join_keeps_its_finished_partitions_for_the_rerun(tmp_path: Path, monkeypatch) -> None:
    shards = write_shards(corpus(), tmp_path / "source", prefix="d", max_rows=37).shards
    here = Path(__file__).resolve().parent
    run = tmp_path / "run"
    code = KILLED_STEP.format(paths=[str(here), str(here.parent)], root=str(run), shards=shards)
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    assert sorted(p.name for p in (run / FINISHED / "dedup-pairs").glob("marker-*.json")) == ["marker-00000.json", "marker-00001.json"]
    calls: list[int] = []
    monkeypatch.setattr(band_join, "partition_pairs", _counting(calls))
    with scratch_space(run / "_scratch", scale(300)) as scratch:
        table, counts = deduplicate_units(scratch, shards, DedupConfig(), run / "decisions.parquet")
    assert calls[0] == 2 and len(calls) >= 2
    expected, expected_counts = deduplicate(corpus(), DedupConfig())
    assert_frame_equal(pl.read_parquet(table.path), expected)
    assert counts == expected_counts
