"""Generation in a separate process: stamped versions, behaviour log-probabilities that match the
trainer's, weights that flow from trainer to generator, and failures that surface."""

from __future__ import annotations

import functools
import os
import queue
import threading
import time

import pytest
import torch

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.generation import GenerationConfig, GeneratorProcess, _Failure, _generator_main, make_group
from ito_assets.posttraining.policy import token_logprobs
from ito_assets.posttraining.rollouts import collate
from ito_assets.posttraining.tasks import largest_digit_tasks
from ito_assets.posttraining.vocab import CharVocab
from ito_assets.training.model import build_model, config_by_name

VOCAB = CharVocab()
CONFIG = GenerationConfig(group_size=4, max_new_tokens=6, overlong_cache=3, seed=1, queue_size=2)


def _factory(seed: int = 0):
    return functools.partial(build_model, config_by_name("micro", vocab_size=VOCAB.vocab_size), seed=seed)


def broken_factory():
    raise RuntimeError("no such model")


def _assert_behaviour_matches(policy, group):
    batch = collate([group], pad_id=VOCAB.pad_id)
    with torch.no_grad():
        recomputed = token_logprobs(policy.eval(), batch.tokens)  # (G, T-1)
    on_completion = batch.behaviour_logprobs != 0
    assert torch.allclose(recomputed[on_completion], batch.behaviour_logprobs[on_completion], atol=1e-4)


def test_group_is_stamped_and_behaviour_logprobs_match_the_trainer():
    policy = _factory()()
    task = largest_digit_tasks()[123]
    group = make_group(policy, VOCAB, task, version=7, config=CONFIG, generator=torch.Generator().manual_seed(0))
    assert group.policy_version == 7 and len(group.rollouts) == 4
    for rollout in group.rollouts:
        assert len(rollout.behaviour_logprobs) == len(rollout.completion_ids) <= 6
        assert rollout.truncated == (VOCAB.eos_id not in rollout.completion_ids)
        if rollout.truncated:  # an untrained policy rambles: full overlong punishment
            assert rollout.reward == rollout.score - 1.0
    _assert_behaviour_matches(policy, group)


def test_weights_flow_to_the_generator_process():
    first, second = _factory(0)(), _factory(1)()
    tasks = largest_digit_tasks()[:50]
    with GeneratorProcess(policy_factory=_factory(0), codec=VOCAB, tasks=tasks, config=CONFIG) as generator:
        generator.start(first.state_dict(), 0)
        assert generator.pid not in (None, os.getpid())
        assert generator.next_group().policy_version == 0
        generator.publish(second.state_dict(), 1)
        # The weights cross through a queue whose feeder thread writes them after publish returns:
        # on a loaded machine the generator can start more than queue_size + 1 groups on the old
        # weights before they arrive (the trainer's staleness filter bounds what it uses). They
        # arrive, and once loaded every group carries them.
        versions = [generator.next_group()]
        deadline = time.monotonic() + 60
        while versions[-1].policy_version != 1 and time.monotonic() < deadline:
            versions.append(generator.next_group())
    assert versions[-1].policy_version == 1
    assert [g.policy_version for g in versions] == sorted(g.policy_version for g in versions)
    _assert_behaviour_matches(second, versions[-1])


def test_a_failing_generator_raises_generation_failed():
    with GeneratorProcess(policy_factory=broken_factory, codec=VOCAB, tasks=largest_digit_tasks()[:2],
                          config=CONFIG, timeout_seconds=60) as generator:
        generator.start(_factory()().state_dict(), 0)
        with pytest.raises(ItoError) as caught:
            generator.next_group()
    assert caught.value.code is ErrorCode.GENERATION_FAILED
    assert "no such model" in caught.value.message


def _run_generator_main(policy_factory, weights, groups, *, parent: int) -> bool:
    """Run the generator's body in a thread of this process; True when it returned within 10 s."""
    context, threads = torch.multiprocessing.get_context("spawn"), torch.get_num_threads()
    tasks = largest_digit_tasks()[:2]
    body = threading.Thread(target=_generator_main, daemon=True, args=(
        policy_factory, VOCAB, tasks, CONFIG, weights, groups, context.Event(), parent))
    body.start()
    body.join(timeout=10)
    torch.set_num_threads(threads)  # the body sets one thread for itself, here for this process
    return not body.is_alive()


def test_a_generator_whose_trainer_died_before_its_first_weights_leaves():
    context = torch.multiprocessing.get_context("spawn")
    assert _run_generator_main(_factory(), context.Queue(), context.Queue(maxsize=1), parent=-1)


def test_a_failure_is_not_offered_forever_to_a_full_queue_whose_trainer_died():
    context = torch.multiprocessing.get_context("spawn")
    groups = context.Queue(maxsize=1)
    groups.put("a group the dead trainer never took")
    assert _run_generator_main(broken_factory, context.Queue(), groups, parent=-1)


def test_a_failure_reaches_a_living_trainer():
    context = torch.multiprocessing.get_context("spawn")
    groups = context.Queue(maxsize=1)
    assert _run_generator_main(broken_factory, context.Queue(), groups, parent=os.getppid())
    failure = groups.get(timeout=10)
    assert isinstance(failure, _Failure) and "no such model" in failure.message
    with pytest.raises(queue.Empty):
        groups.get(timeout=0.2)


def test_rlvr_mini_batches_and_sync_every_n_versions():
    import copy

    from ito_assets.posttraining.fixtures import instruction_pairs
    from ito_assets.posttraining.rlvr import RlvrConfig, run_rlvr
    from ito_assets.posttraining.sft import SftConfig, run_sft

    policy = _factory()()
    # A few SFT steps so that sampled answers are digits, some right: groups with mixed rewards.
    run_sft(policy, VOCAB, instruction_pairs(largest_digit_tasks()[:64], copies=4, seed=0, error_rate=0.0),
            SftConfig(learning_rate=3e-3, batch_size=16))
    config = RlvrConfig(num_steps=2, groups_per_step=2, group_size=4, max_new_tokens=6, overlong_cache=3,
                        learning_rate=1e-3, updates_per_step=2, sync_every=2, max_staleness=2)
    result = run_rlvr(policy, copy.deepcopy(policy), VOCAB, largest_digit_tasks()[:50], config,
                      policy_factory=_factory())
    assert [s.policy_version for s in result.steps] == [2, 4]  # two optimizer steps per batch
    assert result.num_weight_syncs == 1 + 4 // 2  # the initial weights, then every second version
    assert result.num_steps_without_signal == 0
    assert max(result.staleness.admitted) <= 2
