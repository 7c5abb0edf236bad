"""DPO on the stage worker: from the policy it is given (written as a checkpoint the worker loads,
also the frozen reference, whose log-probabilities the worker computes at its start), the worker
trains the in-process loop's batches with its loss and optimizer, reports each step's accuracy and
margin, and ends with its weights; a rerun resumes; a worker killed mid-stage is restarted from
its checkpoint, reads the reference its first attempt wrote, and ends bit for bit where an
uninterrupted run ends."""

from __future__ import annotations

import copy
import json
import subprocess

import numpy as np
import pytest
import torch

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.base import seeded
from ito_assets.posttraining.dpo import DpoConfig, dpo_batches, reference_logprobs, run_dpo
from ito_assets.posttraining.fixtures import InstructionPair, preference_pairs
from ito_assets.posttraining.on_worker import REFERENCE_NAME, START_NAME, WorkerLaunch, dpo_on_worker
from ito_assets.posttraining.optim import WORKER_RECIPE
from ito_assets.posttraining.pipeline import battery
from ito_assets.posttraining.sft import SftConfig, run_sft
from ito_assets.posttraining.vocab import CharVocab
from ito_assets.runtime.supervision.supervisor import SupervisorConfig
from ito_assets.runtime.worker import train_state
from posttraining.test_worker_sft import (_kill_once_past_the_first_checkpoint, _max_difference, _steps,
                                          assert_restarted_once)
from runtime.runtime_helpers import TRIALS

CODEC = CharVocab()
SPEC = seeded()
PAIRS = preference_pairs(battery()[0][:64], copies=1, seed=0)
CONFIG = DpoConfig(learning_rate=3e-3, batch_size=16, num_epochs=2, rpo_alpha=1.0, label_smoothing=0.1)  # 8 steps
SUPERVISOR = SupervisorConfig(startup_timeout_s=90.0, poll_interval_s=0.2, grace_s=3.0, max_restarts=1)
# fp32 on CPU, one rank, one micro-batch, the same reference values: measured against the loop,
# losses equal and weights within 1.2e-7 over 8 steps.
TOLERANCE = 1e-5


def _launch() -> WorkerLaunch:
    return WorkerLaunch(run=lambda command: subprocess.run(command, check=False), run_key="dpo-test",
                        supervisor=SUPERVISOR, interval_steps=3)


def _sft_policy():
    """A start that is not the seed's weights: the SFT stage DPO follows, trained briefly here."""
    policy = SPEC.factory()()
    run_sft(policy, CODEC, [InstructionPair(pair_id=p.pair_id, prompt=p.prompt, response=p.chosen) for p in PAIRS],
            SftConfig(num_epochs=2, learning_rate=3e-3, batch_size=16))
    return policy


START = _sft_policy()


@pytest.mark.slow
def test_the_worker_trains_the_in_process_dpo_from_the_policy_it_is_given_and_a_rerun_resumes(tmp_path):
    expected_policy = copy.deepcopy(START)
    expected = run_dpo(expected_policy, copy.deepcopy(START), CODEC, PAIRS, CONFIG)
    policy = copy.deepcopy(START)
    # An earlier launch's table, of the right shape but not this start's: the launch must not read it.
    np.save(tmp_path / REFERENCE_NAME, np.full((len(PAIRS), 2), -1.0, dtype=np.float32))
    result = dpo_on_worker(policy, SPEC, CODEC, PAIRS, CONFIG, stage_dir=tmp_path, launch=_launch())
    assert result.num_steps == expected.num_steps == 8
    assert max(abs(a - b) for a, b in zip(result.losses, expected.losses)) <= TOLERANCE
    assert result.accuracies == pytest.approx(expected.accuracies, abs=1e-6)
    assert result.mean_margin == pytest.approx(expected.mean_margin, abs=TOLERANCE)
    assert _max_difference(policy, expected_policy) <= TOLERANCE
    # The worker started from the policy's weights, not the seed's, with post-training's optimizer.
    started = SPEC.factory()()
    assert train_state.load_weights(started, tmp_path / START_NAME / "step-000000000") is None
    assert _max_difference(started, START) == 0.0
    stage = json.loads((tmp_path / "stage.json").read_text())
    assert stage["optimizer"] == WORKER_RECIPE and stage["init_optimizer"] is False
    assert stage["preference"]["beta"] == CONFIG.beta and stage["preference"]["rpo_alpha"] == 1.0
    # The worker's reference pass, from the start it loaded, gives the loop's values (another process's float order).
    batches, _ = dpo_batches(CODEC, PAIRS, CONFIG)
    np.testing.assert_allclose(np.load(tmp_path / REFERENCE_NAME), reference_logprobs(START, batches.tokens),
                               atol=1e-5, rtol=0)
    assert _steps(tmp_path) == [(0, s) for s in range(1, 9)]
    # The same stage again: the worker resumes at its final checkpoint and trains nothing more.
    again = copy.deepcopy(START)
    rerun = dpo_on_worker(again, SPEC, CODEC, PAIRS, CONFIG, stage_dir=tmp_path, launch=_launch())
    assert _max_difference(again, policy) == 0.0 and rerun.losses == result.losses
    assert rerun.accuracies == result.accuracies and _steps(tmp_path) == [(0, s) for s in range(1, 9)]
    assert _reference_passes(tmp_path) == 1  # resumed at its last step: nothing to train, no reference needed


def _reference_passes(stage_dir) -> int:
    lines = (stage_dir / "metrics.jsonl").read_text().splitlines()
    return sum("reference log-probabilities of 64 pairs computed" in json.loads(line).get("message", "")
               for line in lines)


