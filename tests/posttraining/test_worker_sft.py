"""Supervised fine-tuning on the stage worker: the worker, under the supervisor, trains the batches
and the optimizer of the in-process loop (a constant rate, post-training's betas, no decay) and
ends with its weights; a rerun resumes; a worker killed mid-stage is restarted from its checkpoint
and ends where an uninterrupted run ends; a worker that cannot start fails the stage with a code."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.base import PolicySpec, seeded
from ito_assets.posttraining.fixtures import InstructionPair
from ito_assets.posttraining.optim import BETAS, WORKER_RECIPE
from ito_assets.posttraining.sft import SftConfig, run_sft, sft_batches
from ito_assets.posttraining.vocab import CharVocab
from ito_assets.posttraining.on_worker import ROWS_NAME, WorkerLaunch, sft_on_worker
from ito_assets.posttraining.tasks import battery_split
from ito_assets.runtime.checkpoint import registry
from ito_assets.runtime.stage.config import RESULT_NAME
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.supervision import heartbeat
from ito_assets.runtime.supervision.supervisor import SupervisorConfig
from runtime.runtime_helpers import TRIALS

CODEC = CharVocab()
SPEC = seeded()
# The battery's train side: a stage refuses pairs on the prompts its eval gate holds out.
PAIRS = [InstructionPair(pair_id=str(i), prompt=task.prompt, response=task.answer)
         for i, task in enumerate(battery_split(0.2)[0][:64])]
CONFIG = SftConfig(num_epochs=2, learning_rate=3e-3, batch_size=16)  # 8 steps
SUPERVISOR = SupervisorConfig(startup_timeout_s=90.0, poll_interval_s=0.2, grace_s=3.0, max_restarts=1)
# fp32 on CPU, one rank, one micro-batch: the worker's step and the loop's sum the same floats,
# nearly in the same order. Measured against the loop: losses and weights within 1e-6 over 8
# steps; over 128, losses within 1.3e-5 and weights within 3.1e-5. A resumed batch that differed
# would move that step's loss by orders of magnitude more.
TOLERANCE = 1e-5


def _launch(**changes) -> WorkerLaunch:
    settings = dict(supervisor=SUPERVISOR, interval_steps=3) | changes
    return WorkerLaunch(run=lambda command: subprocess.run(command, check=False), run_key="sft-test", **settings)


def _in_process(config: SftConfig = CONFIG):
    policy = SPEC.factory()()
    return policy, run_sft(policy, CODEC, PAIRS, config)


def _max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def _steps(stage_dir: Path) -> list[tuple[int, int]]:
    return [(e.attempt, e.step) for e in events.read(stage_dir) if e.kind is EventKind.STEP]


@pytest.mark.slow
def test_the_worker_trains_the_in_process_recipe_and_a_rerun_resumes(tmp_path):
    expected_policy, expected = _in_process()
    policy = SPEC.factory()()
    result = sft_on_worker(policy, SPEC, CODEC, PAIRS, CONFIG, stage_dir=tmp_path, launch=_launch())
    assert result.num_steps == expected.num_steps == 8
    assert result.num_response_tokens == expected.num_response_tokens == 64 * 2 * 2  # answer + eos, 2 epochs
    assert max(abs(a - b) for a, b in zip(result.losses, expected.losses)) <= TOLERANCE
    assert _max_difference(policy, expected_policy) <= TOLERANCE
    stage = json.loads((tmp_path / "stage.json").read_text())
    assert stage["optimizer"] == WORKER_RECIPE and stage["learning_rate"] == CONFIG.learning_rate
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["learning_rate"] for m in lines if "learning_rate" in m] == [CONFIG.learning_rate]  # step 8's
    # Throughput counts the rows' tokens: bos, "max 007=" and its answer, 10 a row (no padding here:
    # every pair is as long; tests/runtime/test_sft_rows.py has rows of many lengths).
    [rate] = [m["tokens_per_second"] for m in lines if "tokens_per_second" in m]
    [seconds] = [e.seconds for e in events.read(tmp_path) if e.kind is EventKind.STEP and e.step == 8]
    batches, _ = sft_batches(CODEC, PAIRS, CONFIG)
    assert rate * seconds == pytest.approx(batches.tokens_at(7)) and batches.tokens_at(7) == 16 * 10
    assert _steps(tmp_path) == [(0, s) for s in range(1, 9)]
    # The same stage again: the worker resumes at its final checkpoint and trains nothing more.
    again = SPEC.factory()()
    rerun = sft_on_worker(again, SPEC, CODEC, PAIRS, CONFIG, stage_dir=tmp_path, launch=_launch())
    assert _max_difference(again, policy) == 0.0 and rerun.losses == result.losses
    assert _steps(tmp_path) == [(0, s) for s in range(1, 9)]
    assert [(e.attempt, e.step) for e in events.read(tmp_path) if e.kind is EventKind.RESUME][-1] == (1, 8)


def assert_restarted_once(stage_dir: Path, killed: list[int], *, num_steps: int, first_checkpoint: int) -> int:
    """The kill landed mid-stage; the supervisor restarted the dead worker once; the second attempt
    resumed from a checkpoint between the first one and the kill; every step was trained. Returns
    the step resumed at."""
    assert killed and killed[0] < num_steps, "the kill must land before the last step"
    report = json.loads((stage_dir / "supervision.json").read_text())
    assert report["num_attempts"] == 2 and report["faults"][0]["kind"] == "dead"
    resumed = [(e.attempt, e.step) for e in events.read(stage_dir) if e.kind is EventKind.RESUME]
    assert resumed[0] == (0, -1) and resumed[1][0] == 1 and first_checkpoint <= resumed[1][1] <= killed[0]
    assert sorted({step for _, step in _steps(stage_dir)}) == list(range(1, num_steps + 1))
    return resumed[1][1]


def _kill_once_past_the_first_checkpoint(stage_dir: Path, killed: list[int]):
    """Run the supervisor; SIGKILL the worker's rank once its first checkpoint is whole, mid-stage.

    A save's beat is forced while a training beat waits 0.2 s: on a fast host every beat after the
    first checkpoint may be a save's, so the kill lands on either."""
    def run(command):
        supervisor = subprocess.Popen(command)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and supervisor.poll() is None:
            beat = heartbeat.read_all(stage_dir / "heartbeats", attempt=0).get(0)
            if registry.read(stage_dir) and beat is not None and beat.phase in ("training", "checkpointing"):
                os.kill(beat.pid, signal.SIGKILL)
                killed.append(beat.step)
                break
            time.sleep(0.005)
        return supervisor.wait(timeout=180)
    return run


