"""Samples as the generator produces them and the trainer consumes them.

A rollout is one completion of one prompt, stamped with the policy version that generated it and
the behaviour log-probability of each generated token. A group is G rollouts of the same prompt
from the same policy version: GRPO's unit of comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class Rollout:
    prompt_ids: tuple[int, ...]  # bos + prompt tokens
    completion_ids: tuple[int, ...]  # generated tokens, eos included when one was generated
    behaviour_logprobs: tuple[float, ...]  # one per completion token, under the generating policy
    truncated: bool  # reached the length limit without eos: masked out of the loss (DAPO)
    score: float  # the verifiable reward
    reward: float  # score + overlong shaping: what the advantage is computed from


@dataclass(frozen=True, kw_only=True)
class Group:
    task_id: str
    policy_version: int  # optimizer steps the generating weights had taken
    rollouts: tuple[Rollout, ...]

    @property
    def rewards(self) -> tuple[float, ...]:
        return tuple(r.reward for r in self.rollouts)

    @property
    def all_equal(self) -> bool:
        """No learning signal: every advantage would be zero (DAPO dynamic sampling drops these)."""
        return len(set(self.rewards)) <= 1


@dataclass(frozen=True, kw_only=True)
class RolloutBatch:
    tokens: torch.Tensor  # (N, T) prompt + completion, right-padded
    loss_mask: torch.Tensor  # (N, T-1) 1 on completion targets of samples that were not truncated
    behaviour_logprobs: torch.Tensor  # (N, T-1) aligned with the targets, 0 off the completion
    rewards: torch.Tensor  # (N,)
    group_index: torch.Tensor  # (N,) which group each row belongs to
    policy_versions: torch.Tensor  # (N,)


def collate(groups: list[Group], *, pad_id: int) -> RolloutBatch:
    """Groups -> padded tensors; the target at position t is tokens[:, t + 1]."""
    rows = [(gi, g.policy_version, r) for gi, g in enumerate(groups) for r in g.rollouts]
    width = max(len(r.prompt_ids) + len(r.completion_ids) for _, _, r in rows)
    n = len(rows)
    tokens = torch.full((n, width), pad_id, dtype=torch.long)  # (N, T)
    loss_mask = torch.zeros((n, width - 1))  # (N, T-1)
    behaviour = torch.zeros((n, width - 1))  # (N, T-1)
    for i, (_, _, rollout) in enumerate(rows):
        p, c = len(rollout.prompt_ids), len(rollout.completion_ids)
        tokens[i, : p + c] = torch.tensor(rollout.prompt_ids + rollout.completion_ids)
        # Completion token j sits at position p + j and is predicted at position p + j - 1.
        behaviour[i, p - 1 : p - 1 + c] = torch.tensor(rollout.behaviour_logprobs)
        if not rollout.truncated:
            loss_mask[i, p - 1 : p - 1 + c] = 1.0
    return RolloutBatch(
        tokens=tokens,
        loss_mask=loss_mask,
        behaviour_logprobs=behaviour,
        rewards=torch.tensor([r.reward for _, _, r in rows]),
        group_index=torch.tensor([gi for gi, _, _ in rows]),
        policy_versions=torch.tensor([v for _, v, _ in rows]),
    )
