"""Generation in a separate process from training, joined by two queues.

    trainer --(version, state_dict)--> weights queue --> generator
    trainer <------- Group (stamped) -- groups queue <-- generator

The generator (a `spawn`ed process, so it shares nothing with the trainer but what the queues
carry) loads the newest weights it has been sent before each group, samples G completions of a
task, scores them, and stamps the group with the policy version that produced it and each token's
behaviour log-probability. The groups queue is bounded: the generator runs at most `queue_size`
groups ahead, and the trainer's staleness filter (staleness.py) decides what it may use.
Tensors cross the weights queue through shared memory (torch.multiprocessing).
"""

from __future__ import annotations

import os
import queue
import random
import traceback
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.multiprocessing as mp

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.decoding import encode_prompt, sample
from ito_assets.posttraining.losses import overlong_penalty
from ito_assets.posttraining.policy import CausalLM
from ito_assets.posttraining.rewards import score
from ito_assets.posttraining.rollouts import Group, Rollout
from ito_assets.posttraining.tasks import Task
from ito_assets.posttraining.vocab import TextCodec

_POLL_SECONDS = 0.2
# 30 s to finish the group in hand: a group of code tasks runs G programs of <= 5 s each.
_CLOSE_SECONDS = 30.0


@dataclass(frozen=True, kw_only=True)
class GenerationConfig:
    group_size: int
    max_new_tokens: int  # L_max: the hard length limit of a completion
    overlong_cache: int  # L_cache: the soft-punishment window before L_max (DAPO eq. 13)
    # Temperature 1.0: DAPO's rollout temperature (Yu et al. 2025, section 4.1).
    temperature: float = 1.0
    seed: int = 0
    # Groups the generator may run ahead of the trainer (RLVR sets one step's worth): enough to keep
    # both processes busy; measured with max_staleness 1, ~1-3% of groups are then dropped as stale.
    queue_size: int = 4

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2")
        if not 0 < self.overlong_cache <= self.max_new_tokens:
            raise ValueError("overlong_cache must be in (0, max_new_tokens]")
        if self.temperature <= 0 or self.queue_size < 1:
            raise ValueError("temperature must be positive and queue_size >= 1")


def make_group(
    policy: CausalLM, codec: TextCodec, task: Task, *, version: int, config: GenerationConfig,
    generator: torch.Generator | None = None,
) -> Group:
    """G scored completions of `task`, stamped with `version`."""
    prompt_ids = encode_prompt(codec, task.prompt)
    completions = sample(
        policy, prompt_ids, num_samples=config.group_size, max_new_tokens=config.max_new_tokens,
        eos_id=codec.eos_id, temperature=config.temperature, generator=generator,
    )
    lengths = torch.tensor([len(c.ids) for c in completions])
    penalties = overlong_penalty(lengths, max_length=config.max_new_tokens, cache_length=config.overlong_cache)
    rollouts = []
    for completion, penalty in zip(completions, penalties.tolist()):
        value = score(task, completion.text(codec))
        rollouts.append(Rollout(
            prompt_ids=tuple(prompt_ids), completion_ids=completion.ids, behaviour_logprobs=completion.logprobs,
            truncated=completion.truncated, score=value, reward=value + penalty,
        ))
    return Group(task_id=task.task_id, policy_version=version, rollouts=tuple(rollouts))


@dataclass(frozen=True, kw_only=True)
class _Failure:
    message: str


def _newest_weights(
    policy: CausalLM, weights: mp.Queue, version: int, *, running: Callable[[], bool] | None = None,
) -> int:
    """Load the newest (version, state_dict) waiting on the queue; returns the version. With
    `running`, wait for a first one while it holds (a trainer killed before its first weights
    reached the queue must not leave the generator waiting forever)."""
    newest = None
    while newest is None and running is not None and running():
        try:
            newest = weights.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            continue
    while True:
        try:
            newest = weights.get_nowait()
        except queue.Empty:
            break
    if newest is None:
        return version
    policy.load_state_dict(newest[1])
    return newest[0]


