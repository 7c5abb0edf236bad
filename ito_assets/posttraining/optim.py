"""The post-training stages' optimizer settings. The builder and the step are the pretraining
trainer's (`ito_assets.training.optim`): AdamW with decoupled weight decay on matrices only, and
one step = zero grads, backward, clip the global gradient norm, update."""

from __future__ import annotations

import torch

from ito_assets.training import optim

# Betas (0.9, 0.999), gradient-norm clip 1.0, weight decay 0.0: the defaults of Hugging Face
# `TrainingArguments`, which TRL's SFT, DPO and GRPO trainers inherit; verl's actor also clips at 1.0.
BETAS = (0.9, 0.999)
GRAD_CLIP = 1.0
WEIGHT_DECAY = 0.0


def adamw(policy: torch.nn.Module, *, learning_rate: float, weight_decay: float = WEIGHT_DECAY) -> torch.optim.AdamW:
    return optim.adamw(policy, learning_rate=learning_rate, betas=BETAS, weight_decay=weight_decay)


def optimizer_step(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor, *, grad_clip: float = GRAD_CLIP
) -> float:
    """Backward `loss` and update; returns the gradient norm before clipping."""
    return optim.optimizer_step(policy, optimizer, loss, grad_clip=grad_clip)
