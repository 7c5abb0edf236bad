"""Checkpoint folders made hostile by hand: a marker that is valid JSON but cannot be a marker, a
marker that is no regular file, a folder whose marker lies about its files, a plain file where a
checkpoint folder belongs. None may crash or hang a resume, and none may get a whole checkpoint pruned."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from ito_assets.errors import ErrorCode
from ito_assets.runtime.checkpoint import digest_writer
from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.checkpoint import registry
from ito_assets.runtime.checkpoint import resume
from ito_assets.runtime.checkpoint.markers import MARKER_NAME
from ito_assets.runtime.checkpoint.saver import CheckpointConfig, Checkpointer, storage_cause
from ito_assets.runtime.record import publish
from ito_assets.runtime.worker.main import StageWorker
from runtime_helpers import copied_under_a_newer_step, shard_added, shard_cut_short, shard_removed

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

OURS = {"run_key": "run-a", "stage": "pretrain"}


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((8, 8), value)}}


def _saver(directory: Path, keep_last: int = 5) -> Checkpointer:
    return Checkpointer(CheckpointConfig(directory=directory, interval_steps=5, keep_last=keep_last, owner=OURS),
                        process_group=None, rank=0)


def _save(directory: Path, steps, *, keep_last: int = 5) -> None:
    saver = _saver(directory, keep_last)
    for step in steps:
        saver.save(step, _state(step))
    saver.close()


def _resume(directory: Path) -> tuple[int | None, float]:
    state = _state(0)
    point = resume.load_latest(directory, state, rank=0, group=None, owner=OURS)
    return point.step, float(state["model"]["w"][0, 0])


def _marker(directory: Path, step: int) -> Path:
    return markers.checkpoint_dir(directory, step) / MARKER_NAME


# --- a whole checkpoint that lacks what the state asks for -------------------------------------------


def test_a_checkpoint_without_a_key_the_state_needs_is_skipped_for_the_older_one(tmp_path):
    _save(tmp_path, [5])
    saver = _saver(tmp_path)
    saver.save(10, {"other": {"w": torch.full((8, 8), 10.0)}})  # whole, digests right, no "model"
    saver.close()
    state = _state(0)
    # DCP raises CheckpointException, a BaseException: it escaped the skip and ended the resume.
    point = resume.load_latest(tmp_path, state, rank=0, group=None, owner=OURS)
    assert (point.step, float(state["model"]["w"][0, 0])) == (5, 5.0)
    assert [(s.step, s.reason) for s in point.skipped] == [(10, "DCP failed to load it")]


def test_an_optional_part_loads_what_the_checkpoint_holds_and_drops_the_rest(tmp_path):
    saver = _saver(tmp_path)
    saver.save(5, {**_state(5), "rng": {"rank0.seed": torch.tensor([7])}})
    saver.close()
    state = {**_state(0), "rng": {"rank0.seed": torch.tensor([0]), "rank1.seed": torch.tensor([0])}}
    point = resume.load_latest(tmp_path, state, rank=0, group=None, owner=OURS, optional=("rng",))
    assert point.step == 5 and float(state["model"]["w"][0, 0]) == 5.0
    assert state["rng"] == {"rank0.seed": torch.tensor([7])}
    # Not optional, the same gap is a checkpoint that cannot be loaded.
    state = {**_state(0), "rng": {"rank0.seed": torch.tensor([0]), "rank1.seed": torch.tensor([0])}}
    assert resume.load_latest(tmp_path, state, rank=0, group=None, owner=OURS).step is None


def _order(batch_size: int) -> dict:
    return {"data_order": {"batch_size": batch_size, "sequence_length": 128, "seed": 0}}


def test_a_stage_run_again_under_another_data_order_keeps_its_own_checkpoints(tmp_path):
    # The first order's folders, at higher steps, counted as whole: keep_last kept them and pruned
    # every checkpoint of the new order, its final one included (the stage then failed at its end).
    def saver(batch_size: int, interval: int) -> Checkpointer:
        return Checkpointer(CheckpointConfig(directory=tmp_path, interval_steps=interval, keep_last=2, owner=OURS,
                                             trained_with=_order(batch_size)), process_group=None, rank=0)

    first = saver(8, 10)
    for step in (10, 20, 30, 40):
        first.save(step, _state(step))
    first.close()
    again = saver(16, 5)
    for step in (5, 10, 15):
        again.save(step, _state(1000 + step))
    again.close()
    assert sorted(markers.step_of(p) for p in tmp_path.iterdir() if markers.step_of(p) is not None) == [10, 15, 30, 40]
    state = _state(0)
    point = resume.load_latest(tmp_path, state, rank=0, group=None, owner=OURS,
                               trained_with=markers.resume_terms(_order(16)))
    assert (point.step, float(state["model"]["w"][0, 0])) == (15, 1015.0)
    assert [s.step for s in point.skipped] == [40, 30]
    assert markers.resume_terms({"layout": {}, "positions": {}}) is None  # the layout may change on resume


# --- a marker that is valid JSON but no marker ------------------------------------------------------


@pytest.mark.parametrize("text", [
    '{"step": Infinity, "metadata_sha256": "x", "files": []}',  # json takes it; int() overflows
    '{"step": 10, "metadata_sha256": "x", "files": [["a", -Infinity, "d"]]}',
    "[" * 100_000,  # nesting deeper than the JSON decoder's recursion
])
def test_a_marker_no_int_or_decoder_can_take_is_skipped_not_raised(tmp_path, text):
    _save(tmp_path, [5, 10])
    _marker(tmp_path, 10).write_text(text)
    assert markers.read_marker(_marker(tmp_path, 10).parent) is None
    assert _resume(tmp_path) == (5, 5.0)


def test_a_marker_larger_than_any_marker_is_not_read(tmp_path, monkeypatch):
    _save(tmp_path, [5, 10])
    body = json.loads(_marker(tmp_path, 10).read_text())
    _marker(tmp_path, 10).write_text(json.dumps(body) + " " * 4096)  # still valid JSON
    monkeypatch.setattr(markers, "MAX_MARKER_BYTES", 4096, raising=False)
    assert markers.read_marker(_marker(tmp_path, 10).parent) is None
    assert _resume(tmp_path) == (5, 5.0)


# --- a marker that is no regular file -----------------------------------------------------------------


def test_a_marker_that_is_a_fifo_is_skipped_without_blocking(tmp_path):
    _save(tmp_path, [5, 10])
    fifo = _marker(tmp_path, 10)
    fifo.unlink()
    os.mkfifo(fifo)
    found: list = []
    reader = threading.Thread(target=lambda: found.append(_resume(tmp_path)), daemon=True)
    reader.start()
    reader.join(timeout=20)
    if not found:  # let a reader blocked in open() go before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert found == [(5, 5.0)]


@pytest.mark.parametrize("kind", ["directory", "link"])
def test_a_marker_that_is_a_directory_or_a_link_reads_as_none(tmp_path, kind):
    _save(tmp_path, [5, 10])
    marker = _marker(tmp_path, 10)
    elsewhere = tmp_path / "elsewhere.json"
    shutil.copyfile(marker, elsewhere)  # a whole marker of this very folder, behind a link
    marker.unlink()
    if kind == "directory":
        marker.mkdir()
    else:
        marker.symlink_to(elsewhere)
    assert markers.read_marker(marker.parent) is None
    assert _resume(tmp_path) == (5, 5.0)


# --- keep_last: a folder whose marker lies never counts ------------------------------------------------


@pytest.mark.parametrize("damage", [copied_under_a_newer_step, shard_removed, shard_cut_short, shard_added])
def test_a_newer_folder_whose_marker_lies_never_gets_the_only_whole_checkpoint_pruned(tmp_path, damage):
    _save(tmp_path, [5] if damage is copied_under_a_newer_step else [5, 10])
    damage(tmp_path)
    assert _saver(tmp_path, keep_last=1).prune() == []
    assert _resume(tmp_path) == (5, 5.0)


def test_a_whole_newer_checkpoint_still_prunes_the_older_ones(tmp_path):
    _save(tmp_path, [5, 10, 15])
    assert _saver(tmp_path, keep_last=1).prune() == [5, 10]
    assert _resume(tmp_path) == (15, 15.0)


# --- keep_last: a newer folder the resume rejected never counts ----------------------------------------


def _flip_a_byte(directory: Path, step: int) -> None:
    """Bit rot or a torn write on storage: every size stays right, only the digest tells."""
    shard = next(markers.checkpoint_dir(directory, step).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))


def _steps(directory: Path) -> list[int]:
    return sorted(step for p in directory.iterdir() if (step := markers.step_of(p)) is not None)


@pytest.mark.parametrize("keep_last", [1, 2])
def test_newer_checkpoints_the_resume_rejected_never_get_the_new_saves_pruned(tmp_path, keep_last):
    """Every kept checkpoint has a flipped byte, so the next attempt starts from scratch. Before the
    fix the corrupt folders counted as the newest whole ones and each new save was deleted as soon as
    written: a later kill restarted the stage from nothing again."""
    _save(tmp_path, [5, 10, 15, 20], keep_last=keep_last)
    corrupt = [15, 20][-keep_last:]
    for step in corrupt:
        _flip_a_byte(tmp_path, step)
    assert _resume(tmp_path) == (None, 0.0)
    saver = _saver(tmp_path, keep_last)
    for step in (5, 10, 15):
        saver.save(step, _state(100 + step))
        saver.wait()
        kept = [s for s in (5, 10, 15) if s <= step][-keep_last:]  # the save just finished, older ones per keep_last
        assert _steps(tmp_path) == sorted({*kept, *(c for c in corrupt if c > step)})  # above it: untouched, uncounted
    saver.close()
    assert _resume(tmp_path) == (15, 115.0)  # a kill now resumes from the newest save (15 was replaced)


def test_a_save_at_the_step_of_a_rejected_folder_replaces_it_and_is_listed_with_its_own_bytes(tmp_path):
    _save(tmp_path, [5, 10], keep_last=1)
    _flip_a_byte(tmp_path, 10)
    saver = _saver(tmp_path, keep_last=1)
    for step in (5, 10):
        saver.save(step, _state(100 + step))
    saver.close()
    folder = markers.checkpoint_dir(tmp_path, 10)
    assert markers.validate(folder, owner=OURS) is None and _steps(tmp_path) == [10]
    assert _resume(tmp_path) == (10, 110.0)
    digest = markers.read_marker(folder).metadata_sha256
    records = registry.read(tmp_path)
    assert [r.step for r in records] == [5, 10, 5, 10] and records[-1].metadata_sha256 == digest
    assert [(r.step, r.metadata_sha256) for r in publish._current_records(tmp_path)] == [(10, digest)]


def test_the_save_just_finished_is_kept_even_where_it_does_not_look_whole(tmp_path, monkeypatch):
    saver = _saver(tmp_path, keep_last=1)
    saver.save(5, _state(5))
    saver.wait()
    monkeypatch.setattr(Checkpointer, "_whole", lambda self, folder: markers.step_of(folder) != 10)
    saver.save(10, _state(10))
    saver.wait()
    assert _steps(tmp_path) == [5, 10]  # nothing newer counts: 5 is the newest "whole" one, 10 the save itself


# --- a plain file where a checkpoint folder belongs --------------------------------------------------


def test_a_save_over_a_plain_file_under_the_steps_name_replaces_it(tmp_path):
    _save(tmp_path, [5])
    markers.checkpoint_dir(tmp_path, 10).write_bytes(b"planted")
    _save(tmp_path, [10])
    assert markers.validate(markers.checkpoint_dir(tmp_path, 10), owner=OURS) is None
    assert _resume(tmp_path) == (10, 10.0)


# --- the registry's view: a step saved twice ---------------------------------------------------------


def test_a_step_saved_again_after_a_restart_is_published_once_with_the_digest_of_its_bytes(tmp_path, monkeypatch):
    _save(tmp_path, [5, 10])
    saver = _saver(tmp_path)  # a restart resumed from step 5 and saved step 10 again
    saver.save(10, _state(99))
    saver.close()
    assert [r.step for r in registry.read(tmp_path)] == [5, 10, 10]
    handed: list = []
    monkeypatch.setattr(publish.ledger_telemetry, "publish", lambda _l, _r, finished, _f, **_: handed.extend(finished))
    publish.publish_stage(None, "run-a", "pretrain", tmp_path, {})
    on_disk = {step: markers.read_marker(markers.checkpoint_dir(tmp_path, step)).metadata_sha256 for step in (5, 10)}
    assert [(c.step, c.sha256) for c in handed] == sorted(on_disk.items())


# --- the registry's view: a kill between the marker and the record ------------------------------------


def _killed_after_the_marker(saver: Checkpointer, step: int, value: float) -> Path:
    """Save `step` and stop once its marker is written: a SIGKILL before the training thread's next
    poll, which would have appended its record. -> the folder."""
    saver.save(step, _state(value))
    saver._in_flight.done.wait(timeout=30)
    return markers.checkpoint_dir(saver.config.directory, step)


def test_a_checkpoint_whose_record_a_kill_cut_off_is_listed_from_its_marker_once(tmp_path):
    saver = _saver(tmp_path)
    saver.save(5, _state(5))
    saver.wait()
    folder = _killed_after_the_marker(saver, 10, 10.0)
    assert [r.step for r in registry.read(tmp_path)] == [5]  # whole, resumed from, and never listed
    marker = markers.read_marker(folder)
    listed = registry.list_from_marker(tmp_path, folder, marker)
    assert (listed.step, listed.path, listed.num_bytes, listed.metadata_sha256) == (
        10, str(folder), marker.num_bytes, marker.metadata_sha256)
    assert [(r.step, r.metadata_sha256) for r in publish._current_records(tmp_path)][-1] == (10, marker.metadata_sha256)
    assert registry.list_from_marker(tmp_path, folder, marker) is None  # listed already: not twice
    line = json.loads((tmp_path / registry.REGISTRY_NAME).read_text().splitlines()[-1])
    assert line["bandwidth_bytes_per_second"] is None  # no seconds known: standard JSON, not Infinity
    saver.close()


def test_a_step_saved_again_whose_record_a_kill_cut_off_is_listed_with_its_new_bytes(tmp_path):
    _save(tmp_path, [10])
    saver = _saver(tmp_path)
    folder = _killed_after_the_marker(saver, 10, 99.0)  # a restart saved step 10 again
    marker = markers.read_marker(folder)
    assert registry.read(tmp_path)[-1].metadata_sha256 != marker.metadata_sha256  # the old bytes' record
    assert registry.list_from_marker(tmp_path, folder, marker) is not None
    assert [(r.step, r.metadata_sha256) for r in publish._current_records(tmp_path)] == [(10, marker.metadata_sha256)]
    saver.close()


@pytest.mark.parametrize("rank,replica_id,listed", [(0, 0, True), (1, 0, False), (0, 1, False)])
def test_only_rank_0_of_group_0_lists_the_checkpoint_it_resumed(tmp_path, rank, replica_id, listed):
    """Group 0's folder is its own to append to; another replica group resumes from it too."""
    saver = _saver(tmp_path)
    folder = _killed_after_the_marker(saver, 10, 10.0)
    logs: list[str] = []
    worker = SimpleNamespace(rank=rank, writes_checkpoints=replica_id == 0, stage_dir=tmp_path, log=logs.append,
                             writing=lambda what: contextlib.nullcontext())
    StageWorker.list_resumed(worker, folder, markers.read_marker(folder))
    assert [r.step for r in registry.read(tmp_path)] == ([10] if listed else [])
    assert len(logs) == int(listed)
    saver.close()