@pytest.mark.slow
@pytest.mark.parametrize("trial", TRIALS)  # a fault of the matrix: once here, five times in `make test-long`
def test_a_dpo_worker_killed_mid_stage_restarts_from_its_checkpoint_and_ends_where_one_run_ends(tmp_path, trial):
    # 16 epochs of 4 steps: enough steps after the first checkpoint (step 3) for the kill to land.
    config = DpoConfig(learning_rate=3e-3, batch_size=16, num_epochs=16, rpo_alpha=1.0)
    expected_policy = copy.deepcopy(START)
    expected = dpo_on_worker(expected_policy, SPEC, CODEC, PAIRS, config, stage_dir=tmp_path / "one-run",
                             launch=_launch())
    stage_dir = tmp_path / "killed"
    killed: list[int] = []
    launch = WorkerLaunch(run=_kill_once_past_the_first_checkpoint(stage_dir, killed), run_key="dpo-test",
                          supervisor=SUPERVISOR, interval_steps=3)
    policy = copy.deepcopy(START)
    result = dpo_on_worker(policy, SPEC, CODEC, PAIRS, config, stage_dir=stage_dir, launch=launch)
    assert_restarted_once(stage_dir, killed, num_steps=expected.num_steps, first_checkpoint=3)
    assert _reference_passes(stage_dir) == 1  # the first attempt's; the restart read the file it wrote
    assert result.losses == expected.losses and result.accuracies == expected.accuracies
    assert _max_difference(policy, expected_policy) == 0.0


def test_dpo_rows_are_refused_below_one_batch_and_fill_at_exactly_one():
    config = DpoConfig(batch_size=16, num_epochs=3)
    batches, num_steps = dpo_batches(CODEC, PAIRS[:16], config)
    assert num_steps == 3 and batches.batches_per_epoch == 1
    with pytest.raises(ValueError, match="15 pairs cannot fill one batch of 16"):
        dpo_batches(CODEC, PAIRS[:15], config)


def test_the_reference_log_probabilities_do_not_depend_on_the_chunk(monkeypatch):
    from ito_assets.posttraining import reference_pass

    rows = dpo_batches(CODEC, PAIRS, CONFIG)[0].tokens
    whole = reference_logprobs(START, rows)  # every pair in one pass
    one_pair = 2 * rows.shape[-1] * START.config.vocab_size * 4
    monkeypatch.setattr(reference_pass, "LOGITS_BUDGET_BYTES", 5 * one_pair)  # 64 pairs: chunks of 5, the last of 4
    np.testing.assert_allclose(reference_logprobs(START, rows), whole, atol=1e-5, rtol=0)
    assert whole.shape == (64, 2) and whole.dtype == np.float32 and (whole < 0).all()
    # The chosen answers are likelier than the rejected ones after SFT on the chosen.
    assert (whole[:, 0] > whole[:, 1]).mean() > 0.5
    assert torch.is_grad_enabled()  # computed without a graph, and the mode restored


def test_the_reference_runs_as_many_pairs_a_pass_as_the_logits_budget_holds(monkeypatch):
    from ito_assets.posttraining import reference_pass

    one_pair = 2 * 100 * 1000 * 4  # two answers of 100 positions, 1,000 float32 logits each
    monkeypatch.setattr(reference_pass, "LOGITS_BUDGET_BYTES", 3 * one_pair)
    assert reference_pass.reference_chunk(100, 1000) == 3  # exactly three pairs' logits
    monkeypatch.setattr(reference_pass, "LOGITS_BUDGET_BYTES", 3 * one_pair - 1)
    assert reference_pass.reference_chunk(100, 1000) == 2  # a byte short of the third
    monkeypatch.setattr(reference_pass, "LOGITS_BUDGET_BYTES", one_pair - 1)
    assert reference_pass.reference_chunk(100, 1000) == 1  # never none: one pair a pass, whatever its size
    monkeypatch.undo()
    assert reference_pass.reference_chunk(2048, 128_256) == 1  # a real model
    assert reference_pass.reference_chunk(40, 2048) == 409  # the fixture's


@pytest.mark.slow
def test_a_start_whose_reference_is_not_finite_fails_the_stage_with_its_code_and_no_restart(tmp_path):
    """The worker computes the reference from the start and refuses it (POSTTRAINING_DATA_INVALID):
    the supervisor ends the stage with that code after the one attempt, though its budget allows a
    restart, which would compute the same values."""
    policy = copy.deepcopy(START)
    with torch.no_grad():
        next(policy.parameters()).fill_(float("nan"))
    # The launch raises on the supervisor's exit 1, as Dagster Pipes does: the report's code is the error's.
    raising = WorkerLaunch(run=lambda command: subprocess.run(command, check=True), run_key="dpo-test",
                           supervisor=SUPERVISOR, interval_steps=3)
    with pytest.raises(ItoError, match="after 1 attempt$") as failed:
        dpo_on_worker(policy, SPEC, CODEC, PAIRS, CONFIG, stage_dir=tmp_path, launch=raising)
    assert failed.value.code is ErrorCode.POSTTRAINING_DATA_INVALID
    log = (tmp_path / "attempt-0.log").read_text()
    assert "POSTTRAINING_DATA_INVALID: the reference log-probabilities must be finite and at most 0; 64 of 64 pairs are not" in log
    assert "Traceback" not in log and not (tmp_path / "attempt-1.log").exists()
