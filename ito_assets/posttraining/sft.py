"""Supervised fine-tuning on instruction pairs: next-token loss on the response tokens only."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ito_assets.manifest.schema import SftStep
from ito_assets.posttraining.fixtures import InstructionPair
from ito_assets.posttraining.losses import sft_loss
from ito_assets.posttraining.optim import adamw, optimizer_step
from ito_assets.posttraining.policy import CausalLM, gathered_logprobs
from ito_assets.posttraining.vocab import TextCodec
from ito_assets.runtime.worker.batches import IGNORE, BatchPlan, ResumableBatches


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
        return cls(num_epochs=step.num_epochs, learning_rate=step.learning_rate, batch_size=step.batch_size, **runtime)


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


Encoded = tuple[np.ndarray, np.ndarray]  # one answer's (inputs, targets), int32, as long as it needs


def encode_answer(codec: TextCodec, prompt: str, response: str) -> Encoded:
    """bos + prompt + response as inputs; as targets the next token where it is a response token
    or the eos (the model learns where to stop), else -100: `response_batch`'s tokens and loss."""
    prompt_ids = [codec.bos_id, *codec.encode(prompt)]
    tokens = np.asarray(prompt_ids + codec.encode(response) + [codec.eos_id], dtype=np.int32)
    targets = tokens[1:].copy()
    targets[: len(prompt_ids) - 1] = IGNORE
    return tokens[:-1], targets


def fill_rows(rows: np.ndarray, answers: Sequence[Encoded], *, pad_id: int) -> np.ndarray:
    """Write the encoded answers into `rows` (N, 2, T), right-padded; a longer one is refused."""
    rows[:, 0], rows[:, 1] = pad_id, IGNORE
    for i, (inputs, targets) in enumerate(answers):
        if len(inputs) > rows.shape[-1]:
            raise ValueError(f"pair {i} needs {len(inputs)} positions; the rows have {rows.shape[-1]}")
        rows[i, 0, : len(inputs)], rows[i, 1, : len(targets)] = inputs, targets
    return rows


def sft_rows(codec: TextCodec, pairs: Sequence[InstructionPair], sequence_length: int | None = None) -> np.ndarray:
    """The pairs as the stage worker's rows, (N, 2, T) int32: inputs and targets as `encode_answer`
    gives them, T the longest pair's positions unless given. Each pair is encoded once, straight
    into the rows. A pair longer than T positions is refused, not cut: a truncated response would
    teach the model to stop early."""
    answers = [encode_answer(codec, pair.prompt, pair.response) for pair in pairs]
    width = sequence_length if sequence_length is not None else max(len(inputs) for inputs, _ in answers)
    return fill_rows(np.empty((len(answers), 2, width), dtype=np.int32), answers, pad_id=codec.pad_id)


def sft_batches(codec: TextCodec, pairs: Sequence[InstructionPair], config: SftConfig) -> tuple[ResumableBatches, int]:
    """(the pairs' rows as the stage worker reads them, optimizer steps): every pair once an epoch
    in the seeded order, full batches only, so that the loop here and the worker draw the same
    batches. A remainder of fewer than `batch_size` pairs is left out of that epoch."""
    if len(pairs) < config.batch_size:
        raise ValueError(f"{len(pairs)} pairs cannot fill one batch of {config.batch_size}")
    rows = sft_rows(codec, pairs)
    batches = ResumableBatches(rows, BatchPlan(batch_size=config.batch_size, sequence_length=rows.shape[2],
                                               seed=config.seed))
    return batches, config.num_epochs * batches.batches_per_epoch


def run_sft(policy: CausalLM, codec: TextCodec, pairs: Sequence[InstructionPair], config: SftConfig,
            on_step: Callable[[float, float], object] | None = None) -> SftResult:
    """Train `policy` in place for `num_epochs` over `pairs` in one process; `on_step(seconds,
    loss)` after each optimizer step. The stage worker trains the same batches with the same
    optimizer (`on_worker`)."""
    if not pairs:
        raise ValueError("pairs must not be empty")
    batches, num_steps = sft_batches(codec, pairs, config)
    policy.train()
    optimizer = adamw(policy, learning_rate=config.learning_rate)
    losses, num_tokens, started = [], 0, time.perf_counter()
    for _ in range(num_steps):
        step_started = time.perf_counter()
        _, x, y = batches.next_batch()
        mask = y != IGNORE
        loss = sft_loss(gathered_logprobs(policy(x).float(), y.clamp(min=0)), mask)
        optimizer_step(policy, optimizer, loss)
        losses.append(float(loss.detach()))
        num_tokens += int(mask.sum())
        if on_step is not None:
            on_step(time.perf_counter() - step_started, losses[-1])
    return SftResult(
        losses=tuple(losses), num_steps=len(losses), num_response_tokens=num_tokens,
        wall_seconds=time.perf_counter() - started,
    )
