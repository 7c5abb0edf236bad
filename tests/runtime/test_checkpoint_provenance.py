"""A checkpoint folder that is not this stage's own: copied in from another run or stage, or a
symbolic link planted in the stage folder. Whole by its own digests, it is still never resumed,
never counted toward `keep_last`, and a save over it removes the link, never what it points to."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.checkpoint import resume
from ito_assets.runtime.checkpoint.saver import CheckpointConfig, Checkpointer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

OURS = {"run_key": "run-a", "stage": "pretrain"}


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((8, 8), value)}, "train": {"step": torch.tensor(int(value))}}


def _save(directory, steps, *, owner, offset=0.0, keep_last=3):
    saver = Checkpointer(CheckpointConfig(directory=directory, interval_steps=5, keep_last=keep_last, owner=owner),
                         process_group=None, rank=0)
    for step in steps:
        saver.save(step, _state(step + offset))
    saver.close()
    return saver


def _resume(directory, owner=OURS):
    state = _state(0)
    point = resume.load_latest(directory, state, rank=0, group=None, owner=owner)
    return point, float(state["model"]["w"][0, 0])


def test_the_marker_names_the_run_and_stage_that_wrote_it(tmp_path):
    _save(tmp_path, [5], owner=OURS)
    assert markers.read_marker(markers.checkpoint_dir(tmp_path, 5)).owner == OURS


@pytest.mark.parametrize("theirs", [{"run_key": "run-b", "stage": "pretrain"}, {"run_key": "run-a", "stage": "sft"}])
def test_a_folder_copied_in_from_another_run_or_stage_is_skipped(tmp_path, theirs):
    ours, other = tmp_path / "ours", tmp_path / "theirs"
    _save(ours, [5], owner=OURS)
    _save(other, [10], owner=theirs, offset=100)
    shutil.copytree(markers.checkpoint_dir(other, 10), markers.checkpoint_dir(ours, 10))
    point, weight = _resume(ours)
    assert (point.step, weight) == (5, 5.0)
    assert [(s.step, s.reason) for s in point.skipped] == [(10, "the marker names another run or stage")]


def test_the_stages_own_folder_and_a_marker_from_before_owners_are_resumed(tmp_path):
    _save(tmp_path / "ours", [5, 10], owner=OURS)
    assert _resume(tmp_path / "ours")[0].step == 10
    _save(tmp_path / "old", [5, 10], owner=None)  # written before markers named an owner
    assert _resume(tmp_path / "old")[0].step == 10
    assert _resume(tmp_path / "ours", owner=None)[0].step == 10  # a caller that names none takes any


def test_a_symlinked_checkpoint_folder_or_file_is_skipped(tmp_path):
    ours, other = tmp_path / "ours", tmp_path / "theirs"
    _save(ours, [5, 10], owner=OURS)
    _save(other, [15], owner=OURS, offset=100)  # even one that names this run and stage
    os.symlink(markers.checkpoint_dir(other, 15), markers.checkpoint_dir(ours, 15))
    shard = next(markers.checkpoint_dir(ours, 10).glob("*.distcp"))
    target = tmp_path / "shard-elsewhere"
    shard.rename(target)
    os.symlink(target, shard)  # same bytes, so its digest matches
    point, weight = _resume(ours)
    assert (point.step, weight) == (5, 5.0)
    link = "a symbolic link in place of the folder or one of its files"
    assert [(s.step, s.reason) for s in point.skipped] == [(15, link), (10, link)]


def test_a_save_over_a_planted_link_replaces_the_link_and_leaves_its_target(tmp_path):
    ours, other = tmp_path / "ours", tmp_path / "theirs"
    _save(other, [10], owner={"run_key": "run-b", "stage": "pretrain"}, offset=100)
    _save(ours, [5], owner=OURS)
    os.symlink(markers.checkpoint_dir(other, 10), markers.checkpoint_dir(ours, 10))
    _save(ours, [10], owner=OURS)
    folder = markers.checkpoint_dir(ours, 10)
    assert not folder.is_symlink() and markers.validate(folder, owner=OURS) is None
    assert _resume(ours)[1] == 10.0
    assert markers.validate(markers.checkpoint_dir(other, 10)) is None  # the target is untouched
    os.symlink(tmp_path / "nowhere", markers.checkpoint_dir(ours, 15))  # a dangling one as well
    _save(ours, [15], owner=OURS)
    assert _resume(ours)[1] == 15.0


@pytest.mark.parametrize("plant", ["copy", "link"])
def test_a_newer_planted_folder_does_not_get_the_stages_own_checkpoints_pruned(tmp_path, plant):
    ours, other = tmp_path / "ours", tmp_path / "theirs"
    _save(other, [500], owner={"run_key": "run-b", "stage": "pretrain"}, offset=100)
    planted = markers.checkpoint_dir(ours, 500)
    ours.mkdir()
    if plant == "copy":
        shutil.copytree(markers.checkpoint_dir(other, 500), planted)
    else:
        os.symlink(markers.checkpoint_dir(other, 500), planted)
    _save(ours, [5, 10], owner=OURS, keep_last=1)
    assert _resume(ours)[0].step == 10  # before the fix: step 10 was pruned as older than "whole" step 500
    assert markers.validate(markers.checkpoint_dir(other, 500)) is None


@pytest.mark.slow
def test_the_worker_stamps_its_run_and_stage_and_resumes_no_other(tmp_path, tokens):
    """One rank, 8 steps: the worker's markers name its run and stage, and an attempt of another
    run pointed at the same stage folder starts fresh rather than from that run's checkpoint."""
    from pathlib import Path

    from ito_assets.runtime.record import events
    from runtime_helpers import run_worker, worker_config

    config = worker_config(tmp_path, tokens, num_steps=8, stop_after_step=8, interval_steps=4)
    first = run_worker(config, nproc=1)
    assert first.returncode == 0, first.stderr[-3000:]
    stage_dir = Path(config.stage_dir)
    assert markers.read_marker(markers.checkpoint_dir(stage_dir, 8)).owner == {"run_key": config.run_key,
                                                                              "stage": config.stage}
    other = run_worker(worker_config(tmp_path, tokens, run_key="run-other", num_steps=1, interval_steps=4, attempt=1),
                       nproc=1)
    assert other.returncode == 0, other.stderr[-3000:]
    resumed = [(e.attempt, e.step) for e in events.read(stage_dir) if e.kind is events.EventKind.RESUME]
    assert resumed == [(0, -1), (1, -1)]  # before the fix: (1, 8), the other run's weights


