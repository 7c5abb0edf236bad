"""The stage's eval: mean next-token loss (nats per token) on held-out windows.

The same held-out shard, window length and window count for every stage of a run, so that the
stage gates compare like with like. Windows are the first `num_windows` non-overlapping ones:
deterministic, no sampling noise between stages.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn


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
