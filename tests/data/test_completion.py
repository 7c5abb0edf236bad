"""Completion markers: a rerun of a failed or killed data step redoes only the work units that did
not finish, and writes the same bytes as a run that never failed."""

from __future__ import annotations

import collections
import functools
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from ito_assets.data import completion, decontam_units, dedup_units, exact_units, kept_units
from ito_assets.data.completion import CompletionMarkers, frame_digest, task_key
from ito_assets.data.config import DecontamConfig, DedupConfig, ScaleConfig
from ito_assets.data.eval_index import build_index
from ito_assets.data.ray_engine import WorkUnitFailed
from ito_assets.data.scratch import FINISHED, scratch_space
from ito_assets.data.shards import write_shards
from ito_assets.data.units import map_units, shard_units
from ito_assets.digests import file_sha256
from ito_assets.errors import ErrorCode, ItoError
from reference_impl import deduplicate, kept_documents
from test_decontam import suite
from test_decontam_units import ITEMS, corpus as decontam_corpus
from test_dedup_units import TINY, corpus as dedup_corpus
from test_source_pieces import _threads


@dataclass(frozen=True)
class Square:
    """A unit that reads `source`, writes `target` and returns (its number squared, a frame)."""

    number: int
    source: str
    target: str

    def key(self) -> dict:
        return {"number": self.number}

    def inputs(self) -> tuple[str, ...]:
        return (self.source,)

    def outputs(self) -> tuple[str, ...]:
        return (self.target,)


CALLS: list[int] = []


def square(task: Square) -> tuple[int, pl.DataFrame]:
    CALLS.append(task.number)
    if task.number == FAIL_AT[0]:
        raise OSError("the disk went away")
    Path(task.target).write_text(Path(task.source).read_text() + f" squared {task.number ** 2}")
    return task.number ** 2, pl.DataFrame({"number": [task.number], "text": [f"n{task.number}"]})


FAIL_AT = [-1]


@pytest.fixture
def squares(tmp_path: Path):
    CALLS.clear()
    FAIL_AT[0] = -1
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    markers = CompletionMarkers(tmp_path / "finished")
    tasks = []
    for number in range(6):
        (inputs / f"in-{number}").write_text(f"unit {number}")
        tasks.append(Square(number, str(inputs / f"in-{number}"), str(markers.folder / f"out-{number}")))
    return tasks, markers


def run(tasks, markers):
    return map_units(square, tasks, None, phase="squares", markers=markers)


def test_a_rerun_after_a_failure_does_only_the_units_that_did_not_finish(squares):
    tasks, markers = squares
    FAIL_AT[0] = 3
    with pytest.raises(OSError):
        run(tasks, markers)
    assert CALLS == [0, 1, 2, 3]
    assert sorted(p.name for p in markers.folder.glob("marker-*")) == [f"marker-0000{i}.json" for i in range(3)]
    CALLS.clear()
    FAIL_AT[0] = -1
    results = run(tasks, markers)
    assert CALLS == [3, 4, 5]
    assert [r[0] for r in results] == [n * n for n in range(6)]
    for number, (_, frame) in enumerate(results):  # results kept as data come back equal
        assert_frame_equal(frame, pl.DataFrame({"number": [number], "text": [f"n{number}"]}))
    CALLS.clear()
    assert run(tasks, markers)[5][0] == 25 and CALLS == []  # everything finished: nothing redone


def slow_square(task: Square) -> tuple[int, pl.DataFrame]:
    if task.number == FAIL_AT[0]:
        time.sleep(0.5)  # the others finish first, on the pool's other worker
    return square(task)


def test_on_a_pool_the_units_that_finish_after_a_failed_one_are_kept(squares):
    # Unit 1 fails last: units 2-5 finished meanwhile and are marked, so the rerun does unit 1 alone
    # (taken in order, the first failure hid them, and the rerun did 1-5 again).
    tasks, markers = squares
    FAIL_AT[0] = 1
    with ThreadPoolExecutor(max_workers=2) as pool, pytest.raises(OSError):
        map_units(slow_square, tasks, pool, phase="squares", markers=markers)
    assert sorted(p.name for p in markers.folder.glob("marker-*")) == [f"marker-0000{i}.json" for i in (0, 2, 3, 4, 5)]
    CALLS.clear()
    FAIL_AT[0] = -1
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = map_units(slow_square, tasks, pool, phase="squares", markers=markers)
    assert CALLS == [1] and [r[0] for r in results] == [n * n for n in range(6)]


