"""RLVR (GRPO with DAPO's fixes) on the stage worker: the worker's objective takes the in-process
trainer's loss and gradient on the same groups; the worker trains from the policy it is given with
its generator process beside it, within the staleness bound at every step; a rerun resumes; and a
worker killed mid-stage is restarted from its checkpoint with a new generator that starts at the
resumed version, so the bound holds across the restart, and the killed generator does not linger."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from ito_assets.posttraining.base import seeded
from ito_assets.posttraining.decoding import encode_prompt
from ito_assets.posttraining.fixtures import instruction_pairs
from ito_assets.posttraining.generation import GenerationConfig, make_group
from ito_assets.posttraining.losses import dapo_policy_loss, group_advantages, truncated_importance_weights
from ito_assets.posttraining.on_worker import TASKS_NAME, WorkerLaunch, rlvr_on_worker
from ito_assets.posttraining.pipeline import battery
from ito_assets.posttraining.policy import token_logprobs
from ito_assets.posttraining.rlvr import RlvrConfig
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining import rollout_source
from ito_assets.posttraining.rollout_source import RolloutSource, generator_seed, read_tasks
from ito_assets.posttraining.rollouts import Group, Rollout
from ito_assets.posttraining.rollouts import collate
from ito_assets.posttraining.sft import SftConfig, run_sft
from ito_assets.posttraining.vocab import CharVocab
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.stage.config import PreferenceObjective, ReinforcementObjective
from ito_assets.runtime.supervision.supervisor import SupervisorConfig
from ito_assets.runtime.worker import execution
from ito_assets.runtime.worker.batches import IGNORE
from ito_assets.runtime.worker.reinforcement import Reinforcement
from ito_assets.runtime.worker.step import train_step
from ito_assets.training.layout import Layout
from ito_assets.training.trainer import TrainConfig, build_optimizer
from helpers import process_started_at
from posttraining.test_worker_sft import (_kill_once_past_the_first_checkpoint, _max_difference, _steps,
                                          assert_restarted_once)
from runtime.runtime_helpers import TRIALS, worker_config

CODEC = CharVocab()
SPEC = seeded()
TRAIN, _ = battery()
PROMPT_LENGTH = max(len(encode_prompt(CODEC, task.prompt)) for task in TRAIN)
SUPERVISOR = SupervisorConfig(startup_timeout_s=90.0, poll_interval_s=0.2, grace_s=3.0, max_restarts=1)
CONFIG = RlvrConfig(num_steps=6, groups_per_step=4, group_size=4, max_new_tokens=8, overlong_cache=4,
                    learning_rate=1e-3, max_staleness=1)


def _sft_policy():
    """A start whose groups have mixed rewards: SFT on noisy answers for a few epochs."""
    policy = SPEC.factory()()
    run_sft(policy, CODEC, instruction_pairs(TRAIN[:64], copies=2, seed=0, error_rate=0.3),
            SftConfig(num_epochs=6, learning_rate=3e-3, batch_size=16))
    return policy


START = _sft_policy()
OBJECTIVE = ReinforcementObjective(group_size=4, groups_per_step=4, max_new_tokens=8, overlong_cache=4,
                                   clip_eps_low=0.2, clip_eps_high=0.28, max_staleness=1, importance_weight_cap=2.0,
                                   max_draws_per_group=10)


def _groups(policy, count: int = 4):
    """Groups sampled by an older policy (the seed's weights): the importance weights are not 1."""
    config = GenerationConfig(group_size=4, max_new_tokens=8, overlong_cache=4, seed=0)
    generator = torch.Generator().manual_seed(0)
    return [make_group(policy, CODEC, task, version=0, config=config, generator=generator) for task in TRAIN[:count]]


def test_the_objective_takes_the_in_process_trainers_loss_and_gradient_however_groups_are_split():
    """A micro-batch per group, weighed by its tokens, against `rlvr._update`'s one pass."""
    old = SPEC.factory()()
    batch = collate(_groups(old), pad_id=CODEC.pad_id)
    advantages = group_advantages(batch.rewards.view(4, 4)).flatten()
    expected_model = copy.deepcopy(START)
    with torch.no_grad():
        proximal = token_logprobs(expected_model, batch.tokens)
    weights = truncated_importance_weights(proximal, batch.behaviour_logprobs, cap=2.0)
    expected = dapo_policy_loss(token_logprobs(expected_model, batch.tokens), proximal, advantages, batch.loss_mask,
                                importance_weights=weights, clip_eps_low=0.2, clip_eps_high=0.28)
    expected.loss.backward()
    model = copy.deepcopy(START)
    objective = Reinforcement(model, OBJECTIVE)
    run = execution.prepare(model, Layout(precision="fp32", compile=False, micro_batch_size=4), (),
                            device=torch.device("cpu"), world_size=1, objective=objective)
    targets = torch.where(batch.loss_mask > 0, batch.tokens[:, 1:], IGNORE)
    beside = torch.stack([advantages.unsqueeze(1).expand_as(proximal), batch.behaviour_logprobs, proximal], dim=1)
    grads = {}
    config = TrainConfig(num_steps=1, batch_size=16, sequence_length=batch.tokens.shape[1] - 1, learning_rate=1e-3)
    loss, _, _, _ = train_step(run, model, build_optimizer(model, config), batch.tokens[:, :-1], targets, 1, config,
                               before_update=lambda: grads.update({n: p.grad.clone() for n, p in model.named_parameters()}),
                               count_targets=True, beside=beside)
    assert loss == pytest.approx(float(expected.loss.detach()), abs=1e-6)
    for name, parameter in expected_model.named_parameters():
        torch.testing.assert_close(grads[name], parameter.grad, atol=1e-6, rtol=1e-4, msg=name)
    assert objective.take_metrics(torch.device("cpu"))["clip_fraction"] == pytest.approx(expected.clip_fraction)
    assert 0 < weights[batch.loss_mask > 0].min() < 1  # another policy's samples: weights below 1 seen


def _launch(**changes) -> WorkerLaunch:
    settings = dict(supervisor=SUPERVISOR, interval_steps=2) | changes
    return WorkerLaunch(run=lambda command: subprocess.run(command, check=False), run_key="rlvr-test", **settings)


def _lags(stage_dir: Path) -> dict[str, set[int]]:
    """Every staleness the final steps saw, admitted and dropped."""
    final = {e.step: e for e in events.read(stage_dir) if e.kind is EventKind.STEP}
    found = {"admitted": set(), "dropped": set()}
    for event in final.values():
        for key in event.metrics:
            kind, _, lag = key.partition("_staleness_")
            if kind in found:
                found[kind].add(int(lag))
    return found


@pytest.mark.slow
def test_the_worker_trains_rlvr_from_the_policy_it_is_given_within_the_staleness_bound(tmp_path):
    policy = copy.deepcopy(START)
    result = rlvr_on_worker(policy, SPEC, TRAIN, CONFIG, stage_dir=tmp_path, launch=_launch(),
                            prompt_length=PROMPT_LENGTH)
    assert [s.step for s in result.steps] == [1, 2, 3, 4, 5, 6] and result.num_steps_without_signal == 0
    assert all(s.num_groups_used == 4 and 0 <= s.mean_score <= 1 and s.kl_to_reference >= 0 for s in result.steps)
    assert result.staleness.num_admitted >= 6 * 4 and set(result.staleness.admitted) <= {0, 1}
    assert all(lag > 1 for lag in result.staleness.dropped)
    assert result.num_weight_syncs == 1 + 6  # the start, then after every step
    assert result.num_groups_drawn == result.staleness.num_admitted + result.staleness.num_dropped  # no restart
    assert _max_difference(policy, START) > 0  # it trained
    assert read_tasks(tmp_path / TASKS_NAME) == TRAIN
    stage = json.loads((tmp_path / "stage.json").read_text())
    assert stage["reinforcement"]["group_size"] == 4 and stage["layout"]["micro_batch_size"] == 4
    assert stage["spikes"]["judge_loss"] is False  # a surrogate's loss: only a non-finite one is flagged
    # The same stage again: the worker resumes at its final checkpoint and trains nothing more.
    again = copy.deepcopy(START)
    rerun = rlvr_on_worker(again, SPEC, TRAIN, CONFIG, stage_dir=tmp_path, launch=_launch(),
                           prompt_length=PROMPT_LENGTH)
    assert _max_difference(again, policy) == 0.0 and [s.loss for s in rerun.steps] == [s.loss for s in result.steps]
    assert _steps(tmp_path) == [(0, s) for s in range(1, 7)]


def _generators(stage_dir: Path) -> list[tuple[int, int, float]]:
    """(pid, version, when logged) of each attempt's generator, from the worker's log lines."""
    found = []
    for line in (stage_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        message = record.get("message", "")
        if "generator process" in message:
            words = message.split()
            found.append((int(words[words.index("process") + 1]), int(words[-1]), record["at"]))
    return found


def _alive(pid: int, logged_at: float) -> bool:
    """The generator logged at `logged_at` still runs: a process under its pid that started after
    the line (2 s for the boot time's whole seconds) is another, the pid handed on."""
    started = process_started_at(pid)
    return started is not None and started <= logged_at + 2.0


@pytest.mark.slow
@pytest.mark.parametrize("trial", TRIALS)  # a fault of the matrix: once here, five times in `make test-long`
def test_a_rlvr_worker_killed_mid_stage_restarts_with_a_generator_at_the_resumed_version(tmp_path, trial):
    config = RlvrConfig(num_steps=12, groups_per_step=4, group_size=4, max_new_tokens=8, overlong_cache=4,
                        learning_rate=1e-3, max_staleness=1)
    killed: list[int] = []
    launch = WorkerLaunch(run=_kill_once_past_the_first_checkpoint(tmp_path, killed), run_key="rlvr-test",
                          supervisor=SUPERVISOR, interval_steps=2)
    result = rlvr_on_worker(copy.deepcopy(START), SPEC, TRAIN, config, stage_dir=tmp_path, launch=launch,
                            prompt_length=PROMPT_LENGTH)
    resumed = assert_restarted_once(tmp_path, killed, num_steps=config.num_steps, first_checkpoint=2)
    # The groups drawn: every attempt's finished steps, a redone step's too (the final ones alone
    # are the staleness report's).
    recorded = [e for e in events.read(tmp_path) if e.kind is EventKind.STEP]
    redone = len(recorded) - config.num_steps
    assert result.num_groups_drawn == sum(v for e in recorded for k, v in e.metrics.items() if "_staleness_" in k)
    final = result.staleness.num_admitted + result.staleness.num_dropped
    assert (result.num_groups_drawn > final) is (redone > 0)
    # Each attempt's generator started at the version its trainer resumed at, with its own seed.
    (first, start_0, first_at), (second, start_1, second_at) = _generators(tmp_path)
    assert (start_0, start_1) == (0, resumed) and generator_seed(0, start_0) != generator_seed(0, start_1)
    lags = _lags(tmp_path)
    assert lags["admitted"] <= {0, 1} and all(lag > 1 for lag in lags["dropped"])
    # The killed trainer's generator left with it; the second one was closed at the end. It checks
    # its parent between draws and while it waits on a queue; 30 s leaves a loaded machine room.
    deadline = time.monotonic() + 30
    while (_alive(first, first_at) or _alive(second, second_at)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(first, first_at) and not _alive(second, second_at)
    assert os.getpid() not in (first, second)


def _objective(**changes) -> ReinforcementObjective:
    settings = dict(group_size=4, groups_per_step=4, max_new_tokens=8, overlong_cache=4, clip_eps_low=0.2,
                    clip_eps_high=0.28, max_staleness=1, importance_weight_cap=2.0, max_draws_per_group=10) | changes
    return ReinforcementObjective(**settings)


@pytest.mark.parametrize("changes, message", [
    ({"group_size": 1}, "group_size"), ({"groups_per_step": 0}, "groups_per_step"), ({"sync_every": 0}, "sync_every"),
    ({"max_staleness": -1}, "max_staleness"), ({"max_draws_per_group": 0}, "max_draws_per_group"),
    ({"overlong_cache": 0}, "overlong_cache"),
    ({"overlong_cache": 9}, "overlong_cache"), ({"clip_eps_low": 1.0}, "clip_eps_low"),
    ({"clip_eps_high": -1e-9}, "clip_eps_high"), ({"importance_weight_cap": 0.999}, "importance_weight_cap"),
    ({"tokenizer_path": "tokenizer.json", "tokenizer_sha256": "sha256:0"}, "absolute"),
    ({"tokenizer_path": "/tmp/tokenizer.json"}, "together")])
def test_the_reinforcement_settings_are_checked_at_their_bounds(changes, message):
    with pytest.raises(ValueError, match=message):
        _objective(**changes)
    accepted = _objective(group_size=2, max_staleness=0, overlong_cache=8, clip_eps_low=0.0, clip_eps_high=0.0,
                          importance_weight_cap=1.0, max_draws_per_group=1)  # each at its bound
    assert accepted.overlong_cache == accepted.max_new_tokens


def test_reinforcement_trains_on_one_rank_with_no_second_objective(tmp_path):
    tokens = (tmp_path / "tasks.jsonl", None)
    one = worker_config(tmp_path, tokens, reinforcement=_objective(), layout=Layout(precision="fp32", compile=False,
                                                                                     micro_batch_size=4))
    assert one.reinforcement.group_size == 4
    for changes in ({"layout": Layout(dp_replicate=2, precision="fp32", compile=False, micro_batch_size=4)},
                    {"replica_groups": 2}):
        with pytest.raises(ValueError, match="one rank"):
            worker_config(tmp_path, tokens, reinforcement=_objective(), **({"layout": one.layout} | changes))
    with pytest.raises(ValueError, match="one objective"):
        worker_config(tmp_path, tokens, reinforcement=_objective(), layout=one.layout,
                      preference=PreferenceObjective(reference_path="/tmp/r.npy", beta=0.1))


class _EqualGroups:
    """A generator whose every group has equal rewards (nothing to learn), counting its draws."""

    mixed_first = 0  # groups with signal before the equal ones

    def __init__(self, **_):
        self.drawn = 0

    def start(self, state_dict, version):
        return self

    def next_group(self) -> Group:
        self.drawn += 1
        rewards = (1.0, 0.0, 1.0, 0.0) if self.drawn <= self.mixed_first else (1.0,) * 4
        return Group(task_id="t", policy_version=0, rollouts=tuple(
            Rollout(prompt_ids=(1,), completion_ids=(2,), behaviour_logprobs=(-0.1,), truncated=False, score=r, reward=r)
            for r in rewards))

    def publish(self, state_dict, version):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("max_draws, version", [(1, 0), (2, 0), (2, 3)])
def test_a_batch_without_signal_draws_again_only_within_the_priced_draws(monkeypatch, max_draws, version):
    """A step with nothing to learn from draws again from what is left of the priced draws (its
    share and what earlier steps left), then fails the stage: never a group past the price."""
    monkeypatch.setattr(rollout_source, "GeneratorProcess", _EqualGroups)
    source = RolloutSource(_objective(max_draws_per_group=max_draws), model=copy.deepcopy(START),
                           reference=copy.deepcopy(START), tasks=list(TRAIN[:4]), seed=0, version=version)
    with pytest.raises(ItoError) as caught:
        source.next_batch()
    assert caught.value.code is ErrorCode.GENERATION_DRAWS_SPENT
    assert source.generator.drawn == source.budget.drawn == 4 * max_draws  # a step's share: 4 groups x max_draws
    assert f"{4 * max_draws} groups drawn for steps {version + 1} to {version + 1}" in caught.value.message
    source.position += 1  # had the step trained: the next step's share is its own
    with pytest.raises(ItoError):
        source.next_batch()
    assert source.generator.drawn == 8 * max_draws


def test_a_step_without_signal_draws_what_the_steps_before_it_left(monkeypatch):
    monkeypatch.setattr(rollout_source, "GeneratorProcess", type("_Mixed", (_EqualGroups,), {"mixed_first": 4}))
    source = RolloutSource(_objective(max_draws_per_group=2), model=copy.deepcopy(START),
                           reference=copy.deepcopy(START), tasks=list(TRAIN[:4]), seed=0, version=0)
    source.next_batch()  # step 1: its 4 groups at once, 4 of its 8 draws left
    assert source.generator.drawn == 4
    source.trained(1)
    with pytest.raises(ItoError, match="16 groups drawn for steps 1 to 2"):
        source.next_batch()  # step 2: its own 8, then step 1's 4
    assert source.generator.drawn == 16 == 2 * 4 * 2
    source.close()

