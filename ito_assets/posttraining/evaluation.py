"""The post-training eval battery's measurements: verifiable reward on held-out prompts, and the
KL divergence of the policy from its frozen reference."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

import torch

from ito_assets.posttraining.decoding import encode_prompt, sample
from ito_assets.posttraining.policy import CausalLM, masked_mean, token_logprobs
from ito_assets.posttraining.rewards import score
from ito_assets.posttraining.tasks import Task
from ito_assets.posttraining.vocab import TextCodec

# 8 samples per prompt (avg@8): the reward RL optimises, with a sampling error small enough to
# compare stages; DAPO reports avg@32 on AIME for the same reason (Yu et al. 2025, section 4.1).
EVAL_SAMPLES_PER_PROMPT = 8


@dataclass(frozen=True, kw_only=True)
class RewardEval:
    mean_reward: float  # mean verifiable score over prompts x samples at temperature 1
    per_task: tuple[float, ...]  # mean score of each prompt, in task order (paired comparisons)
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
    was_training = getattr(policy, "training", False)
    policy.eval()
    generator = torch.Generator().manual_seed(seed)
    per_task, greedy = [], []
    for task in tasks:
        prompt = encode_prompt(codec, task.prompt)
        sampled = sample(policy, prompt, num_samples=num_samples, max_new_tokens=max_new_tokens,
                         eos_id=codec.eos_id, temperature=1.0, generator=generator)
        per_task.append(statistics.fmean(score(task, c.text(codec)) for c in sampled))
        best = sample(policy, prompt, num_samples=1, max_new_tokens=max_new_tokens, eos_id=codec.eos_id, temperature=0)
        greedy.append(score(task, best[0].text(codec)))
    policy.train(was_training)
    return RewardEval(
        mean_reward=statistics.fmean(per_task), per_task=tuple(per_task), greedy_accuracy=statistics.fmean(greedy),
        num_tasks=len(tasks), num_samples=num_samples,
    )


def kl_to_reference(policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """KL(policy || reference) per token, estimated on tokens sampled from the policy with the
    unbiased, always-positive k3 estimator (Schulman 2020, "Approximating KL divergence"):
    r = ref / policy, k3 = (r - 1) - log r. Inputs (N, L); returns the token-level mean."""
    log_ratio = (reference_logprobs - policy_logprobs).float()  # (N, L)
    return float(masked_mean(torch.expm1(log_ratio) - log_ratio, mask))


@torch.no_grad()
def sampled_kl(
    policy: CausalLM, reference: CausalLM, codec: TextCodec, tasks: Sequence[Task], *, max_new_tokens: int,
    num_samples: int = EVAL_SAMPLES_PER_PROMPT, seed: int = 0,
) -> float:
    """KL(policy || reference) per token on completions the policy samples for `tasks`."""
    generator, total, num_tokens = torch.Generator().manual_seed(seed), 0.0, 0
    for task in tasks:
        prompt = encode_prompt(codec, task.prompt)
        completions = sample(policy, prompt, num_samples=num_samples, max_new_tokens=max_new_tokens,
                             eos_id=codec.eos_id, generator=generator)
        width = len(prompt) + max(len(c.ids) for c in completions)
        tokens = torch.full((num_samples, width), codec.pad_id, dtype=torch.long)  # (G, T)
        mask = torch.zeros(num_samples, width - 1)  # (G, T-1): completion targets
        for row, completion in enumerate(completions):
            tokens[row, : len(prompt) + len(completion.ids)] = torch.tensor(prompt + list(completion.ids))
            mask[row, len(prompt) - 1 : len(prompt) - 1 + len(completion.ids)] = 1.0
        count = int(mask.sum())
        total += kl_to_reference(token_logprobs(policy, tokens), token_logprobs(reference, tokens), mask) * count
        num_tokens += count
    return total / max(1, num_tokens)
