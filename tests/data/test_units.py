"""Work units sized by bytes, the worker pool, the scratch space and the streamed shard writer."""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from ito_assets.data.config import ScaleConfig
from ito_assets.data.scratch import scratch_space
from ito_assets.data.shards import Shard, write_shard_stream, write_shards
from ito_assets.data.units import compacted, map_units, parquet_frames, shard_units, worker_pool, write_units
from ito_assets.digests import file_sha256
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.training.layout import PlanRefused


def _docs(sizes: list[int]) -> pl.DataFrame:
    return pl.DataFrame({"doc_id": [f"d{i:03d}" for i in range(len(sizes))], "text": ["x" * n for n in sizes]})


def test_units_close_on_the_document_that_crosses_the_target(tmp_path: Path) -> None:
    docs = _docs([40, 70, 10, 100, 5, 5, 300, 1])
    # Arriving in awkward batches must not change where units are cut.
    batches = [docs.slice(0, 3), docs.slice(3, 1), docs.slice(4, 4)]
    units = write_units(batches, tmp_path, target_bytes=100)
    assert [u.num_docs for u in units] == [2, 2, 3, 1]
    assert [u.num_bytes for u in units] == [110, 110, 310, 1]
    assert [u.first for u in units] == [0, 2, 4, 7]
    assert_frame_equal(pl.concat([u.read() for u in units]), docs)


def test_no_documents_no_units(tmp_path: Path) -> None:
    assert write_units([_docs([]).cast({"text": pl.String})], tmp_path, target_bytes=10) == ()


def test_a_pool_of_two_workers_returns_results_in_task_order() -> None:
    tasks = list(range(-20, 0))
    with worker_pool(2) as pool:
        assert pool is not None
        assert map_units(abs, tasks, pool, phase="test") == [abs(t) for t in tasks]
    with worker_pool(1) as pool:
        assert pool is None and map_units(abs, tasks, pool, phase="test") == [abs(t) for t in tasks]


def test_a_pool_opened_inside_a_pool_of_the_same_workers_is_that_pool() -> None:
    # A stage opens its pool once; the phases it calls, which open their own when called alone,
    # join it instead of starting more worker processes.
    with worker_pool(2) as outer:
        with worker_pool(2) as inner:
            assert inner is outer
        with worker_pool(3) as other:
            assert other is not outer and map_units(abs, [-1, -2], other, phase="test") == [1, 2]
        with worker_pool(1) as one:
            assert one is None
        with worker_pool(2) as again:
            assert again is outer  # still open: the inner pools' ends did not close or forget it
    with worker_pool(2) as after:
        assert after is not outer  # a pool that ended is never handed out again


def refuse_negative(value: int) -> int:
    if value < 0:
        raise PlanRefused((), f"task {value} refused")
    if value == 0:
        raise ItoError(ErrorCode.SHARD_CORRUPT, "shard 0 does not hash to its recorded digest")
    return value


@pytest.mark.parametrize("tasks,code", [([1, 0, 2], ErrorCode.SHARD_CORRUPT), ([1, -3], ErrorCode.PLAN_REFUSED)])
def test_a_workers_error_reaches_the_step_with_its_code(tasks, code) -> None:
    # A worker process sends its exception back pickled: the step must see the same error, not
    # a broken pool or a TypeError from rebuilding it.
    with worker_pool(2) as pool, pytest.raises(ItoError) as caught:
        map_units(refuse_negative, tasks, pool, phase="test")
    assert caught.value.code is code and caught.value.message.startswith(("task -3", "shard 0"))
    assert caught.value.retryable is False


def fail_first_touch_others(path: str) -> None:
    """A task: the first fails at once, every other writes its file after 200 ms (long beside the
    step's reaction to the failure, even on a loaded machine: 50 ms let 11 run there)."""
    if path.endswith("-000"):
        raise RuntimeError("a unit failed")
    time.sleep(0.2)
    Path(path).touch()


def test_a_failed_task_cancels_the_pool_s_tasks_not_yet_started(tmp_path: Path) -> None:
    # The step fails as soon as the error comes back: the tasks not yet started are dropped (the
    # pool's `map` cancels them), not run first only for their results to be thrown away.
    tasks = [str(tmp_path / f"task-{i:03d}") for i in range(40)]
    with pytest.raises(RuntimeError, match="a unit failed"):
        with worker_pool(2) as pool:
            map_units(fail_first_touch_others, tasks, pool, phase="test")
    assert len(list(tmp_path.glob("task-*"))) <= 10  # those already handed to a worker; 39 before


def test_scratch_caps_duckdb_memory_and_is_removed_after(tmp_path: Path) -> None:
    folder = tmp_path / "_scratch"
    with scratch_space(folder, ScaleConfig(memory_limit_mb=200, num_workers=2)) as scratch:
        limit, spill, threads = scratch.db.execute("SELECT current_setting('memory_limit'), current_setting('temp_directory'), current_setting('threads')").fetchone()
        assert limit == "190.7 MiB"  # 200 MB, as DuckDB prints it
        assert Path(spill) == folder / "spill"
        assert threads == 1  # 200 MB leaves room for one thread of DuckDB's 125 MB each, not two
    assert not folder.exists()
    with pytest.raises(RuntimeError), scratch_space(folder, ScaleConfig()):
        raise RuntimeError("a failed step")
    assert not folder.exists()