@pytest.mark.slow
def test_two_ranks_train_the_batch_one_process_trains(tmp_path):
    """The stage on two data-parallel ranks (FSDP2, each half the batch): the loop's losses and
    weights, within the layouts' tolerance (tests/runtime/test_layouts.py), and the layout recorded."""
    expected_policy, expected = _in_process()
    policy = SPEC.factory()()
    launch = _launch(supervisor=dataclasses.replace(SUPERVISOR, nproc_per_node=2))
    result = sft_on_worker(policy, SPEC, CODEC, PAIRS, CONFIG, stage_dir=tmp_path, launch=launch)
    ran = json.loads((tmp_path / RESULT_NAME).read_text())["layout"]
    assert ran["ran"]["dp_shard"] == 2 and ran["ran"]["micro_batch_size"] == CONFIG.batch_size // 2
    assert result.num_steps == expected.num_steps and result.num_response_tokens == expected.num_response_tokens
    assert max(abs(a - b) for a, b in zip(result.losses, expected.losses)) <= 1e-4
    assert _max_difference(policy, expected_policy) <= 1e-4


@pytest.mark.slow
@pytest.mark.long  # `make test` kills DPO's and RLVR's workers mid-stage, on the same worker launch
@pytest.mark.parametrize("trial", TRIALS)  # a fault of the matrix: five times in `make test-long`
def test_a_worker_killed_mid_stage_restarts_from_its_checkpoint_and_ends_where_one_run_ends(tmp_path, trial):
    # 32 epochs of 4 steps: enough steps after the first checkpoint (step 3) for the kill to land.
    # The uninterrupted run is the worker's own: a resume restores weights, optimizer state and the
    # batch order exactly, so the two end bit for bit equal. Against the in-process loop the worker
    # drifts by the host's float order (3.1e-5 here, 1.7e-4 on CI's machine), too loose to catch a
    # wrong resume.
    config = SftConfig(num_epochs=32, learning_rate=3e-3, batch_size=16)
    expected_policy = SPEC.factory()()
    expected = sft_on_worker(expected_policy, SPEC, CODEC, PAIRS, config, stage_dir=tmp_path / "one-run",
                               launch=_launch())
    stage_dir = tmp_path / "killed"
    killed: list[int] = []
    launch = WorkerLaunch(run=_kill_once_past_the_first_checkpoint(stage_dir, killed), run_key="sft-test",
                          supervisor=SUPERVISOR, interval_steps=3)
    policy = SPEC.factory()()
    result = sft_on_worker(policy, SPEC, CODEC, PAIRS, config, stage_dir=stage_dir, launch=launch)
    assert_restarted_once(stage_dir, killed, num_steps=expected.num_steps, first_checkpoint=3)
    assert result.losses == expected.losses
    assert _max_difference(policy, expected_policy) == 0.0


