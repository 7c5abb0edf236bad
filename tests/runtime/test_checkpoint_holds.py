"""Holds at their boundary: what counts as one, and that no entry of the holds folder can stop
pruning or release a real hold."""

from __future__ import annotations

import logging

import pytest
import torch

from ito_assets.runtime.checkpoint import holds, markers, saver as saver_module
from ito_assets.runtime.checkpoint.saver import CheckpointConfig, Checkpointer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
HOLDER = "spk_0123456789abcdef"


def _save(tmp_path, steps, keep_last=1):
    saver = Checkpointer(CheckpointConfig(directory=tmp_path, interval_steps=5, keep_last=keep_last),
                         process_group=None, rank=0)
    for step in steps:
        saver.save(step, {"model": {"w": torch.full((8, 8), float(step))}})
    saver.wait()
    return saver


def _steps(tmp_path):
    return sorted(markers.step_of(p) for p in markers.candidates(tmp_path))


@pytest.mark.parametrize("name", [
    "step-5.spk_x",  # too few digits
    "step-00000000x.spk_x",  # not a digit
    "step-0000000005.spk_x",  # ten digits: int() of the first nine read it as step 0
    "step-00000000\u0665.spk_x",  # ARABIC-INDIC FIVE: int() takes it, a hold's name never has it
    "step-000000005.",  # no holder
    "step-000000005",  # no holder, no dot
    "STEP-000000005.spk_x",
])
def test_a_near_miss_name_holds_nothing_and_never_stops_pruning(tmp_path, caplog, name):
    holds.hold(tmp_path, 10, HOLDER)  # a real hold beside it
    (tmp_path / holds.HOLDS_NAME / name).write_text("")
    with caplog.at_level(logging.WARNING, logger=holds.__name__):
        assert holds.held_steps(tmp_path) == {10}
        assert holds.held_steps(tmp_path) == {10}
    assert sum(name in r.getMessage() for r in caplog.records) == 1  # logged once, not at every prune
    _save(tmp_path, [5, 10, 15, 20])
    assert _steps(tmp_path) == [10, 20]  # pruning ran and the real hold still held


def test_a_valid_name_holds_as_an_empty_file_or_as_a_directory(tmp_path):
    holds.hold(tmp_path, 5, HOLDER)
    assert (tmp_path / holds.HOLDS_NAME / f"step-000000005.{HOLDER}").stat().st_size == 0  # what hold() writes
    (tmp_path / holds.HOLDS_NAME / "step-000000010.spk_fedcba9876543210").mkdir()
    assert holds.held_steps(tmp_path) == {5, 10}
    _save(tmp_path, [5, 10, 15, 20])
    assert _steps(tmp_path) == [5, 10, 20]
    holds.release(tmp_path, HOLDER)
    holds.release(tmp_path, "spk_fedcba9876543210")  # an empty directory is released too, no IsADirectoryError
    assert holds.held_steps(tmp_path) == set()
    _save(tmp_path, [25])
    assert _steps(tmp_path) == [25]


def test_release_takes_only_its_own_holder_exactly(tmp_path):
    holds.hold(tmp_path, 5, HOLDER)
    holds.hold(tmp_path, 10, HOLDER + "0")
    holds.release(tmp_path, "spk_*")  # a glob pattern is a name here, not a wildcard
    holds.release(tmp_path, HOLDER)
    assert holds.held_steps(tmp_path) == {10}


def test_an_unreadable_holds_folder_stops_pruning_not_training(tmp_path, monkeypatch):
    saver = _save(tmp_path, [5, 10])
    assert _steps(tmp_path) == [10]
    saver.save(15, {"model": {"w": torch.zeros(8, 8)}})
    saver.wait()

    def unreadable(_):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(saver_module, "held_steps", unreadable)
    saver.save(20, {"model": {"w": torch.zeros(8, 8)}})
    saver.wait()  # no raise: the save stands, nothing is pruned while the holds are unknown
    assert _steps(tmp_path) == [15, 20]
