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


# The same recipe as the stage worker's optimizer settings (`WorkerConfig.optimizer`, over the
# pretraining TrainConfig): a constant rate (one warmup step reaches the peak, the cosine's floor
# is the peak), these betas, clip and decay.
WORKER_RECIPE = {"warmup_fraction": 0.0, "min_lr_ratio": 1.0, "beta1": BETAS[0], "beta2": BETAS[1],
                 "weight_decay": WEIGHT_DECAY, "grad_clip": GRAD_CLIP}
