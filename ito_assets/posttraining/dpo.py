"""Direct preference optimisation on preference pairs, against a frozen reference policy.

The pairs become rows of two sequences, chosen then rejected (`dpo_rows`), which the stage
worker's loader draws whole (`dpo_batches`); the reference's log-probability of every answer is
computed once, before training (`reference_logprobs`: here before the loop, on the worker at its
start on its devices), and read beside each batch's rows. The in-process loop here and the worker
(`on_worker`) train the same batches with the same loss.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ito_assets.manifest.schema import DpoStep
from ito_assets.posttraining.fixtures import PreferencePair
from ito_assets.posttraining.losses import answer_logprobs, pair_loss
from ito_assets.posttraining.optim import adamw, optimizer_step
from ito_assets.posttraining.policy import CausalLM
from ito_assets.posttraining.reference_pass import reference_chunk
from ito_assets.posttraining.sft import encode_answer, fill_rows
from ito_assets.posttraining.vocab import TextCodec
from ito_assets.runtime.worker.batches import BatchPlan, ResumableBatches
from ito_assets.training.model import DecoderLM

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
                   learning_rate=step.learning_rate, batch_size=step.batch_size, **runtime)


@dataclass(frozen=True, kw_only=True)
class DpoResult:
    losses: tuple[float, ...]  # one per optimizer step
    accuracies: tuple[float, ...]  # share of pairs with a positive implicit-reward margin, per step
    mean_margin: float  # of the last step: beta x log-ratio margin (the implicit reward gap)
    num_steps: int
    wall_seconds: float


def dpo_rows(codec: TextCodec, pairs: Sequence[PreferencePair]) -> np.ndarray:
    """The pairs as the stage worker's rows, (N, 2, 2, T) int32: each pair's chosen and rejected
    answer as SFT's rows are (inputs; targets on the answer and its eos, -100 elsewhere), T the
    longest answer's positions. Each answer is encoded once, straight into the rows."""
    chosen = [encode_answer(codec, p.prompt, p.chosen) for p in pairs]
    rejected = [encode_answer(codec, p.prompt, p.rejected) for p in pairs]
    width = max(len(inputs) for inputs, _ in chosen + rejected)
    rows = np.empty((len(pairs), 2, 2, width), dtype=np.int32)
    fill_rows(rows[:, 0], chosen, pad_id=codec.pad_id)
    fill_rows(rows[:, 1], rejected, pad_id=codec.pad_id)
    return rows


def dpo_batches(codec: TextCodec, pairs: Sequence[PreferencePair], config: DpoConfig) -> tuple[ResumableBatches, int]:
    """(the pairs' rows as the stage worker reads them, optimizer steps): every pair once an epoch
    in the seeded order, full batches only; a remainder of fewer than `batch_size` pairs is left
    out of that epoch, and fewer pairs than one batch are refused."""
    if len(pairs) < config.batch_size:
        raise ValueError(f"{len(pairs)} pairs cannot fill one batch of {config.batch_size}")
    rows = dpo_rows(codec, pairs)
    batches = ResumableBatches(rows, BatchPlan(batch_size=config.batch_size, sequence_length=rows.shape[-1],
                                               seed=config.seed))
    return batches, config.num_epochs * batches.batches_per_epoch


@torch.no_grad()
def reference_logprobs(reference: DecoderLM, rows: np.ndarray, *, rank: int = 0, world_size: int = 1,
                       on_pass: Callable[[], object] | None = None) -> np.ndarray:
    """Every pair's answers' summed log-probability under the frozen reference, (N, 2) float32:
    computed once, read beside each batch (the reference never changes, so a second forward pass
    a step buys nothing), on the reference's device. Of `world_size` ranks, `rank` computes every
    `world_size`-th pass of pairs and leaves the others' rows at 0, for a sum over the ranks.
    `on_pass` after each pass (the worker's heartbeat: a long pass is not a hung start-up)."""
    reference.eval()
    device = next(reference.parameters()).device
    found = np.zeros((len(rows), 2), dtype=np.float32)
    pairs_per_pass = reference_chunk(rows.shape[-1], reference.config.vocab_size)
    for first in range(rank * pairs_per_pass, len(rows), world_size * pairs_per_pass):
        chunk = torch.from_numpy(np.asarray(rows[first : first + pairs_per_pass], dtype=np.int64)).to(device)
        sums, _ = answer_logprobs(reference, chunk[:, :, 0], chunk[:, :, 1])
        found[first : first + len(chunk)] = sums.float().cpu().numpy()
        if on_pass is not None:
            on_pass()
    return found


def run_dpo(
    policy: CausalLM, reference: CausalLM, codec: TextCodec, pairs: Sequence[PreferencePair], config: DpoConfig,
    on_step: Callable[[float, float], object] | None = None,
) -> DpoResult:
    """Train `policy` in place in this process; `reference` is only read (no gradient);
    `on_step(seconds, loss)` after each optimizer step."""
    if not pairs:
        raise ValueError("pairs must not be empty")
    batches, num_steps = dpo_batches(codec, pairs, config)
    references = torch.from_numpy(reference_logprobs(reference, batches.tokens))
    policy.train()
    optimizer = adamw(policy, learning_rate=config.learning_rate)
    losses, accuracies, margin, started = [], [], 0.0, time.perf_counter()
    for _ in range(num_steps):
        step_started = time.perf_counter()
        position, x, y = batches.next_batch()
        result = pair_loss(policy, x, y, references[batches.rows_at(position)], beta=config.beta,
                           label_smoothing=config.label_smoothing, rpo_alpha=config.rpo_alpha)
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
