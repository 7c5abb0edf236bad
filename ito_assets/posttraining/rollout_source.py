"""GRPO's batches for the stage worker: what `rlvr.run_rlvr` does between optimizer steps, behind
the loader's interface (`position`, `next_batch`, `tokens_at`), so that the worker's loop, its
checkpoints, restarts and telemetry serve RLVR as they serve the other stages.

A batch: groups drawn from the generator process until `groups_per_step` are fresh (at most
`max_staleness` versions old) and informative, or the step's part of the priced draws is spent,
as `sampling.DrawBudget` decides; their rows as
inputs and targets (-100 off the completions of samples that finished); and beside each row its
advantage, its behaviour log-probabilities (the generator's) and its proximal ones (the policy's
before this step), which `runtime.worker.reinforcement` turns into DAPO's loss.

A version is an optimizer step: the worker's step count. The generator starts with the weights
and the version the attempt resumed at (a fresh generator each attempt; a restart's is seeded by
the version, so that it does not replay the first attempt's draws), and receives the weights after every
`sync_every` steps. A group from the killed attempt's generator never reaches the new one: the
staleness bound therefore holds across a restart.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.evaluation import kl_to_reference
from ito_assets.posttraining.generation import GenerationConfig, GeneratorProcess
from ito_assets.posttraining.losses import group_advantages
from ito_assets.posttraining.policy import token_logprobs
from ito_assets.posttraining.rollouts import Group, collate
from ito_assets.posttraining.sampling import DrawBudget
from ito_assets.posttraining.staleness import staleness, step_queue_size
from ito_assets.posttraining.tasks import Task
from ito_assets.posttraining.vocab import CharVocab, TextCodec
from ito_assets.runtime.stage.config import ReinforcementObjective
from ito_assets.runtime.worker.batches import IGNORE

# Batches in a row with no usable group (every group all-equal, stale, or every sample truncated)
# before the stage fails: the generator or the recipe is broken, not unlucky (a batch draws up to
# a step's share of the priced draws, `sampling.DrawBudget`). The stage fails sooner where the
# priced draws run out.
MAX_BATCHES_WITHOUT_SIGNAL = 10


def write_tasks(tasks: list[Task], path: Path) -> None:
    path.write_text("".join(json.dumps(task.__dict__, sort_keys=True) + "\n" for task in tasks), encoding="utf-8")


def read_tasks(path: Path) -> list[Task]:
    return [Task(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def codec_of(objective: ReinforcementObjective) -> TextCodec:
    if objective.tokenizer_path is None:
        return CharVocab()
    from ito_assets.posttraining.bpe import BpeCodec, TokenizerRef

    return BpeCodec.load(TokenizerRef(path=objective.tokenizer_path, sha256=objective.tokenizer_sha256))


def generator_seed(seed: int, version: int) -> int:
    """A stage's first generator draws as the in-process loop's does (the run's seed); one
    started by a restart draws anew, from the seed and the version it starts at, rather than
    replay the first attempt's tasks and samples."""
    return seed if version == 0 else int(np.random.SeedSequence([seed, version]).generate_state(1)[0])


class RolloutSource:
    """The worker's `batches.Loader` for GRPO, its generator started at `version` with the model's
    weights; `beside` holds the last batch's per-row values, `trained(step)` follows each update."""

    has_rows = True  # targets may be -100: the step weighs every target of the batch once

    def __init__(self, objective: ReinforcementObjective, *, model: torch.nn.Module, reference: torch.nn.Module,
                 tasks: list[Task], seed: int, version: int):
        self.objective, self.model, self.reference = objective, model, reference.eval()
        self.codec = codec_of(objective)
        self.position = version  # the loader's name for it: the steps taken
        config = GenerationConfig(group_size=objective.group_size, max_new_tokens=objective.max_new_tokens,
                                  overlong_cache=objective.overlong_cache, seed=generator_seed(seed, version),
                                  queue_size=step_queue_size(objective.groups_per_step))
        self.generator = GeneratorProcess(policy_factory=_builder(model), codec=self.codec, tasks=tasks, config=config)
        self.generator.start(_weights(model), version)
        self.budget = DrawBudget(groups_per_step=objective.groups_per_step,
                                 max_draws_per_group=objective.max_draws_per_group, first_step=version)
        self.beside: torch.Tensor | None = None  # (N, 3, L): advantage, behaviour, proximal log-probabilities
        self._tokens = 0
        self._counts: Counter[str] = Counter({"weight_syncs": 1})

    def next_batch(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        for _ in range(MAX_BATCHES_WITHOUT_SIGNAL):
            drawn: list[float] = []

            def draw() -> Group:
                group = self.generator.next_group()
                drawn.extend(r.score for r in group.rollouts)
                return group

            filled = self.budget.fill(self.position, draw, self._admit)
            if filled is None:
                budget = self.budget
                raise ItoError(ErrorCode.GENERATION_DRAWS_SPENT,
                               f"step {self.position + 1} found no group to learn from (all rewards equal, too stale, or "
                               f"every sample truncated) before the priced draws ran out: {budget.drawn} groups drawn for "
                               f"steps {budget.first_step + 1} to {self.position + 1}, at most "
                               f"{budget.max_draws_per_group} (max_draws_per_group) for each of a step's {budget.groups_per_step}")
            self._counts.update({"dropped_all_equal": filled.num_dropped_all_equal})
            if filled.groups and any(not r.truncated for g in filled.groups for r in g.rollouts):
                return self._batch(list(filled.groups), drawn)
            self._counts.update({"steps_without_signal": 1})
        raise ItoError(ErrorCode.GENERATION_FAILED, f"{MAX_BATCHES_WITHOUT_SIGNAL} batches in a row held no group "
                       "to learn from (all rewards equal, too stale, or every sample truncated)")

    def _admit(self, group: Group) -> bool:
        lag = staleness(group.policy_version, self.position)
        fresh = lag <= self.objective.max_staleness
        self._counts.update({f"{'admitted' if fresh else 'dropped'}_staleness_{lag}": 1})
        return fresh

    def _batch(self, groups: list[Group], drawn: list[float]) -> tuple[int, torch.Tensor, torch.Tensor]:
        batch = collate(groups, pad_id=self.codec.pad_id)
        advantages = group_advantages(batch.rewards.view(len(groups), self.objective.group_size)).flatten()  # (N,)
        tokens = batch.tokens.to(next(self.model.parameters()).device)
        with torch.no_grad():
            proximal = token_logprobs(self.model, tokens).cpu()  # (N, L)
            reference = token_logprobs(self.reference, tokens).cpu()  # (N, L)
        targets = torch.where(batch.loss_mask > 0, batch.tokens[:, 1:], IGNORE)  # (N, L)
        self.beside = torch.stack([advantages.unsqueeze(1).expand_as(proximal), batch.behaviour_logprobs, proximal],
                                  dim=1)  # (N, 3, L)
        self._tokens = int((batch.tokens != self.codec.pad_id).sum())
        self._counts.update({"groups_used": len(groups)})
        self._reward, self._kl = statistics.fmean(drawn), kl_to_reference(proximal, reference, batch.loss_mask)
        position = self.position
        return position, batch.tokens[:, :-1], targets

    def trained(self, step: int) -> None:
        """The optimizer step `step` is taken: the policy is version `step`; the generator gets it
        every `sync_every` versions."""
        self.position = step
        if step % self.objective.sync_every == 0:
            self.generator.publish(_weights(self.model), step)
            self._counts.update({"weight_syncs": 1})

    def tokens_at(self, position: int) -> int:
        """The last batch's tokens (prompts and completions, not padding)."""
        return self._tokens

    def take_metrics(self) -> dict[str, float]:
        """The step's reward (every sample drawn), KL to the reference, and the counts since the
        last step (staleness by lag, dropped groups, weight transfers); the counts start again."""
        metrics = {"reward": self._reward, "kl_to_reference": self._kl, **{k: float(v) for k, v in self._counts.items()}}
        self._counts = Counter()
        return metrics

    def close(self) -> None:
        self.generator.close()


def _weights(model: torch.nn.Module) -> dict:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _builder(model: torch.nn.Module):
    """An architecture-equal, picklable builder for the generator process (it loads the weights sent)."""
    from ito_assets.training.model import build_model

    return functools.partial(build_model, model.config, seed=0)
