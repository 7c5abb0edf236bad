"""RLVR: GRPO with the DAPO fixes, the generator in its own process, bounded staleness.

One step: draw groups from the generator until the batch holds `groups_per_step` fresh,
informative groups or the step's share of the priced draws is spent (sampling.py, staleness.py);
compute group-normalised advantages; take the proximal log-probabilities (the policy before this
batch's updates) and the truncated importance weights against the behaviour log-probabilities the
generator stamped; then `updates_per_step` optimizer steps on the DAPO loss, each one a new
policy version, sent to the generator every `sync_every` versions.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ito_assets.manifest.schema import RlvrStep
from ito_assets.posttraining.evaluation import kl_to_reference
from ito_assets.posttraining.generation import GenerationConfig, GeneratorProcess
from ito_assets.posttraining.losses import (
    IMPORTANCE_WEIGHT_CAP, dapo_policy_loss, group_advantages, truncated_importance_weights,
)
from ito_assets.posttraining.optim import adamw, optimizer_step
from ito_assets.posttraining.policy import CausalLM, token_logprobs
from ito_assets.posttraining.rollouts import Group, RolloutBatch, collate
from ito_assets.posttraining.sampling import DrawBudget, FilledBatch
from ito_assets.posttraining.staleness import StalenessFilter, StalenessReport, step_queue_size
from ito_assets.posttraining.tasks import Task
from ito_assets.posttraining.vocab import TextCodec

_RLVR = RlvrStep.model_fields


@dataclass(frozen=True, kw_only=True)
class RlvrConfig:
    num_steps: int
    groups_per_step: int
    max_new_tokens: int  # L_max
    overlong_cache: int  # L_cache; DAPO uses L_max 20,480 with L_cache 4,096 (a fifth)
    group_size: int = _RLVR["group_size"].default
    clip_eps_low: float = _RLVR["clip_eps_low"].default
    clip_eps_high: float = _RLVR["clip_eps_high"].default
    max_staleness: int = _RLVR["max_staleness"].default
    max_draws_per_group: int = _RLVR["max_draws_per_group"].default  # the plan prices these draws
    learning_rate: float = _RLVR["learning_rate"].default
    importance_weight_cap: float = IMPORTANCE_WEIGHT_CAP
    # Mini-batches (optimizer steps, policy versions) per batch. 1: each batch is used once, so the
    # clip acts only through stale samples; DAPO takes 16 per rollout batch (section 4.1).
    updates_per_step: int = 1
    # Versions between weight transfers to the generator. 1: after every optimizer step, the
    # freshest policy the issue asks for; larger values trade staleness for transfer cost.
    sync_every: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_steps", "groups_per_step", "updates_per_step", "sync_every", "max_draws_per_group"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.groups_per_step % self.updates_per_step:
            raise ValueError("groups_per_step must be a multiple of updates_per_step")
        if self.max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")

    @classmethod
    def from_step(cls, step: RlvrStep, **runtime) -> "RlvrConfig":
        return cls(
            group_size=step.group_size, clip_eps_low=step.clip_eps_low, clip_eps_high=step.clip_eps_high,
            max_staleness=step.max_staleness, learning_rate=step.learning_rate, num_steps=step.num_steps,
            groups_per_step=step.groups_per_step, max_new_tokens=step.max_new_tokens,
            overlong_cache=step.overlong_cache, max_draws_per_group=step.max_draws_per_group, **runtime,
        )

    def generation(self) -> GenerationConfig:
        return GenerationConfig(
            group_size=self.group_size, max_new_tokens=self.max_new_tokens, overlong_cache=self.overlong_cache,
            seed=self.seed, queue_size=step_queue_size(self.groups_per_step),
        )


@dataclass(frozen=True, kw_only=True)
class RlvrStepStats:
    step: int
    policy_version: int  # after this step's updates
    mean_score: float  # verifiable reward of every group drawn this step (the reward curve)
    loss: float
    kl_to_reference: float
    clip_fraction: float
    num_groups_used: int
    num_dropped_all_equal: int
    num_dropped_stale: int


@dataclass(frozen=True, kw_only=True)
class RlvrResult:
    steps: tuple[RlvrStepStats, ...]
    staleness: StalenessReport
    num_weight_syncs: int
    num_steps_without_signal: int  # steps whose draw bound ran out before any useful group
    # Every group drawn, redrawn ones included, by every attempt (what the generation cost; on the
    # worker, but the groups of an attempt's step that did not finish)
    num_groups_drawn: int
    wall_seconds: float

    @property
    def reward_curve(self) -> tuple[float, ...]:
        return tuple(s.mean_score for s in self.steps)


def _advantages(batch: RolloutBatch, num_groups: int, group_size: int) -> torch.Tensor:
    """Rows are group-major (collate), so rewards reshape to (groups, G) -> advantages (N,)."""
    return group_advantages(batch.rewards.view(num_groups, group_size)).flatten()


def _update(policy, optimizer, batch: RolloutBatch, advantages, proximal, weights, rows, config) -> tuple[float, float]:
    """One optimizer step on the rows `rows` of the batch; returns (loss, clip fraction)."""
    logprobs = token_logprobs(policy, batch.tokens[rows])  # (n, L)
    result = dapo_policy_loss(
        logprobs, proximal[rows], advantages[rows], batch.loss_mask[rows], importance_weights=weights[rows],
        clip_eps_low=config.clip_eps_low, clip_eps_high=config.clip_eps_high,
    )
    optimizer_step(policy, optimizer, result.loss)
    return float(result.loss.detach()), result.clip_fraction


class _Trainer:
    """The RLVR step function and the state it carries (version, optimizer, staleness counters)."""

    def __init__(self, policy: CausalLM, reference: CausalLM, config: RlvrConfig, pad_id: int):
        self.policy, self.reference, self.config, self.pad_id = policy, reference, config, pad_id
        self.optimizer = adamw(policy, learning_rate=config.learning_rate)
        self.staleness = StalenessFilter(max_staleness=config.max_staleness)
        self.version = 0

    def admit(self, group: Group) -> bool:
        return self.staleness.admit(group.policy_version, self.version)

    def step(self, index: int, filled: FilledBatch, groups: Sequence[Group], drawn_scores: list[float],
             publish: Callable[[dict, int], None]) -> RlvrStepStats:
        """`updates_per_step` optimizer steps on `groups`; each new version is published every
        `sync_every` versions."""
        config = self.config
        # Internal invariant (the filter admitted them against this very version): never stale.
        assert all(self.version - g.policy_version <= config.max_staleness for g in groups)
        batch = collate(list(groups), pad_id=self.pad_id)
        advantages = _advantages(batch, len(groups), config.group_size)  # (N,)
        with torch.no_grad():
            proximal = token_logprobs(self.policy, batch.tokens)  # (N, L)
            reference = token_logprobs(self.reference, batch.tokens)  # (N, L)
        weights = truncated_importance_weights(proximal, batch.behaviour_logprobs, cap=config.importance_weight_cap)
        losses, clips = [], []
        for rows in torch.arange(batch.tokens.shape[0]).chunk(config.updates_per_step):
            loss, clip = _update(self.policy, self.optimizer, batch, advantages, proximal, weights, rows, config)
            losses.append(loss)
            clips.append(clip)
            self.version += 1
            if self.version % config.sync_every == 0:
                publish(self.policy.state_dict(), self.version)
        return RlvrStepStats(
            step=index, policy_version=self.version, mean_score=statistics.fmean(drawn_scores),
            loss=statistics.fmean(losses), kl_to_reference=kl_to_reference(proximal, reference, batch.loss_mask),
            clip_fraction=statistics.fmean(clips), num_groups_used=len(groups),
            num_dropped_all_equal=filled.num_dropped_all_equal, num_dropped_stale=filled.num_dropped_stale,
        )


def run_rlvr(
    policy: CausalLM, reference: CausalLM, codec: TextCodec, tasks: Sequence[Task], config: RlvrConfig, *,
    policy_factory: Callable[[], CausalLM], on_step: Callable[[float, float], object] | None = None,
) -> RlvrResult:
    """Train `policy` in place; `policy_factory` builds an architecture-equal module in the
    generator process (it must be picklable: a module-level function or functools.partial).
    `on_step(seconds, loss)` after each trainer step, its generator draws included; a step
    without signal (no usable group) trains nothing and is not reported."""
    trainer, started = _Trainer(policy.train(), reference.eval(), config, codec.pad_id), time.perf_counter()
    steps, without_signal = [], 0
    generator = GeneratorProcess(policy_factory=policy_factory, codec=codec, tasks=tasks, config=config.generation())
    budget = DrawBudget(groups_per_step=config.groups_per_step, max_draws_per_group=config.max_draws_per_group)
    with generator.start(policy.state_dict(), trainer.version):
        for index in range(config.num_steps):
            step_started = time.perf_counter()
            drawn: list[float] = []

            def draw() -> Group:
                group = generator.next_group()
                drawn.extend(r.score for r in group.rollouts)
                return group

            filled = budget.fill(index, draw, trainer.admit)
            # Whole mini-batches only: a short batch (draw bound hit) drops its remainder.
            usable = 0 if filled is None else filled.num_kept - filled.num_kept % config.updates_per_step
            if usable == 0:
                without_signal += 1
                continue
            steps.append(trainer.step(index, filled, filled.groups[:usable], drawn, generator.publish))
            if on_step is not None:
                on_step(time.perf_counter() - step_started, steps[-1].loss)
        syncs = generator.num_weight_syncs
    return RlvrResult(
        steps=tuple(steps), staleness=trainer.staleness.report(), num_weight_syncs=syncs,
        num_steps_without_signal=without_signal, num_groups_drawn=budget.drawn, wall_seconds=time.perf_counter() - started,
    )
