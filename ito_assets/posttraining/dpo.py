"""Direct preference optimisation on preference pairs, against a frozen reference policy."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ito_assets.manifest.schema import DpoStep
from ito_assets.posttraining.fixtures import PreferencePair
from ito_assets.posttraining.losses import dpo_loss, sequence_logprobs
from ito_assets.posttraining.optim import adamw, optimizer_step
from ito_assets.posttraining.policy import CausalLM, masked_mean, token_logprobs
from ito_assets.posttraining.sft import response_batch
from ito_assets.posttraining.vocab import TextCodec

_DPO = DpoStep.model_fields


@dataclass(frozen=True, kw_only=True)
class DpoConfig:
    beta: float = _DPO["beta"].default
    label_smoothing: float = _DPO["label_smoothing"].default
    rpo_alpha: float = _DPO["rpo_alpha"].default
    learning_rate: float = _DPO["learning_rate"].default
    # One epoch: Rafailov et al. (2023) and Tulu 3's DPO train a single pass over the pairs.
    num_epochs: int = 1
    batch_size: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_epochs < 1 or self.batch_size < 1:
            raise ValueError("num_epochs and batch_size must be >= 1")

    @classmethod
    def from_step(cls, step: DpoStep, **runtime) -> "DpoConfig":
        return cls(beta=step.beta, label_smoothing=step.label_smoothing, rpo_alpha=step.rpo_alpha,
                   learning_rate=step.learning_rate, **runtime)


@dataclass(frozen=True, kw_only=True)
class DpoResult:
    losses: tuple[float, ...]  # one per optimizer step
    accuracies: tuple[float, ...]  # share of pairs with a positive implicit-reward margin, per step
    mean_margin: float  # of the last step: beta x log-ratio margin (the implicit reward gap)
    num_steps: int
    wall_seconds: float


def _pair_logprobs(
    policy: CausalLM, codec: TextCodec, batch: Sequence[PreferencePair]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (chosen, rejected) summed response log-probabilities, each (N,), and the chosen
    responses' negative log-likelihood per token (scalar). One forward over the 2N sequences:
    chosen rows first, then rejected rows."""
    prompts = [p.prompt for p in batch] * 2
    responses = [p.chosen for p in batch] + [p.rejected for p in batch]
    tokens, mask = response_batch(codec, prompts, responses)  # (2N, T), (2N, T-1)
    logprobs = token_logprobs(policy, tokens)  # (2N, T-1)
    summed = sequence_logprobs(logprobs, mask)  # (2N,)
    n = len(batch)
    return summed[:n], summed[n:], -masked_mean(logprobs[:n], mask[:n])


def run_dpo(
    policy: CausalLM, reference: CausalLM, codec: TextCodec, pairs: Sequence[PreferencePair], config: DpoConfig,
    on_step: Callable[[float, float], object] | None = None,
) -> DpoResult:
    """Train `policy` in place; `reference` is only read (no gradient); `on_step(seconds, loss)`
    after each optimizer step."""
    if not pairs:
        raise ValueError("pairs must not be empty")
    policy.train()
    reference.eval()
    optimizer = adamw(policy, learning_rate=config.learning_rate)
    rng, losses, accuracies, margin, started = random.Random(config.seed), [], [], 0.0, time.perf_counter()
    for _ in range(config.num_epochs):
        order = list(range(len(pairs)))
        rng.shuffle(order)
        for start in range(0, len(order), config.batch_size):
            step_started = time.perf_counter()
            batch = [pairs[i] for i in order[start : start + config.batch_size]]
            with torch.no_grad():
                ref_chosen, ref_rejected, _ = _pair_logprobs(reference, codec, batch)
            chosen, rejected, chosen_nll = _pair_logprobs(policy, codec, batch)
            result = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=config.beta,
                              label_smoothing=config.label_smoothing, rpo_alpha=config.rpo_alpha,
                              chosen_nll=chosen_nll)
            optimizer_step(policy, optimizer, result.loss)
            losses.append(float(result.loss.detach()))
            accuracies.append(result.accuracy)
            margin = float(result.margins.mean())
            if on_step is not None:
                on_step(time.perf_counter() - step_started, losses[-1])
    return DpoResult(
        losses=tuple(losses), accuracies=tuple(accuracies), mean_margin=margin, num_steps=len(losses),
        wall_seconds=time.perf_counter() - started,
    )