def _offer(groups: mp.Queue, item, running: Callable[[], bool]) -> None:
    """Put `item` on the bounded groups queue, giving up once `running` fails: a full queue whose
    trainer is gone is never read again."""
    while running():
        try:
            groups.put(item, timeout=_POLL_SECONDS)
            return
        except queue.Full:
            continue


def _generator_main(policy_factory, codec, tasks, config, weights, groups, stop, parent: int) -> None:
    torch.set_num_threads(1)  # one core for generation, the rest for the trainer
    # A trainer killed outright (SIGKILL, OOM) never sets `stop`: the generator leaves when its
    # parent is gone (re-parented), rather than sampling for nobody until the machine is reclaimed.
    running = lambda: not stop.is_set() and os.getppid() == parent
    try:
        policy = policy_factory().eval()
        version = _newest_weights(policy, weights, -1, running=running)
        rng, generator = random.Random(config.seed), torch.Generator().manual_seed(config.seed)
        while running():
            version = _newest_weights(policy, weights, version)
            task = tasks[rng.randrange(len(tasks))]
            group = make_group(policy, codec, task, version=version, config=config, generator=generator)
            _offer(groups, group, running)
    except Exception:  # noqa: BLE001 - reported to the trainer, which raises GENERATION_FAILED
        # The queue's feeder thread flushes this before the process exits (no cancel_join_thread).
        # A dead trainer's weights can fail to arrive (their shared memory went with it): then the
        # queue may be full and unread, so the report is offered only while the trainer lives.
        _offer(groups, _Failure(message=traceback.format_exc(limit=5)), running)


class GeneratorProcess:
    """The trainer's handle on the generator process: start, publish weights, take groups, close."""

    def __init__(
        self, *, policy_factory: Callable[[], CausalLM], codec: TextCodec, tasks: Sequence[Task],
        config: GenerationConfig, timeout_seconds: float = 300.0,
    ):
        if not tasks:
            raise ValueError("tasks must not be empty")
        context = mp.get_context("spawn")
        self._weights, self._groups = context.Queue(), context.Queue(maxsize=config.queue_size)
        self._stop = context.Event()
        self._timeout = timeout_seconds
        self._process = context.Process(
            target=_generator_main, name="ito-posttraining-generator", daemon=True,
            args=(policy_factory, codec, list(tasks), config, self._weights, self._groups, self._stop, os.getpid()),
        )
        self.num_weight_syncs = 0

    def start(self, state_dict: dict, version: int) -> "GeneratorProcess":
        self.publish(state_dict, version)
        self._process.start()
        return self

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def publish(self, state_dict: dict, version: int) -> None:
        """Send a copy of the weights (the trainer keeps updating its own in place)."""
        self._weights.put((version, {k: v.detach().clone() for k, v in state_dict.items()}))
        self.num_weight_syncs += 1

    def next_group(self) -> Group:
        waited = 0.0
        while waited < self._timeout:
            alive = self._process.is_alive()  # read before the queue: a last item is not missed
            try:
                item = self._groups.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                waited += _POLL_SECONDS
                if not alive:
                    raise ItoError(ErrorCode.GENERATION_FAILED, "the generator process exited") from None
                continue
            if isinstance(item, _Failure):
                raise ItoError(ErrorCode.GENERATION_FAILED, "the generator process failed:\n" + item.message)
            return item
        raise ItoError(ErrorCode.GENERATION_FAILED, "the generator produced no sample within the timeout")

    def close(self) -> None:
        """Stop the generator: it finishes the group in hand (bounded by the reward timeout);
        past `_CLOSE_SECONDS` it is terminated. Queued groups are discarded."""
        if self._process.pid is None:
            return
        self._stop.set()
        self._weights.cancel_join_thread()
        waited = 0.0
        while self._process.is_alive() and waited < _CLOSE_SECONDS:
            self._drain()
            self._process.join(timeout=_POLL_SECONDS)
            waited += _POLL_SECONDS
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()
        self._drain()

    def _drain(self) -> None:
        try:
            while True:
                self._groups.get_nowait()
        except queue.Empty:
            pass

    def __enter__(self) -> "GeneratorProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
