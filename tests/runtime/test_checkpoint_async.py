"""Asynchronous DCP saves in process (no process group): marker, registry, pruning, validation,
and the resume that skips partial and corrupt checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from ito_assets.runtime.checkpoint import holds
from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.checkpoint import registry
from ito_assets.runtime.checkpoint import resume
from ito_assets.runtime.checkpoint.saver import CheckpointConfig, Checkpointer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((64, 64), value)}, "train": {"step": torch.tensor(int(value))}}


def _save_all(tmp_path, steps, keep_last=2):
    saver = Checkpointer(CheckpointConfig(directory=tmp_path, interval_steps=5, keep_last=keep_last),
                         process_group=None, rank=0)
    blocking = [saver.save(step, _state(step)) for step in steps]
    records = saver.wait()
    return saver, blocking, records


def test_a_finished_save_has_a_marker_a_registry_record_and_a_metadata_digest(tmp_path):
    _, blocking, _ = _save_all(tmp_path, [5, 10])
    records = registry.read(tmp_path)
    assert [r.step for r in records] == [5, 10]
    folder = markers.checkpoint_dir(tmp_path, 10)
    assert records[1].metadata_sha256 == markers.file_sha256(folder / ".metadata")
    assert records[1].num_bytes == sum(p.stat().st_size for p in folder.iterdir() if p.name != "COMPLETE.json")
    assert 0 <= records[1].blocking_seconds <= records[1].total_seconds
    assert records[1].bandwidth_bytes_per_second == records[1].num_bytes / records[1].total_seconds
    assert markers.validate(folder) is None and all(b >= 0 for b in blocking)


def test_keep_last_prunes_older_whole_checkpoints_but_not_held_ones(tmp_path):
    holds.hold(tmp_path, 5, "spk_0123456789abcdef")
    _save_all(tmp_path, [5, 10, 15, 20], keep_last=2)
    assert sorted(markers.step_of(p) for p in markers.candidates(tmp_path)) == [5, 15, 20]
    holds.release(tmp_path, "spk_0123456789abcdef")
    saver, _, _ = _save_all(tmp_path, [25], keep_last=2)
    assert sorted(markers.step_of(p) for p in markers.candidates(tmp_path)) == [20, 25]


def test_the_schedule_follows_the_interval(tmp_path):
    saver = Checkpointer(CheckpointConfig(directory=tmp_path, interval_steps=5, keep_last=1), process_group=None, rank=0)
    assert [s for s in range(0, 16) if saver.due(s)] == [5, 10, 15]
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointConfig(directory=tmp_path, interval_steps=5, keep_last=0)


def test_partial_and_corrupt_checkpoints_are_skipped_and_the_previous_one_loads(tmp_path):
    _save_all(tmp_path, [5, 10, 15], keep_last=3)
    (markers.checkpoint_dir(tmp_path, 15) / markers.MARKER_NAME).unlink()  # killed before the marker
    shard = next(markers.checkpoint_dir(tmp_path, 10).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0x01  # one flipped bit
    shard.write_bytes(bytes(data))
    state = _state(0)
    point = resume.load_latest(tmp_path, state, rank=0, group=None)
    assert point.step == 5
    assert [(s.step, s.reason) for s in point.skipped] == [
        (15, "no completion marker (partial save)"), (10, "digest mismatch in __0_0.distcp")]
    assert torch.equal(state["model"]["w"], torch.full((64, 64), 5.0)) and int(state["train"]["step"]) == 5


def test_a_metadata_file_that_changed_is_caught_by_its_digest(tmp_path):
    _save_all(tmp_path, [5], keep_last=1)
    folder = markers.checkpoint_dir(tmp_path, 5)
    (folder / ".metadata").write_bytes((folder / ".metadata").read_bytes() + b"\0")
    assert markers.validate(folder) == "digest mismatch in .metadata"


def test_a_marker_for_another_step_or_with_missing_files_is_refused(tmp_path):
    _save_all(tmp_path, [5, 10], keep_last=2)
    five, ten = markers.checkpoint_dir(tmp_path, 5), markers.checkpoint_dir(tmp_path, 10)
    (ten / markers.MARKER_NAME).write_text((five / markers.MARKER_NAME).read_text())
    assert markers.validate(ten) == "the marker names another step"
    next(five.glob("*.distcp")).unlink()
    assert markers.validate(five) == "files differ from the marker's list"


def test_no_whole_checkpoint_means_a_fresh_start(tmp_path):
    point = resume.load_latest(tmp_path / "empty", _state(0), rank=0, group=None)
    assert point.step is None and point.skipped == ()


def test_a_torn_registry_line_is_ignored(tmp_path):
    _save_all(tmp_path, [5], keep_last=1)
    with open(tmp_path / registry.REGISTRY_NAME, "a") as handle:
        handle.write('{"step": 10, "pa')
    assert [r.step for r in registry.read(tmp_path)] == [5]
    assert json.loads((tmp_path / registry.REGISTRY_NAME).read_text().splitlines()[0])["bandwidth_bytes_per_second"] > 0