@pytest.mark.slow
def test_a_checkpoint_written_under_another_data_order_is_not_resumed(tmp_path, tokens):
    """A data position counts global batches in the seed's order: resumed under another batch size
    it read 32 windows twice and skipped others (the documented remedy for a host that cannot hold
    the plan's batch is another `batch_size`). Such a checkpoint is skipped, saying why."""
    from pathlib import Path

    from ito_assets.runtime.record import events
    from runtime_helpers import run_worker, worker_config

    config = worker_config(tmp_path, tokens, num_steps=24, batch_size=8, stop_after_step=8, interval_steps=4)
    first = run_worker(config, nproc=1)
    assert first.returncode != 0, first.stderr[-3000:]
    stage_dir = Path(config.stage_dir)
    written = markers.read_marker(markers.checkpoint_dir(stage_dir, 8)).trained_with["data_order"]
    assert written == {"batch_size": 8, "sequence_length": config.sequence_length, "seed": config.seed}
    again = run_worker(worker_config(tmp_path, tokens, num_steps=48, batch_size=4, attempt=1, interval_steps=4),
                       nproc=1)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = [(e.attempt, e.step) for e in events.read(stage_dir) if e.kind is events.EventKind.RESUME]
    assert resumed == [(0, -1), (1, -1)]  # before: (1, 8), step 8 of batch 8 read as step 8 of batch 4
    log = Path(config.metrics_path).read_text()
    assert "skipped checkpoint step 8: written with another data_order" in log
    # The same data order resumes.
    third = run_worker(worker_config(tmp_path, tokens, num_steps=52, batch_size=4, attempt=2, interval_steps=4),
                       nproc=1)
    assert third.returncode == 0, third.stderr[-3000:]
    assert [(e.attempt, e.step) for e in events.read(stage_dir) if e.kind is events.EventKind.RESUME][-1] == (2, 48)