def test_streamed_shards_equal_whole_frame_shards(tmp_path: Path) -> None:
    frame = _docs(list(range(1, 24)))
    whole = write_shards(frame, tmp_path / "whole", prefix="p", max_rows=5)
    stream = write_shard_stream(parquet_frames([s.path for s in whole.shards], ["doc_id", "text"], batch_rows=3), tmp_path / "stream", prefix="p", max_rows=5, schema=frame.schema)
    assert [s.num_rows for s in stream.shards] == [s.num_rows for s in whole.shards] == [5, 5, 5, 5, 3]
    assert_frame_equal(stream.read(), frame)
    empty = write_shard_stream([], tmp_path / "empty", prefix="p", max_rows=5, schema=frame.schema)
    assert empty.num_rows == 0 and empty.read().schema == frame.schema


def test_scale_config_names_the_bad_field() -> None:
    for bad in ({"unit_bytes": 0}, {"num_workers": 0}, {"memory_limit_mb": 64}, {"pair_batch": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ScaleConfig(**bad)


def test_compacted_rows_hold_only_their_own_text() -> None:
    frame = pl.DataFrame({"doc_id": [f"d{i:04d}" for i in range(2000)], "text": [f"{i} " + "x" * 1000 for i in range(2000)], "n": list(range(2000))})
    kept = frame.filter(pl.col("n") % 500 == 0)
    small = compacted(kept)
    assert_frame_equal(small, kept)
    # A filtered frame's strings still point into all 2 MB of the batch's text; compacted, ~4 kB.
    assert _text_buffer_bytes(small) < 20_000 < 2_000_000 < _text_buffer_bytes(kept)


def _text_buffer_bytes(frame: pl.DataFrame) -> int:
    """Bytes of the buffers the text column holds, shared ones included (as polars keeps them)."""
    buffers = frame["text"].to_arrow(compat_level=pl.CompatLevel.newest()).buffers()
    return sum(b.size for b in buffers if b is not None)


@pytest.mark.parametrize("engine,valid", [("local", True), ("ray", True), ("dask", False), ("", False)])
def test_the_engine_is_local_or_ray(engine: str, valid: bool) -> None:
    if valid:
        assert ScaleConfig(engine=engine).engine == engine
        return
    with pytest.raises(ValueError, match="engine must be one of local, ray"):
        ScaleConfig(engine=engine)


def test_shard_units_are_runs_of_row_groups_read_back_as_the_shards(tmp_path: Path) -> None:
    """Three shards of 60, 0 and 25 rows in groups of 10: runs of whole groups of about the target
    (here two groups), numbered through the shards; read back, the shards' rows in order."""
    shards = []
    for name, rows in (("a", 60), ("b", 0), ("c", 25)):
        table = pa.table({"doc_id": [f"{name}{i:04d}" for i in range(rows)], "text": [f"document {name} {i:04d}" for i in range(rows)]},
                         schema=pa.schema([("doc_id", pa.string()), ("text", pa.string())]))
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path, row_group_size=10)
        shards.append(Shard(path=str(path), sha256=file_sha256(path), num_rows=rows))
    group = pq.ParquetFile(shards[0].path).metadata.row_group(0).total_byte_size
    units = shard_units(shards, 2 * group)
    assert [(Path(u.path).stem, u.rows, u.first, u.num_docs) for u in units] == [
        ("a", (0, 20), 0, 20), ("a", (20, 40), 20, 20), ("a", (40, 60), 40, 20), ("c", (0, 20), 60, 20), ("c", (20, 25), 80, 5)]
    assert [u.index for u in units] == list(range(5))
    read = pl.concat([u.read(["doc_id", "text"]) for u in units])
    assert_frame_equal(read, pl.concat([pl.read_parquet(s.path) for s in shards]))
    assert len(shard_units(shards, 10**9)) == 2  # a shard each


def test_a_row_group_of_two_targets_or_more_is_cut_into_slices_of_equal_rows(tmp_path: Path) -> None:
    table = pa.table({"doc_id": [f"d{i:04d}" for i in range(30)], "text": [f"a long document {i:04d} " * 20 for i in range(30)]})
    path = tmp_path / "s.parquet"
    pq.write_table(table, path, row_group_size=10)
    shard = Shard(path=str(path), sha256=file_sha256(path), num_rows=30)
    group = pq.ParquetFile(path).metadata.row_group(0).total_byte_size
    half = group // 2  # two targets fit in a group: cut
    sliced = shard_units([shard], half)
    assert [(u.rows, u.first, u.num_docs) for u in sliced] == [((first, first + 5), first, 5) for first in range(0, 30, 5)]
    assert_frame_equal(pl.concat([u.read() for u in sliced]), pl.read_parquet(path))
    assert_frame_equal(sliced[3].read(["text"]), pl.read_parquet(path, columns=["text"]).slice(15, 5))
    whole = shard_units([shard], half + 1)  # two targets are more than a group: a group each, whole
    assert [(u.rows, u.num_docs) for u in whole] == [((first, first + 10), 10) for first in range(0, 30, 10)]
    assert [u.key()["rows"] for u in sliced[:2]] == [[0, 5], [5, 10]]  # in the markers' keys
