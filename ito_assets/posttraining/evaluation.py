"""The post-training eval battery's measurements: verifiable reward on held-out prompts, and the
KL divergence of the policy from its frozen reference."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from ito_assets.posttraining.decoding import Completion, encode_prompt, sample_prompts
from ito_assets.posttraining.eval_gate import EVAL_BATCH_PROMPTS, EVAL_SAMPLES_PER_PROMPT
from ito_assets.posttraining.policy import CausalLM, masked_mean, token_logprobs
from ito_assets.posttraining.rewards import score
from ito_assets.posttraining.tasks import Task
from ito_assets.posttraining.vocab import TextCodec


@dataclass(frozen=True, kw_only=True)
class RewardEval:
    mean_reward: float  # mean verifiable score over prompts x samples at temperature 1
    per_task: tuple[float, ...]  # mean score of each prompt, in task order (paired comparisons)
    # The sample variance of each prompt's scores over its num_samples draws: the gate's floor on
    # noise, where a few prompts happen to move alike. Empty in an evaluation stored before it was
    # recorded (a previous stage's "after"): the gate then has the spread over prompts alone.
    per_task_variance: tuple[float, ...] = ()
    greedy_accuracy: float  # share of prompts answered right by greedy decoding
    num_tasks: int
    num_samples: int

    @property
    def standard_error(self) -> float:
        return statistics.stdev(self.per_task) / len(self.per_task) ** 0.5 if len(self.per_task) > 1 else 0.0

    def as_dict(self) -> dict:
        return {
            "mean_reward": round(self.mean_reward, 4),
            "standard_error": round(self.standard_error, 4),
            "greedy_accuracy": round(self.greedy_accuracy, 4),
            "num_tasks": self.num_tasks,
            "num_samples": self.num_samples,
        }


@torch.no_grad()
def evaluate_reward(
    policy: CausalLM, codec: TextCodec, tasks: Sequence[Task], *, max_new_tokens: int,
    num_samples: int = EVAL_SAMPLES_PER_PROMPT, seed: int = 0,
) -> RewardEval:
    """Seeded: the same policy and tasks give the same figures."""
    if not tasks:
        raise ValueError("tasks must not be empty")
    if num_samples < 2:
        raise ValueError("num_samples must be at least 2: the gate needs each prompt's sampling spread")
    was_training = getattr(policy, "training", False)
    policy.eval()
    generator = torch.Generator().manual_seed(seed)
    prompts = [encode_prompt(codec, task.prompt) for task in tasks]
    per_task, variance, greedy = [0.0] * len(tasks), [0.0] * len(tasks), [0.0] * len(tasks)
    for indices in _same_length_batches(prompts):
        batch = [prompts[i] for i in indices]
        sampled = sample_prompts(policy, batch, num_samples=num_samples, max_new_tokens=max_new_tokens,
                                 eos_id=codec.eos_id, temperature=1.0, generator=generator)
        best = sample_prompts(policy, batch, num_samples=1, max_new_tokens=max_new_tokens, eos_id=codec.eos_id,
                              temperature=0)
        for i, completions, (top,) in zip(indices, sampled, best):
            scores = [score(tasks[i], c.text(codec)) for c in completions]
            per_task[i], variance[i] = statistics.fmean(scores), statistics.variance(scores)
            greedy[i] = score(tasks[i], top.text(codec))
    policy.train(was_training)
    return RewardEval(
        mean_reward=statistics.fmean(per_task), per_task=tuple(per_task), per_task_variance=tuple(variance),
        greedy_accuracy=statistics.fmean(greedy),
        num_tasks=len(tasks), num_samples=num_samples,
    )


def kl_to_reference(policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """KL(policy || reference) per token, estimated on tokens sampled from the policy with the
    unbiased, always-positive k3 estimator (Schulman 2020, "Approximating KL divergence"):
    r = ref / policy, k3 = (r - 1) - log r. Inputs (N, L); returns the token-level mean."""
    # Masked positions (padding) set to 0 first: a huge ratio there overflows expm1 to inf, and
    # inf x 0 in the mean is nan.
    log_ratio = torch.where(mask.bool(), (reference_logprobs - policy_logprobs).float(), 0.0)  # (N, L)
    return float(masked_mean(torch.expm1(log_ratio) - log_ratio, mask))


@torch.no_grad()
def sampled_kl(
    policy: CausalLM, reference: CausalLM, codec: TextCodec, tasks: Sequence[Task], *, max_new_tokens: int,
    num_samples: int = EVAL_SAMPLES_PER_PROMPT, seed: int = 0,
) -> float:
    """KL(policy || reference) per token on completions the policy samples for `tasks`."""
    generator, total, num_tokens = torch.Generator().manual_seed(seed), 0.0, 0
    prompts = [encode_prompt(codec, task.prompt) for task in tasks]
    for indices in _same_length_batches(prompts):
        batch = [prompts[i] for i in indices]
        sampled = sample_prompts(policy, batch, num_samples=num_samples, max_new_tokens=max_new_tokens,
                                 eos_id=codec.eos_id, generator=generator)
        tokens, mask = _completion_rows(batch, sampled, codec.pad_id)
        count = int(mask.sum())
        total += kl_to_reference(token_logprobs(policy, tokens), token_logprobs(reference, tokens), mask) * count
        num_tokens += count
    return total / max(1, num_tokens)


def _same_length_batches(prompts: Sequence[list[int]]) -> Iterator[list[int]]:
    """Indices of `prompts`, grouped by length in first-seen order, in runs of EVAL_BATCH_PROMPTS."""
    by_length: dict[int, list[int]] = {}
    for index, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(index)
    for indices in by_length.values():
        for start in range(0, len(indices), EVAL_BATCH_PROMPTS):
            yield indices[start : start + EVAL_BATCH_PROMPTS]


def _completion_rows(prompts: list[list[int]], sampled: list[list[Completion]],
                     pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt + completion of every sample as rows (R, T), padded, and the mask of the completion's
    targets (R, T-1)."""
    rows = [(prompt, completion.ids) for prompt, completions in zip(prompts, sampled) for completion in completions]
    width = max(len(p) + len(ids) for p, ids in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width - 1)
    for row, (prompt, ids) in enumerate(rows):
        tokens[row, : len(prompt) + len(ids)] = torch.tensor(prompt + list(ids))
        mask[row, len(prompt) - 1 : len(prompt) - 1 + len(ids)] = 1.0
    return tokens, mask