def test_a_worker_that_cannot_load_its_start_fails_the_stage_with_a_code(tmp_path):
    spec = PolicySpec(model_name=SPEC.model_name, vocab_size=SPEC.vocab_size, init_checkpoint=str(tmp_path / "absent"))
    with pytest.raises(ItoError) as raised:
        sft_on_worker(SPEC.factory()(), spec, CODEC, PAIRS, CONFIG, stage_dir=tmp_path / "sft",
                        launch=_launch(supervisor=SupervisorConfig(startup_timeout_s=90.0, poll_interval_s=0.2,
                                                                   max_restarts=0)))
    assert raised.value.code is ErrorCode.INTERNAL_ERROR and str(raised.value).endswith("ended failed after 1 attempt")


def test_a_fresh_start_on_the_worker_needs_the_stages_seed(tmp_path):
    with pytest.raises(ValueError, match="the policy's seed is the stage's"):
        sft_on_worker(SPEC.factory()(), seeded(seed=1), CODEC, PAIRS, CONFIG, stage_dir=tmp_path, launch=_launch())
    assert not (tmp_path / ROWS_NAME).exists()  # refused before anything is written


def test_a_batch_fills_at_exactly_its_pairs_and_is_refused_one_below():
    config = SftConfig(num_epochs=3, learning_rate=3e-3, batch_size=16)
    batches, num_steps = sft_batches(CODEC, PAIRS[:16], config)
    assert num_steps == 3 and batches.batches_per_epoch == 1
    assert sft_batches(CODEC, PAIRS[:17], config)[1] == 3  # the 17th pair waits for a later epoch's draw
    with pytest.raises(ValueError, match="15 pairs cannot fill one batch of 16"):
        sft_batches(CODEC, PAIRS[:15], config)


def test_the_worker_recipe_is_a_constant_rate_with_post_trainings_optimizer():
    from ito_assets.training.trainer import TrainConfig, learning_rate_at

    train = TrainConfig(num_steps=50, batch_size=8, sequence_length=16, learning_rate=3e-3, **WORKER_RECIPE)
    assert {learning_rate_at(step, train) for step in range(50)} == {3e-3}
    assert (train.beta1, train.beta2) == BETAS and train.weight_decay == 0.0 and train.grad_clip == 1.0


def _windows(log) -> list[tuple[float, float]]:
    return sorted((e.at - e.seconds, e.at) for e in log if e.kind is EventKind.ALLOCATION)


