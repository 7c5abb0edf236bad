"""The optimizer the three stages share: AdamW with decoupled weight decay on matrices only, and
one step = zero grads, backward, clip the global gradient norm, update."""

from __future__ import annotations

import torch

# Betas (0.9, 0.999), gradient-norm clip 1.0, weight decay 0.0: the defaults of Hugging Face
# `TrainingArguments`, which TRL's SFT, DPO and GRPO trainers inherit; verl's actor also clips at 1.0.
BETAS = (0.9, 0.999)
GRAD_CLIP = 1.0
WEIGHT_DECAY = 0.0


def adamw(policy: torch.nn.Module, *, learning_rate: float, weight_decay: float = WEIGHT_DECAY) -> torch.optim.AdamW:
    if not 0 < learning_rate < 1:
        raise ValueError("learning_rate must be in (0, 1)")
    decay = [p for p in policy.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in policy.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    # foreach=False: the single-tensor path, bit-stable on CPU (as ito_assets.training.trainer).
    return torch.optim.AdamW(groups, lr=learning_rate, betas=BETAS, foreach=False)


def optimizer_step(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor, *, grad_clip: float = GRAD_CLIP
) -> float:
    """Backward `loss` and update; returns the gradient norm before clipping."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip)
    optimizer.step()
    return float(norm)
