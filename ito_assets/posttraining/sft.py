"""Supervised fine-tuning on instruction pairs: next-token loss on the response tokens only."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ito_assets.manifest.schema import SftStep
from ito_assets.posttraining.fixtures import InstructionPair
from ito_assets.posttraining.losses import sft_loss
from ito_assets.posttraining.optim import adamw, optimizer_step
from ito_assets.posttraining.policy import CausalLM, token_logprobs
from ito_assets.posttraining.vocab import TextCodec
from ito_assets.runtime.worker.batches import IGNORE


@dataclass(frozen=True, kw_only=True)
class SftConfig:
    num_epochs: int = SftStep.model_fields["num_epochs"].default
    learning_rate: float = SftStep.model_fields["learning_rate"].default
    # 16 pairs per step: small enough for many steps over the tiny fixtures on CPU.
    batch_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_epochs < 1 or self.batch_size < 1:
            raise ValueError("num_epochs and batch_size must be >= 1")

    @classmethod
    def from_step(cls, step: SftStep, **runtime) -> "SftConfig":
        return cls(num_epochs=step.num_epochs, learning_rate=step.learning_rate, **runtime)


@dataclass(frozen=True, kw_only=True)
class SftResult:
    losses: tuple[float, ...]  # one per optimizer step
    num_steps: int
    num_response_tokens: int
    wall_seconds: float


def response_batch(
    codec: TextCodec, prompts: Sequence[str], responses: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> tokens (N, T) = bos + prompt + response + eos, right-padded; response_mask (N, T-1), 1
    where the target is a response token or the eos (the model learns where to stop)."""
    rows = [([codec.bos_id] + codec.encode(p), codec.encode(r) + [codec.eos_id]) for p, r in zip(prompts, responses)]
    width = max(len(p) + len(r) for p, r in rows)
    tokens = torch.full((len(rows), width), codec.pad_id, dtype=torch.long)  # (N, T)
    mask = torch.zeros((len(rows), width - 1))  # (N, T-1)
    for i, (p, r) in enumerate(rows):
        tokens[i, : len(p) + len(r)] = torch.tensor(p + r)
        mask[i, len(p) - 1 : len(p) - 1 + len(r)] = 1.0  # target t is tokens[t + 1]
    return tokens, mask


def sft_rows(codec: TextCodec, pairs: Sequence[InstructionPair], sequence_length: int) -> np.ndarray:
    """The pairs as the stage worker's rows, (N, 2, T) int32: inputs (bos + prompt + response,
    right-padded) and targets (the next token where it is a response token or the eos, else -100),
    the same tokens and loss as `response_batch`. A pair longer than T + 1 tokens is refused, not
    cut: a truncated response would teach the model to stop early."""
    rows = np.full((len(pairs), 2, sequence_length), IGNORE, dtype=np.int32)
    rows[:, 0] = codec.pad_id
    for i, pair in enumerate(pairs):
        tokens, mask = response_batch(codec, [pair.prompt], [pair.response])
        width = tokens.shape[1] - 1
        if width > sequence_length:
            raise ValueError(f"pair {i} needs {width} positions; the rows have {sequence_length}")
        rows[i, 0, :width] = tokens[0, :-1].numpy()
        rows[i, 1, :width] = np.where(mask[0].numpy() > 0, tokens[0, 1:].numpy(), IGNORE)
    return rows


def _epoch_batches(pairs: Sequence[InstructionPair], batch_size: int, rng: random.Random):
    order = list(range(len(pairs)))
    rng.shuffle(order)
    for start in range(0, len(order), batch_size):
        yield [pairs[i] for i in order[start : start + batch_size]]


def run_sft(policy: CausalLM, codec: TextCodec, pairs: Sequence[InstructionPair], config: SftConfig,
            on_step: Callable[[float, float], object] | None = None) -> SftResult:
    """Train `policy` in place for `num_epochs` over `pairs` (seeded order); `on_step(seconds,
    loss)` after each optimizer step."""
    if not pairs:
        raise ValueError("pairs must not be empty")
    policy.train()
    optimizer = adamw(policy, learning_rate=config.learning_rate)
    rng, losses, num_tokens, started = random.Random(config.seed), [], 0, time.perf_counter()
    for _ in range(config.num_epochs):
        for batch in _epoch_batches(pairs, config.batch_size, rng):
            step_started = time.perf_counter()
            tokens, mask = response_batch(codec, [p.prompt for p in batch], [p.response for p in batch])
            loss = sft_loss(token_logprobs(policy, tokens), mask)
            optimizer_step(policy, optimizer, loss)
            losses.append(float(loss.detach()))
            num_tokens += int(mask.sum())
            if on_step is not None:
                on_step(time.perf_counter() - step_started, losses[-1])
    return SftResult(
        losses=tuple(losses), num_steps=len(losses), num_response_tokens=num_tokens,
        wall_seconds=time.perf_counter() - started,
    )
