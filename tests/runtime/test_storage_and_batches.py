"""Checkpoint folders stay inside the run's checkpoint folder; the data loader's position is the
whole of its state; RNG state round-trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.runtime.worker import rng
from ito_assets.runtime.worker.batches import BatchPlan, ResumableBatches, window_count
from ito_assets.runtime.record.storage import RunLayout


def test_a_link_planted_inside_the_area_cannot_lead_out(tmp_path):
    area, outside = tmp_path / "area" / "run_1", tmp_path / "outside"
    area.mkdir(parents=True)
    outside.mkdir()
    (area / "pretraining").symlink_to(outside)
    with pytest.raises(ItoError) as caught:
        RunLayout.for_run(area, "run_1").stage_dir("pretraining")
    assert caught.value.code is ErrorCode.CHECKPOINT_STORAGE_INVALID
    assert RunLayout.for_run(area, "run_1").stage_dir("mid_training") == area / "mid_training"


def test_a_path_names_the_run_once(tmp_path):
    run_folder = tmp_path / "run_7"  # the folder the server approved: <root>/<run_id>
    layout = RunLayout.for_run(run_folder, "run_7")
    assert layout.run_dir == run_folder
    assert layout.stage_dir("pretraining") == run_folder / "pretraining"
    assert str(layout.stage_dir("pretraining")).count("run_7") == 1


def test_a_run_started_with_the_earlier_layout_keeps_its_folder(tmp_path):
    run_folder = tmp_path / "run_7"
    (run_folder / "run_7" / "pretraining").mkdir(parents=True)  # checkpoints written one level down
    layout = RunLayout.for_run(run_folder, "run_7")
    assert layout.run_dir == run_folder / "run_7"
    assert layout.stage_dir("pretraining") == run_folder / "run_7" / "pretraining"


@pytest.mark.parametrize("name", ["../escape", "a//b", ".hidden", ""])
def test_run_and_stage_names_must_be_safe(tmp_path, name):
    with pytest.raises(ItoError):
        RunLayout.for_run(tmp_path, name)
    with pytest.raises(ItoError):
        RunLayout.for_run(tmp_path, "run_1").stage_dir(name)


def _plan(**changes) -> BatchPlan:
    return BatchPlan(**{"batch_size": 4, "sequence_length": 8, "seed": 3, **changes})


def test_a_loader_resumed_at_a_position_yields_the_same_batches():
    tokens = np.arange(1000, dtype=np.uint16)
    straight = ResumableBatches(tokens, _plan())
    expected = [straight.next_batch() for _ in range(70)]  # crosses two epoch boundaries (30 per epoch)
    resumed = ResumableBatches(tokens, _plan(), position=40)
    for position, x, y in expected[40:]:
        got = resumed.next_batch()
        assert got[0] == position and torch.equal(got[1], x) and torch.equal(got[2], y)
        assert torch.equal(x[:, 1:], y[:, :-1])


def test_ranks_split_the_global_batch_and_skips_jump_over_ranges():
    tokens = np.arange(1000, dtype=np.uint16)
    whole = ResumableBatches(tokens, _plan()).next_batch()[1]
    halves = [ResumableBatches(tokens, _plan(rank=r, world_size=2)).next_batch()[1] for r in (0, 1)]
    assert torch.equal(torch.cat(halves), whole)
    skipping = ResumableBatches(tokens, _plan(skip_ranges=((1, 5),)))
    assert [skipping.next_batch()[0] for _ in range(3)] == [0, 5, 6]


def test_rng_state_round_trips_for_all_three_generators():
    import random

    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    saved = {k: v.clone() for k, v in rng.capture(0).items()}
    first = (torch.rand(3), np.random.rand(3), random.random())
    rng.restore(0, saved)
    second = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], second[0]) and np.array_equal(first[1], second[1]) and first[2] == second[2]


def test_a_stream_holds_a_window_per_sequence_length_after_its_first_token():
    stream = np.arange(1 + 4 * 8)  # 4 windows of 8 + 1 tokens, overlapping by one
    assert window_count(stream, 8) == 4 and window_count(stream[:-1], 8) == 3
    plan = BatchPlan(batch_size=4, sequence_length=8, seed=0)
    assert ResumableBatches(stream, plan).num_windows == 4
    with pytest.raises(ValueError, match="at least batch_size windows"):
        ResumableBatches(stream[:-1], plan)
    assert window_count(np.zeros((5, 2, 8), dtype=np.int64), 8) == 5  # rows: one sequence each
