"""The sizes that decide a post-training stage's compute are the manifest recipe's, so the
confirmation binds them: a step's `batch_size` (SFT, DPO) and RLVR's `num_steps` and
`groups_per_step` are what the stage trains with, and the `posttraining` resource refuses them
rather than train with other sizes than its caller says."""

from __future__ import annotations

import hashlib
from pathlib import Path

import dagster as dg
import pydantic
import pytest

from ito_assets.defs.posttraining.resources import PostTrainingResource
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DpoStep, RlvrStep, SftStep
from ito_assets.posttraining.base import seeded
from ito_assets.posttraining.fixtures import instruction_pairs, preference_pairs, write_jsonl
from ito_assets.posttraining.pipeline import DPO_FILE, SFT_FILE, battery, run_stage
from ito_assets.posttraining.rlvr import RlvrConfig
from ito_assets.posttraining.stage import PostTrainingRuntime

RUNTIME = PostTrainingRuntime(num_eval_prompts=4)
TRAIN, _ = battery(RUNTIME)


def _bound(data_root: Path, name: str, pairs: list) -> dict:
    path = data_root / "pairs" / name
    write_jsonl(path, pairs)
    return {"uri": f"dataroot://pairs/{name}", "format": "jsonl", "license": "CC0-1.0",
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _sft(data_root: Path, num_pairs: int, batch_size: int) -> SftStep:
    data = _bound(data_root, SFT_FILE, instruction_pairs(TRAIN[:num_pairs], copies=1, seed=0, error_rate=0.0))
    return SftStep.model_validate({"kind": "sft", "batch_size": batch_size, "data": data})


@pytest.mark.parametrize("batch_size,num_steps", [(8, 3), (12, 2), (24, 1)])
def test_sft_takes_as_many_steps_as_the_recipes_batch_size_makes(tmp_path, batch_size, num_steps):
    step = _sft(tmp_path, 24, batch_size)
    outcome = run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME)
    assert len(outcome.metrics["loss_curve"]) == num_steps


@pytest.mark.parametrize("batch_size,refused", [(24, False), (25, True)])
def test_a_pair_file_is_refused_below_one_batch_of_the_recipes_size(tmp_path, batch_size, refused):
    step = _sft(tmp_path, 24, batch_size)
    if not refused:
        run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME)
        return
    with pytest.raises(ItoError) as error:
        run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME)
    assert error.value.code is ErrorCode.POSTTRAINING_DATA_INVALID and "fewer than one batch of 25" in error.value.message


def test_dpo_takes_as_many_steps_as_the_recipes_batch_size_makes(tmp_path):
    data = _bound(tmp_path, DPO_FILE, preference_pairs(TRAIN[:16], copies=1, seed=0))
    step = DpoStep.model_validate({"kind": "dpo", "batch_size": 4, "data": data})
    outcome = run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME)
    assert len(outcome.metrics["loss_curve"]) == len(preference_pairs(TRAIN[:16], copies=1, seed=0)) // 4


def test_rlvr_runs_the_recipes_steps_of_its_groups(tmp_path):
    step = RlvrStep.model_validate({"kind": "rlvr", "num_steps": 2, "groups_per_step": 3, "group_size": 2})
    outcome = run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", runtime=RUNTIME)
    assert len(outcome.metrics["reward_curve"]) == 2
    # the groups a step trains on: the loop's config is the step's (the run's own figures do not count them)
    config = RlvrConfig.from_step(step, max_new_tokens=RUNTIME.max_new_tokens, overlong_cache=RUNTIME.overlong_cache)
    assert (config.num_steps, config.groups_per_step, config.group_size) == (2, 3, 2)


@pytest.mark.parametrize("field", ["batch_size", "rlvr_num_steps", "rlvr_groups_per_step"])
def test_the_resource_refuses_the_sizes_the_recipe_holds(field):
    with pytest.raises(pydantic.ValidationError):
        PostTrainingResource(**{field: 4})

    @dg.asset
    def uses(posttraining: PostTrainingResource) -> int:
        return posttraining.num_eval_prompts

    with pytest.raises(dg.DagsterInvalidConfigError, match=field):
        dg.materialize([uses], resources={"posttraining": PostTrainingResource()},
                       run_config={"resources": {"posttraining": {"config": {field: 4}}}})