def test_a_unit_whose_output_or_marker_was_damaged_is_done_again(squares):
    tasks, markers = squares
    run(tasks, markers)
    Path(tasks[1].target).write_text("tampered")
    (markers.folder / "marker-00002.json").write_text('{"key": "torn')
    Path(tasks[4].target).unlink()
    CALLS.clear()
    run(tasks, markers)
    assert CALLS == [1, 2, 4]
    assert Path(tasks[1].target).read_text() == "unit 1 squared 1"


def test_a_changed_input_or_task_is_done_again_and_stale_files_go(squares):
    tasks, markers = squares
    run(tasks, markers)
    Path(tasks[0].source).write_text("unit 0, edited")
    (markers.folder / "out-99").write_text("left by a unit that no longer exists")
    CALLS.clear()
    run(tasks[:3], markers)  # three units now: the markers of 3-5 and their files go too
    assert CALLS == [0]
    assert sorted(p.name for p in markers.folder.iterdir() if p.name.startswith("out")) == ["out-0", "out-1", "out-2"]
    assert not list(markers.folder.glob("marker-0000[3-5].json"))
    CALLS.clear()
    run([tasks[1], tasks[2]], markers)  # a marker is a position's: units that moved are redone
    assert CALLS == [1, 2]


def test_a_result_the_marker_cannot_keep_is_refused_before_it_is_marked(tmp_path: Path):
    markers = CompletionMarkers(tmp_path)
    with pytest.raises(TypeError, match="set"):
        markers.record(0, "key", {1, 2}, {})
    assert not list(tmp_path.glob("marker-*"))


def test_a_failure_after_resumed_units_names_the_steps_unit_number():
    assert WorkUnitFailed(1, "RuntimeError").renumbered([2, 4, 5]).index == 4


def test_a_phase_s_digest_covers_every_marked_output_and_nothing_else(tmp_path: Path):
    markers = CompletionMarkers(tmp_path / "phase")
    markers.record(0, "key-0", None, {"a.npy": "1" * 64})
    markers.record(1, "key-1", 3, {"b.npy": "2" * 64})
    first = markers.digest()
    markers.record(1, "key-1", 4, {"b.npy": "2" * 64})  # another result, the same files
    assert markers.digest() == first
    markers.record(1, "key-1", 3, {"b.npy": "3" * 64})  # a file with other bytes
    assert markers.digest() != first
    markers.record(1, "key-1", 3, {"b.npy": "2" * 64})
    (tmp_path / "phase" / "b.npy.partial").write_text("not a marker")
    assert markers.digest() == first
    markers.record(2, "key-2", None, {"c.npy": "4" * 64})  # one unit more
    assert markers.digest() != first


def test_frame_digest_is_of_values_not_of_chunks():
    frame = pl.DataFrame({"seed": [1, 2, 3], "view": ["a", None, "c"]})
    rechunked = pl.concat([frame.head(1), frame.tail(2)], rechunk=False)
    assert frame_digest(frame) == frame_digest(rechunked)
    assert frame_digest(frame) != frame_digest(frame.with_columns(pl.col("view").fill_null("")))
    assert frame_digest(pl.DataFrame({"view": ["ab", "c"]})) != frame_digest(pl.DataFrame({"view": ["a", "bc"]}))


# The real phases: a signature unit fails mid-step, the step fails, the rerun resumes.

def _counting(function, calls: list[int], fail_at: int | None = None, error: str = "No space left on device"):
    @functools.wraps(function)  # the marker's key names the function: the wrapper keeps its name
    def wrapper(task):
        calls.append(task.unit.index)
        if task.unit.index == fail_at:
            raise OSError(error)
        return function(task)
    return wrapper


def _deduplicate(tmp_path: Path, shards, scale=TINY):
    with scratch_space(tmp_path / "dedup" / "_scratch", scale) as scratch:
        table, counts = dedup_units.deduplicate_units(scratch, shards, DedupConfig(), tmp_path / "dedup" / "decisions.parquet")
        return table, counts


def test_deduplication_resumes_from_the_signature_units_that_finished(tmp_path: Path, monkeypatch):
    shards = write_shards(dedup_corpus(), tmp_path / "source", prefix="d", max_rows=37).shards
    reference, _ = _deduplicate(tmp_path / "reference", shards)
    first: list[int] = []
    monkeypatch.setattr(dedup_units, "signature_unit", _counting(dedup_units.signature_unit, first, fail_at=6))
    with pytest.raises(ItoError) as full:  # the disk filled up at unit 6; space came back after
        _deduplicate(tmp_path, shards)
    assert full.value.code is ErrorCode.STORAGE_FULL
    finished = tmp_path / "dedup" / FINISHED / "dedup-arrays"
    assert len(list(finished.glob("marker-*.json"))) == 6 and first == list(range(7))
    assert not (tmp_path / "dedup" / "_scratch").exists()  # the scratch goes; the finished units stay
    again: list[int] = []
    monkeypatch.setattr(dedup_units, "signature_unit", _counting(dedup_units.signature_unit.__wrapped__, again))
    table, _ = _deduplicate(tmp_path, shards)
    assert again[0] == 6 and len(again) >= 4  # units 0-5 not redone
    assert Path(table.path).read_bytes() == Path(reference.path).read_bytes()
    assert not (tmp_path / "dedup" / FINISHED).exists()  # gone once the step succeeded


