"""A post-training stage's launch writes its inputs into the stage folder (rows, start weights,
DPO's reference table, RLVR's tasks) only while no supervisor runs that stage: a second launch of
a running stage is refused before it touches the first one's files, and launches nothing. A
launch overtaken by a later one (which wrote its inputs before the first's supervisor started, or
before the first read its result) hands nothing on: only the later launch trains and returns."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest
import torch

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.base import seeded
from ito_assets.posttraining.dpo import DpoConfig
from ito_assets.posttraining.fixtures import InstructionPair, PreferencePair
from ito_assets.posttraining.on_worker import (REFERENCE_NAME, ROWS_NAME, START_NAME, TASKS_NAME, WorkerLaunch,
                                               dpo_on_worker, rlvr_on_worker, sft_on_worker)
from ito_assets.posttraining.pipeline import battery
from ito_assets.posttraining.rlvr import RlvrConfig
from ito_assets.posttraining.sft import SftConfig, run_sft
from ito_assets.posttraining.vocab import CharVocab
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.supervision.supervisor import LOCK_NAME, SupervisorConfig, supervising

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
    rlvr_on_worker(SPEC.factory()(), SPEC, battery()[0][:4], config, stage_dir=stage_dir,
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
        with pytest.raises(ItoError, match="supervisor pid .* holds the stage folder .*: this launch wrote and started "
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
    assert evaluated == [] and sorted(p.name for p in stage.iterdir()) == [pipeline.LAUNCH_LOCK_NAME, LOCK_NAME]


@pytest.mark.parametrize("on_worker", [True, False], ids=["on the worker", "in process"])
def test_a_second_launch_while_the_first_evaluates_records_and_evaluates_nothing(tmp_path, monkeypatch, on_worker):
    """Two launches of one stage, the first evaluating before its supervisor started (it held no
    lock of the supervisor's yet): the second is refused before its timeline writes a line, and the
    first's log stays one launch's."""
    import threading

    from ito_assets.manifest.schema import RlvrStep
    from ito_assets.posttraining import pipeline

    real, entered, release, evaluated = pipeline._evaluate, threading.Event(), threading.Event(), []

    def evaluate(*args, **kwargs):
        evaluated.append(threading.current_thread().name)
        entered.set()
        assert release.wait(60)
        raise RuntimeError("the first launch stops here")

    monkeypatch.setattr(pipeline, "_evaluate", evaluate)
    step = RlvrStep.model_validate({"kind": "rlvr", "num_steps": 1, "groups_per_step": 1, "group_size": 2})
    stage = tmp_path / "out" / "rlvr"
    run = lambda: pipeline.run_stage(step, start=seeded(), data_root=tmp_path, out_dir=tmp_path / "out",  # noqa: E731
                                     launch=LAUNCH if on_worker else None)
    failures = []
    first = threading.Thread(target=lambda: failures.append(pytest.raises(RuntimeError, run)), name="first")
    first.start()
    try:
        assert entered.wait(60)
        logged = events.read(stage)
        with pytest.raises(ItoError, match="another launch of the RLVR stage runs in") as refused:
            run()
        assert refused.value.code is ErrorCode.STAGE_BUSY
        assert events.read(stage) == logged and evaluated == ["first"]
    finally:
        release.set()
        first.join(60)
    assert len(failures) == 1 and real is not pipeline._evaluate
    kinds = [e.kind for e in events.read(stage)]
    assert kinds.count(EventKind.STARTUP) == 1 and kinds.count(EventKind.ALLOCATION) == 1
    run_again = pytest.raises(RuntimeError, run)  # once the first ended, a launch runs
    assert "first launch stops here" in str(run_again.value) and evaluated == ["first", "MainThread"]


# --- a launch overtaken by a later launch of the same stage ---------------------------------------

OTHER_INSTRUCTIONS = [InstructionPair(pair_id=str(i), prompt=f"min {i:03d}=", response=min(f"{i:03d}")) for i in range(16)]
FAST = SupervisorConfig(startup_timeout_s=90.0, poll_interval_s=0.2, grace_s=3.0, max_restarts=0)
SFT = SftConfig(batch_size=8)  # 2 steps


def _running(run_key: str, before=None, after=None) -> WorkerLaunch:
    """A launch that runs its supervisor for real, with `before()` and `after()` around it."""
    def run(command):
        if before:
            before()
        done = subprocess.run(command, check=False)
        if after:
            after()
        if done.returncode:
            raise subprocess.CalledProcessError(done.returncode, command)
    return WorkerLaunch(run=run, run_key=run_key, supervisor=FAST)


def _weights(policy) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in policy.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tolerance: float = 0.0) -> bool:
    return all(float((a[name] - b[name]).abs().max()) <= tolerance for name in a)


def _trained_attempts(stage_dir: Path) -> set[int]:
    return {e.attempt for e in events.read(stage_dir) if e.kind is EventKind.STEP}


@pytest.mark.slow
def test_a_launch_overtaken_before_its_supervisor_started_trains_and_hands_on_nothing(tmp_path):
    """The later launch writes all its inputs and trains them before the first launch's supervisor
    takes the folder: that supervisor starts nothing, and the first launch is STAGE_BUSY with its
    policy untouched; the later launch's policy is trained on its own pairs."""
    later_policy, later = SPEC.factory()(), []
    overtake = lambda: later.append(sft_on_worker(later_policy, SPEC, CODEC, OTHER_INSTRUCTIONS, SFT,  # noqa: E731
                                                  stage_dir=tmp_path, launch=_running("later")))
    first_policy = SPEC.factory()()
    untrained = _weights(first_policy)
    with pytest.raises(ItoError, match="a later launch of the stage rewrote its inputs in .* after this one wrote them: "
                                       "this launch hands nothing on") as overtaken:
        sft_on_worker(first_policy, SPEC, CODEC, INSTRUCTIONS, SFT, stage_dir=tmp_path, launch=_running("first", before=overtake))
    assert overtaken.value.code is ErrorCode.STAGE_BUSY and _same(_weights(first_policy), untrained)
    expected = SPEC.factory()()
    run_sft(expected, CODEC, OTHER_INSTRUCTIONS, SFT)
    assert later[0].num_steps == 2 and _same(_weights(later_policy), _weights(expected), tolerance=1e-5)
    assert len(_trained_attempts(tmp_path)) == 1  # the later launch's supervisor's only


@pytest.mark.slow
def test_a_launch_overtaken_before_it_read_its_result_hands_on_nothing(tmp_path):
    """The first launch's supervisor trained its pairs; a later launch wrote its inputs (and its
    run failed) before the first read the report and the final weights, which may no longer be
    the first's: the first launch is STAGE_BUSY with its policy untouched."""
    def overtake():
        with pytest.raises(subprocess.CalledProcessError):
            sft_on_worker(SPEC.factory()(), SPEC, CODEC, OTHER_INSTRUCTIONS, SFT, stage_dir=tmp_path,
                          launch=WorkerLaunch(run=_failing, run_key="later", supervisor=FAST))

    first_policy = SPEC.factory()()
    untrained = _weights(first_policy)
    with pytest.raises(ItoError, match="a later launch of the stage rewrote its inputs") as overtaken:
        sft_on_worker(first_policy, SPEC, CODEC, INSTRUCTIONS, SFT, stage_dir=tmp_path, launch=_running("first", after=overtake))
    assert overtaken.value.code is ErrorCode.STAGE_BUSY and _same(_weights(first_policy), untrained)
    assert len(_trained_attempts(tmp_path)) == 1  # the first launch's supervisor trained


def _failing(command):
    raise subprocess.CalledProcessError(1, command)


def test_a_failed_launch_kept_from_its_result_keeps_its_own_failure_as_the_cause(tmp_path):
    """Its run raised (a Pipes failure, say) and a supervisor holds the folder when it comes to
    read the report: STAGE_BUSY, saying it read no result, with the run's own error chained."""
    with contextlib.ExitStack() as held:
        def run(command):
            held.enter_context(supervising(tmp_path))  # e.g. one started by hand meanwhile
            raise RuntimeError("the Pipes session broke")

        with pytest.raises(ItoError, match="holds the stage folder .*: this launch launched its supervisor and read no "
                                           "result") as refused:
            sft_on_worker(SPEC.factory()(), SPEC, CODEC, INSTRUCTIONS, SFT, stage_dir=tmp_path,
                          launch=WorkerLaunch(run=run, run_key="first", supervisor=FAST))
    assert refused.value.code is ErrorCode.STAGE_BUSY
    assert isinstance(refused.value.__cause__, RuntimeError)  # shown as the direct cause
