"""A stage's hand-over to the next lies in the stage's own run folder: Dagster keeps one output per
asset and manifest partition, which another ledger run of the same manifest may have written since."""

from __future__ import annotations

from pathlib import Path

import pytest

from ito_assets.defs.posttraining.assets import _require_this_runs
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.checkpoint import CheckpointRecord
from ito_assets.runtime.record.storage import RunLayout


def _layout(root: Path, run_id: str) -> RunLayout:
    (root / run_id).mkdir(parents=True)
    return RunLayout.for_run(root / run_id, run_id)


def test_a_path_in_the_run_folder_is_held_and_one_beside_it_is_not(tmp_path):
    mine, theirs = _layout(tmp_path, "run_a"), _layout(tmp_path, "run_ab")
    assert mine.holds(mine.run_dir / "pretraining" / "step-000000010")
    assert mine.holds(mine.run_dir)
    assert not mine.holds(theirs.run_dir / "pretraining" / "step-000000010")  # a name that starts alike
    assert not mine.holds(mine.run_dir / ".." / "run_ab" / "x")


def test_a_link_in_the_run_folder_to_another_runs_checkpoint_is_not_held(tmp_path):
    mine, theirs = _layout(tmp_path, "run_a"), _layout(tmp_path, "run_b")
    (theirs.run_dir / "sft").mkdir()
    (mine.run_dir / "sft").symlink_to(theirs.run_dir / "sft")
    assert not mine.holds(mine.run_dir / "sft" / "policy.pt")


class _Outcome:  # only what the check reads
    def __init__(self, path: Path):
        self.checkpoint = CheckpointRecord(stage="sft", path=str(path), sha256="0" * 64, num_bytes=1, policy_version=1)


def test_a_post_training_stage_refuses_a_previous_stage_of_another_run(tmp_path, monkeypatch):
    from ito_assets.defs.posttraining import assets

    monkeypatch.setattr(assets, "StageOutcome", _Outcome)  # the isinstance test, without a trained policy
    mine, theirs = _layout(tmp_path, "run_a"), _layout(tmp_path, "run_b")
    _require_this_runs(_Outcome(mine.posttraining_dir / "sft" / "policy.pt"), mine)
    with pytest.raises(ItoError) as refused:
        _require_this_runs(_Outcome(theirs.posttraining_dir / "sft" / "policy.pt"), mine)
    assert refused.value.code is ErrorCode.CHECKPOINT_STORAGE_INVALID


def test_a_training_stage_refuses_a_previous_stage_of_another_run(tmp_path):
    from ito_assets.defs.training.assets import _require_this_runs as require_training

    class Previous:  # a StageCheckpoint's field the check reads
        def __init__(self, path: Path):
            self.final_checkpoint = str(path)

    mine, theirs = _layout(tmp_path, "run_a"), _layout(tmp_path, "run_b")
    require_training(None, mine)  # the first stage has none
    require_training(Previous(mine.run_dir / "pretraining" / "step-000000010"), mine)
    with pytest.raises(ItoError) as refused:
        require_training(Previous(theirs.run_dir / "pretraining" / "step-000000010"), mine)
    assert refused.value.code is ErrorCode.CHECKPOINT_STORAGE_INVALID


def test_the_first_post_training_stage_refuses_a_pretrained_start_of_another_run(tmp_path):
    from ito_assets.posttraining.base import PolicySpec

    mine, theirs = _layout(tmp_path, "run_a"), _layout(tmp_path, "run_b")
    start = lambda layout: PolicySpec(model_name="micro", vocab_size=512,
                                      init_checkpoint=str(layout.run_dir / "long_context" / "step-000000030"))
    _require_this_runs(start(mine), mine)
    _require_this_runs(PolicySpec(model_name="micro", vocab_size=512), mine)  # from the seed: nothing handed
    with pytest.raises(ItoError) as refused:
        _require_this_runs(start(theirs), mine)
    assert refused.value.code is ErrorCode.CHECKPOINT_STORAGE_INVALID