def test_decontamination_resumes_both_passes(tmp_path: Path, monkeypatch):
    config = DecontamConfig()
    index = build_index(suite(*ITEMS), config)
    shards = write_shards(decontam_corpus(), tmp_path / "kept", prefix="k", max_rows=13).shards
    scale = ScaleConfig(unit_bytes=200, in_memory_mb=0)

    def scan(folder: Path):
        with scratch_space(folder / "_scratch", scale) as scratch:
            scanned = decontam_units.scan_shards(scratch, shards, index, config)
            return scanned.hits, scanned.counts

    expected_hits, expected_counts = scan(tmp_path / "reference")
    matches: list[int] = []
    hits: list[int] = []
    monkeypatch.setattr(decontam_units, "match_unit", _counting(decontam_units.match_unit, matches))
    monkeypatch.setattr(decontam_units, "hits_unit", _counting(decontam_units.hits_unit, hits, fail_at=2, error="unreadable"))
    with pytest.raises(OSError, match="unreadable"):
        scan(tmp_path / "run")
    num_units = len(matches)
    assert num_units > 3 and hits == [0, 1, 2]
    matches.clear(), hits.clear()
    monkeypatch.setattr(decontam_units, "hits_unit", _counting(decontam_units.hits_unit.__wrapped__, hits))
    found, counts = scan(tmp_path / "run")
    assert matches == [] and hits == list(range(2, num_units))
    assert_frame_equal(found, expected_hits)
    assert counts == expected_counts


KILLED_STEP = """
import os, signal, sys
sys.path[:0] = {paths!r}
from ito_assets.data import dedup_units
from test_completion import _deduplicate
from pathlib import Path
from ito_assets.data.shards import Shard
original = dedup_units.signature_unit
def dies(task):
    if task.unit.index == 4:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(task)
dies.__module__, dies.__qualname__ = original.__module__, original.__qualname__
dedup_units.signature_unit = dies
_deduplicate(Path({root!r}), {shards!r})
"""


def test_a_killed_step_leaves_its_finished_units_for_the_rerun(tmp_path: Path, monkeypatch):
    shards = write_shards(dedup_corpus(), tmp_path / "source", prefix="d", max_rows=37).shards
    here = Path(__file__).resolve().parent
    code = KILLED_STEP.format(paths=[str(here), str(here.parent)], root=str(tmp_path), shards=shards)
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    finished = tmp_path / "dedup" / FINISHED / "dedup-arrays"
    assert len(list(finished.glob("marker-*.json"))) == 4
    assert (tmp_path / "dedup" / "_scratch").exists()  # nothing cleaned up after a kill
    marker = json.loads((finished / "marker-00003.json").read_text())
    assert set(marker["outputs"]) == {"signatures-00003.npy", "shingles-00003.npy", "offsets-00003.npy", "bands-00003.parquet"}
    calls: list[int] = []
    monkeypatch.setattr(dedup_units, "signature_unit", _counting(dedup_units.signature_unit, calls))
    table, _ = _deduplicate(tmp_path, shards)
    assert calls[0] == 4
    reference, _ = _deduplicate(tmp_path / "reference", shards)
    assert Path(table.path).read_bytes() == Path(reference.path).read_bytes()


def test_a_process_pool_marks_its_units_too(tmp_path: Path):
    shards = write_shards(dedup_corpus(), tmp_path / "source", prefix="d", max_rows=37).shards
    scale = ScaleConfig(unit_bytes=TINY.unit_bytes, pair_batch=TINY.pair_batch, memory_limit_mb=128, num_workers=2)
    with scratch_space(tmp_path / "_scratch", scale) as scratch:
        dedup_units.deduplicate_units(scratch, shards, DedupConfig(), tmp_path / "decisions.parquet")
        units = len(list((tmp_path / FINISHED / "representative-units").glob("unit-*.parquet")))  # a bucket each
        assert units > 1 and len(list((tmp_path / FINISHED / "dedup-arrays").glob("marker-*.json"))) == units
        assert len(list((tmp_path / FINISHED / "representative-units").glob("marker-*.json"))) == units
    assert not (tmp_path / FINISHED).exists()


