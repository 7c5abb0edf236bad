"""GRPO as the worker's objective (`WorkerConfig.reinforcement`): DAPO's clipped surrogate with
clip-higher and truncated importance weights (`posttraining.losses.dapo_policy_loss`), on the
rows `posttraining.rollout_source` draws, with each row's advantage, behaviour and proximal
log-probabilities read beside it. The loss is a mean over the micro-batch's completion tokens; the
step weighs micro-batches by their tokens (`step.target_divisors`), so the step's loss is DAPO's
token-level mean over the whole batch.

Beside the loss it counts the tokens where the clipped branch was taken, for the step's clip
fraction (`take_metrics`)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ito_assets.posttraining.losses import dapo_policy_loss, truncated_importance_weights
from ito_assets.posttraining.policy import gathered_logprobs
from ito_assets.runtime.stage.config import ReinforcementObjective
from ito_assets.runtime.worker.batches import IGNORE


class Reinforcement(nn.Module):
    def __init__(self, model: nn.Module, objective: ReinforcementObjective):
        super().__init__()
        self.model = model
        self.objective = objective
        self.counts = torch.zeros(2, dtype=torch.float64)  # tokens clipped, tokens

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, beside: torch.Tensor) -> torch.Tensor:
        """tokens, targets (b, L); beside (b, 3, L): advantage, behaviour, proximal log-probabilities."""
        mask = (targets != IGNORE).float()
        logprobs = gathered_logprobs(self.model(tokens).float(), targets.clamp(min=0))  # (b, L)
        proximal, behaviour = beside[:, 2], beside[:, 1]
        weights = truncated_importance_weights(proximal, behaviour, cap=self.objective.importance_weight_cap)
        result = dapo_policy_loss(logprobs, proximal, beside[:, 0, 0], mask, importance_weights=weights,
                                  clip_eps_low=self.objective.clip_eps_low, clip_eps_high=self.objective.clip_eps_high)
        self.counts += torch.tensor([result.clip_fraction * result.num_tokens, result.num_tokens], dtype=torch.float64)
        return result.loss

    def take_metrics(self, device: torch.device) -> dict[str, float]:
        """The step's clip fraction over every rank's tokens; the counts start again."""
        counts = self.counts.to(device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        self.counts = torch.zeros(2, dtype=torch.float64)
        clipped, tokens = (float(c) for c in counts.cpu())
        return {"clip_fraction": clipped / tokens if tokens else 0.0}
