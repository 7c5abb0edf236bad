"""The one AdamW builder and optimizer step, used by pretraining (`trainer.build_optimizer`, and
so the runtime worker) and by the three post-training stages (`posttraining.optim`), which differ
only in their hyperparameters.

Weight decay applies to matrices only; norm gains and biases are not decayed (nanoGPT, OLMo). The
embedding is a matrix and decays with the rest (GPT-2/nanoGPT practice).
"""

from __future__ import annotations

import torch
from torch import nn


def adamw(model: nn.Module, *, learning_rate: float, betas: tuple[float, float], weight_decay: float) -> torch.optim.AdamW:
    if not 0 < learning_rate < 1:
        raise ValueError("learning_rate must be in (0, 1)")
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # CPU: the single-tensor path (foreach=False), whose results are bit-stable. CUDA: the fused
    # kernel, the fastest AdamW implementation there (PyTorch torch.optim docs).
    on_cuda = any(p.is_cuda for p in decay)
    implementation = {"fused": True} if on_cuda else {"foreach": False}
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **implementation)


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor, *, grad_clip: float) -> float:
    """Backward `loss`, clip the global gradient norm to `grad_clip`, update, then free the
    gradients; returns the gradient norm before clipping. Freeing them here, not before the next
    backward, keeps the last step's gradients from living through the next forward pass."""
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
