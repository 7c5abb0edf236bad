"""A post-training stage's launch writes its inputs into the stage folder (rows, start weights,
DPO's reference table, RLVR's tasks) only while no supervisor runs that stage: a second launch of
a running stage is refused before it touches the first one's files, and launches nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.base import seeded
from ito_assets.posttraining.dpo import DpoConfig
from ito_assets.posttraining.fixtures import InstructionPair, PreferencePair
from ito_assets.posttraining.on_worker import (REFERENCE_NAME, ROWS_NAME, START_NAME, TASKS_NAME, WorkerLaunch,
                                               dpo_on_worker, rlvr_on_worker, sft_on_worker)
from ito_assets.posttraining.pipeline import battery
from ito_assets.posttraining.rlvr import RlvrConfig
from ito_assets.posttraining.sft import SftConfig
from ito_assets.posttraining.stage import PostTrainingRuntime
from ito_assets.posttraining.vocab import CharVocab
from ito_assets.runtime.supervision.supervisor import LOCK_NAME, supervising

CODEC = CharVocab()
SPEC = seeded()
INSTRUCTIONS = [InstructionPair(pair_id=str(i), prompt=f"max {i:03d}=", response=max(f"{i:03d}")) for i in range(16)]
PREFERENCES = [PreferencePair(pair_id=str(i), prompt=f"max {i:03d}=", chosen=max(f"{i:03d}"), rejected="x")
               for i in range(16)]


def _never_launched(command) -> None:
    raise AssertionError(f"a refused launch started {command}")


LAUNCH = WorkerLaunch(run=_never_launched, run_key="inputs-test")


def _sft(stage_dir: Path) -> None:
    sft_on_worker(SPEC.factory()(), SPEC, CODEC, INSTRUCTIONS, SftConfig(batch_size=8), stage_dir=stage_dir, launch=LAUNCH)


def _dpo(stage_dir: Path) -> None:
    dpo_on_worker(SPEC.factory()(), SPEC, CODEC, PREFERENCES, DpoConfig(batch_size=8), stage_dir=stage_dir, launch=LAUNCH)


def _rlvr(stage_dir: Path) -> None:
    config = RlvrConfig(num_steps=1, groups_per_step=2, group_size=2, max_new_tokens=4, overlong_cache=2)
    rlvr_on_worker(SPEC.factory()(), SPEC, battery(PostTrainingRuntime())[0][:4], config, stage_dir=stage_dir,
                   launch=LAUNCH, prompt_length=8)


@pytest.mark.parametrize(("launch", "inputs"), [
    (_sft, [ROWS_NAME]),
    (_dpo, [ROWS_NAME, REFERENCE_NAME, START_NAME]),
    (_rlvr, [TASKS_NAME, START_NAME]),
], ids=["sft", "dpo", "rlvr"])
def test_a_second_launch_of_a_running_stage_touches_none_of_its_inputs(tmp_path, launch, inputs):
    planted = {}
    for name in inputs:  # the running stage's own (a start is a checkpoint folder; a file stands in)
        planted[name] = f"the running stage's {name}".encode()
        (tmp_path / name).write_bytes(planted[name])
    with supervising(tmp_path):  # the first launch's supervisor watches its attempts
        with pytest.raises(ItoError, match="supervisor pid .* runs the stage in .*: this launch wrote and started "
                                           "nothing there") as refused:
            launch(tmp_path)
    assert refused.value.code is ErrorCode.STAGE_BUSY
    assert {name: (tmp_path / name).read_bytes() for name in inputs} == planted


def test_a_stage_run_while_another_supervisor_runs_it_records_and_evaluates_nothing_there(tmp_path, monkeypatch):
    """Refused before the stage's timeline writes its events there or the first evaluation runs."""
    from helpers import spy_calls
    from ito_assets.manifest.schema import RlvrStep
    from ito_assets.posttraining import pipeline

    evaluated = spy_calls(monkeypatch, pipeline, "_evaluate", stop=True)
    stage = tmp_path / "out" / "rlvr"
    stage.mkdir(parents=True)
    step = RlvrStep.model_validate({"kind": "rlvr", "num_steps": 1, "groups_per_step": 1, "group_size": 2})
    with supervising(stage):
        with pytest.raises(ItoError) as refused:
            pipeline.run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out", launch=LAUNCH)
    assert refused.value.code is ErrorCode.STAGE_BUSY
    assert evaluated == [] and sorted(p.name for p in stage.iterdir()) == [LOCK_NAME]
