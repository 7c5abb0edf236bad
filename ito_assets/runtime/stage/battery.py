"""The stage's fixed eval battery, the same for every stage of a run so that the gates compare
like with like:

    heldout_loss   mean next-token loss (nats per token) on the first `num_windows`
                   non-overlapping windows of the held-out shard (deterministic: no sampling noise)
    answer_loss    negative log-likelihood of the eval suite's answers (nats per answer token,
                   pooled over all items) given `Question: ...\\nAnswer:` (the decision job's
                   prompt, `ito_assets.training.evaluation`); the suite the data was
                   decontaminated against

Each metric is pooled over units (a window, an item): the battery keeps every unit's loss sum and
token count (`Units`), so that a gate can bootstrap the eval's own sampling noise over the same
units of two models (`runtime.stage.noise`).

Both are continuous and lower is better: at the tiny scale accuracy sits at chance, while answer
log-likelihood moves with training (DataDecide, Magnusson et al. 2025, found the continuous
likelihood metrics the most predictive at small scale). Pooled, not a mean of per-item means: on
the fixture curriculum the per-item mean, dominated by one- and two-token answers, rose and fell by
~0.1 nats between stages while the pooled loss fell at every stage (docs/training-runtime.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from ito_assets.evals.suite import EvalItem
from ito_assets.runtime.stage.noise import Units
from ito_assets.training.evaluation import PROMPT, continuation_logprobs


@dataclass(frozen=True, kw_only=True)
class Battery:
    heldout: np.ndarray  # the held-out token shard
    sequence_length: int
    num_windows: int
    tokenizer: Tokenizer | None = None  # with `items`: the answer loss joins the battery
    items: tuple[EvalItem, ...] = ()


def run_battery(model: nn.Module, battery: Battery, on_batch: Callable[[], None] | None = None) -> dict[str, float]:
    """Every metric of the battery, by name; `on_batch` is the worker's heartbeat."""
    return {name: units.pooled for name, units in battery_units(model, battery, on_batch).items()}


def battery_units(model: nn.Module, battery: Battery, on_batch: Callable[[], None] | None = None) -> dict[str, Units]:
    """Every metric of the battery as its units, by name."""
    found = {"heldout_loss": heldout_units(model, battery.heldout, sequence_length=battery.sequence_length,
                                           num_windows=battery.num_windows, on_batch=on_batch)}
    if battery.tokenizer is not None and battery.items:
        found["answer_loss"] = answer_units(model, battery.tokenizer, battery.items)
        if on_batch is not None:
            on_batch()
    return found


def heldout_loss(model: nn.Module, tokens: np.ndarray, *, sequence_length: int, num_windows: int,
                 batch_size: int = 16, on_batch: Callable[[], None] | None = None) -> float:
    return heldout_units(model, tokens, sequence_length=sequence_length, num_windows=num_windows,
                         batch_size=batch_size, on_batch=on_batch).pooled


@torch.no_grad()
def heldout_units(model: nn.Module, tokens: np.ndarray, *, sequence_length: int, num_windows: int,
                  batch_size: int = 16, on_batch: Callable[[], None] | None = None) -> Units:
    """One unit per window, each scored alone (its own loss sum is what the bootstrap resamples);
    `on_batch` is called after every `batch_size` windows and after the last (the worker's
    heartbeat: an eval is not a hang)."""
    t = sequence_length
    available = (len(tokens) - 1) // t
    if available < 1:
        raise ValueError("the held-out shard must hold at least one window of sequence_length + 1 tokens")
    count = min(num_windows, available)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    losses = []
    for i in range(count):
        row = torch.from_numpy(np.asarray(tokens[i * t : i * t + t + 1], dtype=np.int64)).to(device)[None]  # (1, T+1)
        losses.append(float(model.loss(row[:, :-1], row[:, 1:])) * t)  # the window's mean, back to its sum
        if on_batch is not None and ((i + 1) % batch_size == 0 or i + 1 == count):
            on_batch()
    model.train(was_training)
    return Units(loss=tuple(losses), tokens=(t,) * count)


def answer_loss(model: nn.Module, tokenizer: Tokenizer, items: Sequence[EvalItem], *, batch_size: int = 32) -> float:
    return answer_units(model, tokenizer, items, batch_size=batch_size).pooled


def answer_units(model: nn.Module, tokenizer: Tokenizer, items: Sequence[EvalItem], *, batch_size: int = 32) -> Units:
    """One unit per item: -sum log p(answer token | prompt, earlier answer tokens) and its answer
    tokens. Prompt and answer are tokenized separately and concatenated, as the decision job
    scores them. An answer longer than the model's window is scored on its first `max_seq_len`
    tokens: the window keeps the sequence's last max_seq_len + 1 tokens, so a longer answer would
    otherwise be scored on an erratic fragment of its end (one token for an answer one token too long)."""
    if not items:
        raise ValueError("items must not be empty")
    window = model.config.max_seq_len
    pairs = [(tokenizer.encode(PROMPT.format(question=item.question)).ids, _answer_ids(tokenizer, item)[:window])
             for item in items]
    was_training = model.training
    logprobs = continuation_logprobs(model, pairs, batch_size)
    model.train(was_training)
    return Units(loss=tuple(-sum(lp) for lp in logprobs), tokens=tuple(len(lp) for lp in logprobs))


def _answer_ids(tokenizer: Tokenizer, item: EvalItem) -> list[int]:
    ids = tokenizer.encode(" " + item.answer).ids
    if not ids:  # a unit of no tokens has no loss per token: it would be 0/0 in the pooled metric
        raise ValueError(f"eval item {item.id!r}: its answer encodes to no tokens")
    return ids
