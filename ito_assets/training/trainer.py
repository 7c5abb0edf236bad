"""A short, deterministic training loop: AdamW, linear warmup then cosine decay, gradient clipping.

The loop reads in one screen; the work is in `train_step`. The same seed, data order and device
give the same loss history (CPU kernels are deterministic for this model).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from ito_assets.training.model import DecoderLM
from ito_assets.training.model_config import flops_per_token
from ito_assets.training.optim import adamw, optimizer_step


def _require(condition: bool, name: str, rule: str) -> None:
    if not condition:
        raise ValueError(f"{name} {rule}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    num_steps: int
    batch_size: int
    sequence_length: int
    seed: int = 0
    # 3e-3 peak: small models take high rates (OLMo ladder / DataDecide use 4e-4 at 1B rising to
    # ~3e-3 at 20M; nanoGPT's character model uses 1e-3).
    learning_rate: float = 3e-3
    # Cosine to 10% of the peak: Chinchilla (Hoffmann et al. 2022, section 3) and Llama.
    min_lr_ratio: float = 0.1
    # 10% of steps of linear warmup, at least one step.
    warmup_fraction: float = 0.1
    # AdamW betas (0.9, 0.95), weight decay 0.1, clip 1.0: GPT-3 (Brown et al. 2020, appendix B).
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.1
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        for name in ("num_steps", "batch_size", "sequence_length"):
            _require(getattr(self, name) >= 1, name, "must be positive")
        _require(0 < self.learning_rate < 1, "learning_rate", "must be in (0, 1)")
        _require(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]")
        _require(0 <= self.warmup_fraction < 1, "warmup_fraction", "must be in [0, 1)")
        _require(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "beta1", "and beta2 must be in [0, 1)")
        _require(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        _require(self.grad_clip > 0, "grad_clip", "must be positive")

    @property
    def warmup_steps(self) -> int:
        return max(1, round(self.warmup_fraction * self.num_steps))

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.sequence_length


def learning_rate_at(step: int, config: TrainConfig) -> float:
    """Linear warmup over `warmup_steps`, then cosine from the peak to min_lr_ratio x peak."""
    peak = config.learning_rate
    if step < config.warmup_steps:
        return peak * (step + 1) / config.warmup_steps
    span = max(1, config.num_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    floor = peak * config.min_lr_ratio
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """The shared AdamW (`ito_assets.training.optim`) with this config's rate, betas and decay."""
    return adamw(model, learning_rate=config.learning_rate, betas=(config.beta1, config.beta2),
                 weight_decay=config.weight_decay)


@dataclass(frozen=True, kw_only=True)
class StepStats:
    step: int
    loss: float
    grad_norm: float
    learning_rate: float


def train_step(
    model: DecoderLM, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, step: int, config: TrainConfig
) -> StepStats:
    """One optimizer step on a (B, T) batch: forward, backward, clip, update."""
    lr = learning_rate_at(step, config)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = model.loss(x, y)
    grad_norm = optimizer_step(model, optimizer, loss, grad_clip=config.grad_clip)
    return StepStats(step=step, loss=float(loss.detach()), grad_norm=grad_norm, learning_rate=lr)


@dataclass(frozen=True, kw_only=True)
class TrainResult:
    losses: tuple[float, ...]
    num_steps: int
    num_tokens: int
    wall_seconds: float
    tokens_per_second: float
    model_flops: int  # flops_per_token x tokens (PaLM convention)

    @property
    def final_loss(self) -> float:
        # Mean of the last 10% of steps: one step's loss is a noisy estimate.
        tail = self.losses[-max(1, len(self.losses) // 10):]
        return sum(tail) / len(tail)

    def summary(self) -> dict:
        return {
            "num_steps": self.num_steps,
            "num_tokens": self.num_tokens,
            "first_loss": self.losses[0],
            "final_loss": self.final_loss,
            "wall_seconds": round(self.wall_seconds, 3),
            "tokens_per_second": round(self.tokens_per_second, 1),
            "model_flops": self.model_flops,
        }


def train(model: DecoderLM, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], config: TrainConfig) -> TrainResult:
    """`config.num_steps` steps over `batches`; the model is trained in place."""
    model.train()
    optimizer = build_optimizer(model, config)
    losses: list[float] = []
    started = time.perf_counter()
    for step in range(config.num_steps):
        x, y = next(batches)
        if x.shape != (config.batch_size, config.sequence_length):
            raise ValueError("batches must have shape (batch_size, sequence_length)")
        losses.append(train_step(model, optimizer, x, y, step, config).loss)
    wall = time.perf_counter() - started
    num_tokens = config.num_steps * config.tokens_per_step
    return TrainResult(
        losses=tuple(losses),
        num_steps=config.num_steps,
        num_tokens=num_tokens,
        wall_seconds=wall,
        tokens_per_second=num_tokens / wall if wall > 0 else float("inf"),
        model_flops=flops_per_token(model.config, config.sequence_length) * num_tokens,
    )
