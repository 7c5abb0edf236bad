"""Pruning keeps the newest checkpoint whose bytes match its marker: a newer folder that rotted
(or lost its data) after its marker was written never gets the last good one pruned."""

from __future__ import annotations

import pytest
import torch

from ito_assets.runtime.checkpoint import markers, resume
from ito_assets.runtime.checkpoint.saver import CheckpointConfig, Checkpointer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((16, 16), value)}}


def _saver(tmp_path, keep_last=1):
    return Checkpointer(CheckpointConfig(directory=tmp_path, interval_steps=5, keep_last=keep_last),
                        process_group=None, rank=0)


def _rot(tmp_path, step):
    shard = next(markers.checkpoint_dir(tmp_path, step).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0x01
    shard.write_bytes(bytes(data))


def _steps(tmp_path):
    return sorted(markers.step_of(p) for p in markers.candidates(tmp_path))


def _resumed(tmp_path):
    state = _state(0)
    return resume.load_latest(tmp_path, state, rank=0, group=None).step, float(state["model"]["w"][0, 0])


def test_a_rotted_newest_checkpoint_never_gets_the_good_one_pruned(tmp_path):
    first = _saver(tmp_path, keep_last=2)
    for step in (5, 10):
        first.save(step, _state(step))
    first.close()
    _rot(tmp_path, 10)  # after its marker: the marker still says whole
    later = _saver(tmp_path, keep_last=1)  # a later attempt, which did not write step 10
    assert later.prune() == [] and _steps(tmp_path) == [5, 10]  # before the fix: 5 was pruned
    assert _resumed(tmp_path) == (5, 5.0)
    later.save(15, _state(15))
    later.close()
    assert _steps(tmp_path) == [15]  # a sound newer one: the rest goes


def test_a_save_whose_read_back_fails_keeps_the_previous_one(tmp_path, monkeypatch):
    saver = _saver(tmp_path)
    saver.save(5, _state(5))
    saver.wait()
    write_marker = markers.write_marker

    def rot_after_marker(folder, step, **kwargs):  # the bytes change once the marker has their digests
        marker = write_marker(folder, step, **kwargs)
        _rot(folder.parent, step)
        return marker

    monkeypatch.setattr(markers, "write_marker", rot_after_marker)
    saver.save(10, _state(10))
    saver.close()
    assert _steps(tmp_path) == [5, 10] and _resumed(tmp_path) == (5, 5.0)


def test_each_checkpoint_is_read_back_once_off_the_training_thread(tmp_path, monkeypatch):
    import threading

    validate, seen = markers.validate, []

    def counted(folder, **kwargs):
        seen.append((markers.step_of(folder), threading.current_thread() is threading.main_thread()))
        return validate(folder, **kwargs)

    monkeypatch.setattr(markers, "validate", counted)
    saver = _saver(tmp_path)
    for step in (5, 10, 15, 20):
        saver.save(step, _state(step))
    saver.close()
    assert seen == [(5, False), (10, False), (15, False), (20, False)] and _steps(tmp_path) == [20]