def test_a_step_that_fails_with_a_code_still_keeps_its_finished_units(tmp_path: Path):
    with pytest.raises(ItoError):
        with scratch_space(tmp_path / "_scratch", TINY) as scratch:
            scratch.finished("phase").record(0, "key", None, {})
            raise ItoError(ErrorCode.DATA_WORK_UNIT_FAILED, "phase: work unit 1 failed 3 times (OSError)")
    assert (tmp_path / FINISHED / "phase" / "marker-00000.json").exists()
    assert not os.path.exists(tmp_path / "_scratch")


def test_a_known_digest_stands_for_its_file_in_a_task_key(tmp_path: Path):
    source = tmp_path / "source.txt"
    source.write_text("one")
    task, digest = Square(number=1, source=str(source), target=str(tmp_path / "target.txt")), file_sha256(source)
    hashed = task_key(square, task)
    assert task_key(square, task, {str(source): digest}) == hashed
    assert task_key(square, task, {str(source): "0" * 64}) != hashed  # the key is the digest it is given
    assert task_key(square, task, {str(tmp_path / "other.txt"): "0" * 64}) == hashed
    source.unlink()
    assert task_key(square, task, {str(source): digest}) == hashed  # not read: taken as given


@pytest.fixture
def hashed(monkeypatch) -> collections.Counter:
    """How often each file is hashed for the markers (task keys, workers' outputs), the workers
    being threads of this process."""
    counts: collections.Counter = collections.Counter()
    real = completion.file_sha256

    def counted(path):
        counts[str(path)] += 1
        return real(path)

    monkeypatch.setattr(completion, "file_sha256", counted)
    monkeypatch.setattr(decontam_units, "file_sha256", counted)
    for module in (dedup_units, exact_units, kept_units, decontam_units):
        monkeypatch.setattr(module, "worker_pool", _threads)
    return counts


def test_on_a_pool_deduplication_hashes_no_source_shard_and_every_other_file_once(tmp_path: Path, hashed):
    """The source shards were verified by the step: their digests key the tasks that read them;
    every file a phase's worker wrote keys the next phase's tasks by the digest the worker took."""
    docs = dedup_corpus()
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=37).shards
    scale = ScaleConfig(unit_bytes=TINY.unit_bytes, pair_batch=TINY.pair_batch, memory_limit_mb=128, num_workers=2)
    with scratch_space(tmp_path / "_scratch", scale) as scratch:
        table, _ = dedup_units.deduplicate_units(scratch, shards, DedupConfig(), tmp_path / "decisions.parquet")
        kept = kept_units.kept_shards(scratch, tmp_path / "kept", 25, None)
    assert not {s.path for s in shards} & set(hashed)
    phases = {Path(path).parent.name for path in hashed}
    assert {"exact-keys", "exact-spread", "representative-units", "dedup-arrays", "kept-rows"} <= phases
    assert max(hashed.values()) == 1
    expected, _ = deduplicate(docs, DedupConfig())
    assert_frame_equal(pl.read_parquet(table.path), expected)
    assert_frame_equal(kept.read(), kept_documents(docs, expected))


def test_on_a_pool_decontamination_reads_no_shard_to_key_its_units_and_hashes_each_matches_file_once(tmp_path: Path, hashed):
    """The units are runs of the verified shards' row groups: their digests key the tasks; each
    unit's matches are hashed once, by the worker that wrote them."""
    config = DecontamConfig()
    index = build_index(suite(*ITEMS), config)
    shards = write_shards(decontam_corpus(), tmp_path / "kept", prefix="k", max_rows=13).shards
    with scratch_space(tmp_path / "reference" / "_scratch", ScaleConfig(unit_bytes=200, in_memory_mb=0)) as scratch:
        expected = decontam_units.scan_shards(scratch, shards, index, config)
    hashed.clear()
    with scratch_space(tmp_path / "_scratch", ScaleConfig(unit_bytes=200, num_workers=2)) as scratch:
        found = decontam_units.scan_shards(scratch, shards, index, config)
    matches = [path for path in hashed if Path(path).name.startswith("matches-")]
    assert not {s.path for s in shards} & set(hashed)
    assert len(matches) == len(shard_units(shards, 200)) > len(shards) > 3 and max(hashed.values()) == 1
    assert_frame_equal(found.hits, expected.hits)
    assert found.counts == expected.counts