# --- a full disk while DCP writes the shards ----------------------------------------------------------


def test_the_storage_cause_is_found_in_dcps_wrapped_rank_failure():
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    wrapped = CheckpointException("write", {0: (full, traceback.StackSummary())})  # as DCP wraps a rank's error
    assert storage_cause(RuntimeError("save failed")) is None
    assert storage_cause(wrapped) is full


def test_a_shard_write_on_a_full_disk_is_a_storage_failure_and_the_older_checkpoint_stays(tmp_path, monkeypatch):
    saver = _saver(tmp_path, keep_last=1)
    saver.save(5, _state(5))
    saver.wait()

    def no_space(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(digest_writer._HashingStream, "write", no_space)
    saver.save(10, _state(10))
    saver.wait()  # before the fix: RuntimeError, as if the save had failed for a bug
    failure = saver.agree()
    assert (failure.step, failure.code) == (10, ErrorCode.STORAGE_FULL)
    assert not markers.checkpoint_dir(tmp_path, 10).exists()  # the partial folder is gone
    monkeypatch.undo()
    saver.close()
    assert [r.step for r in registry.read(tmp_path)] == [5] and _resume(tmp_path) == (5, 5.0)


def test_a_save_past_the_file_size_limit_keeps_the_older_checkpoint(tmp_path):
    """RLIMIT_FSIZE in a child: the kernel's EFBIG inside DCP's own writes."""
    script = textwrap.dedent(f"""
        import resource, signal
        from pathlib import Path
        import torch
        from ito_assets.runtime.checkpoint.saver import CheckpointConfig, Checkpointer, storage_cause
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        saver = Checkpointer(CheckpointConfig(directory=Path({str(tmp_path)!r}), interval_steps=5, keep_last=1),
                             process_group=None, rank=0)
        saver.save(5, {{"model": {{"w": torch.full((8, 8), 5.0)}}}})
        saver.wait()
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
        saver.save(10, {{"model": {{"w": torch.full((8, 8), 10.0)}}}})
        saver.wait()
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        print(saver.agree().step)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout.split()) == (0, ["10"]), done.stderr[-2000:]
    assert not markers.checkpoint_dir(tmp_path, 10).exists()
    assert _resume(tmp_path) == (5, 5.0)