@pytest.mark.slow
def test_the_stage_on_the_worker_is_one_event_log_whose_windows_never_overlap(tmp_path):
    """The worker's steps and the supervisor's window, the stage's evaluations, save and its own
    windows before and after the worker's, in one folder; every second counted once."""
    from ito_assets.manifest.schema import PostTrainingEval, SftStep
    from ito_assets.posttraining.fixtures import write_jsonl
    from ito_assets.posttraining.pipeline import SFT_FILE, run_stage
    from ito_assets.posttraining.stage import PostTrainingRuntime
    from ito_assets.runtime.record.goodput import summarize

    path = tmp_path / "pairs" / SFT_FILE
    write_jsonl(path, PAIRS[:24])  # 3 steps of 8 pairs
    data = {"uri": f"dataroot://pairs/{SFT_FILE}", "format": "jsonl", "license": "CC0-1.0",
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    step = SftStep.model_validate({"kind": "sft", "num_epochs": 1, "learning_rate": 3e-3, "data": data})
    began = time.time()
    outcome = run_stage(step, start=SPEC, data_root=tmp_path, out_dir=tmp_path / "out",
                        runtime=PostTrainingRuntime(), launch=_launch(),
                        evaluation=PostTrainingEval(num_prompts=8))
    ended = time.time()
    log = events.read(Path(outcome.stage_dir))
    windows = _windows(log)
    assert len(windows) == 3  # the stage's before and after, the worker's attempt between
    assert all(a[1] <= b[0] + 1e-3 for a, b in zip(windows, windows[1:]))  # none overlaps the next
    assert began - 1e-3 <= windows[0][0] and windows[-1][1] <= ended + 1e-3
    steps = [e for e in log if e.kind is EventKind.STEP]
    assert [(e.attempt, e.step) for e in steps] == [(0, 1), (0, 2), (0, 3)]
    assert [e.loss for e in steps] == pytest.approx(outcome.metrics["loss_curve"])
    assert [e.kind for e in log].count(EventKind.EVALUATION) == 2 and outcome.checkpoint.policy_version == 3
    figures = summarize(log, posttraining=True)
    assert figures.num_steps == 3 and figures.num_wasted_steps == 0 and figures.other_seconds >= 0
    assert figures.allocated_seconds == pytest.approx(sum(b - a for a, b in windows))


@pytest.mark.slow
def test_from_a_pretrained_checkpoint_the_worker_takes_its_weights_and_starts_its_own_optimizer(tmp_path):
    """The pretraining checkpoint holds AdamW's state with its betas (0.9, 0.95) and decay 0.1:
    taken along, they would replace post-training's (0.999, no decay). The worker starts a fresh
    AdamW on the weights alone, as the in-process loop does."""
    from ito_assets.posttraining.base import load_pretrained, pretrained
    from posttraining.pretrained_checkpoint import make_pretrained

    base = make_pretrained(tmp_path / "pretrained", num_steps=3)
    spec = pretrained(model_name="tiny", vocab_size=base.tokens.vocab_size, checkpoint=base.checkpoint,
                      tokenizer=base.tokenizer)
    codec, config = spec.codec(), SftConfig(num_epochs=1, learning_rate=1e-3, batch_size=16)  # 4 steps
    expected_policy = load_pretrained(spec.factory()(), Path(base.checkpoint))
    expected = run_sft(expected_policy, codec, PAIRS, config)
    policy = spec.factory()()
    result = sft_on_worker(policy, spec, codec, PAIRS, config, stage_dir=tmp_path / "sft", launch=_launch())
    # Measured: losses 4.8e-7 and weights 1.2e-5 apart; with the checkpoint's optimizer taken
    # along, 2.2 and 6.9e-3. The bound leaves CI's host its float order (the tiny model's sums are long).
    assert max(abs(a - b) for a, b in zip(result.losses, expected.losses)) <= 1e-3
    assert _max_difference(policy, expected_policy) <= 1e-3
