"""The stage's fixed eval battery, the same for every stage of a run so that the gates compare
like with like:

    heldout_loss   mean next-token loss (nats per token) on the first `num_windows`
                   non-overlapping windows of the held-out shard (deterministic: no sampling noise)
    answer_loss    negative log-likelihood of the eval suite's answers (nats per answer token,
                   pooled over all items) given `Question: ...\\nAnswer:` (the decision job's
                   prompt, `ito_assets.training.evaluation`); the suite the data was
                   decontaminated against

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
    found = {"heldout_loss": heldout_loss(model, battery.heldout, sequence_length=battery.sequence_length,
                                          num_windows=battery.num_windows, on_batch=on_batch)}
    if battery.tokenizer is not None and battery.items:
        found["answer_loss"] = answer_loss(model, battery.tokenizer, battery.items)
        if on_batch is not None:
            on_batch()
    return found


@torch.no_grad()
def heldout_loss(model: nn.Module, tokens: np.ndarray, *, sequence_length: int, num_windows: int,
                 batch_size: int = 16, on_batch: Callable[[], None] | None = None) -> float:
    """`on_batch` is called after every batch (the worker's heartbeat: an eval is not a hang)."""
    t = sequence_length
    available = (len(tokens) - 1) // t
    if available < 1:
        raise ValueError("the held-out shard must hold at least one window of sequence_length + 1 tokens")
    count = min(num_windows, available)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, num_tokens = 0.0, 0
    for first in range(0, count, batch_size):
        rows = [np.asarray(tokens[i * t : i * t + t + 1], dtype=np.int64) for i in range(first, min(count, first + batch_size))]
        batch = torch.from_numpy(np.stack(rows)).to(device)  # (B, T+1)
        loss = model.loss(batch[:, :-1], batch[:, 1:])  # mean over B x T
        total += float(loss) * batch.shape[0] * t
        num_tokens += batch.shape[0] * t
        if on_batch is not None:
            on_batch()
    model.train(was_training)
    return total / num_tokens


def answer_loss(model: nn.Module, tokenizer: Tokenizer, items: Sequence[EvalItem], *, batch_size: int = 32) -> float:
    """-sum log p(answer token | prompt, earlier answer tokens) / number of answer tokens, over
    all items. Prompt and answer are tokenized separately and concatenated, as the decision job
    scores them."""
    if not items:
        raise ValueError("items must not be empty")
    pairs = [(tokenizer.encode(PROMPT.format(question=item.question)).ids, tokenizer.encode(" " + item.answer).ids)
             for item in items]
    was_training = model.training
    logprobs = continuation_logprobs(model, pairs, batch_size)
    model.train(was_training)
    return -sum(sum(lp) for lp in logprobs) / sum(len(lp) for lp in logprobs)
