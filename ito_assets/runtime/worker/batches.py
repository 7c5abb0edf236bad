"""A data loader whose position is one integer, so that a checkpoint can record it exactly.

Batch `k` of a stage is a pure function of (tokens, seed, k): epoch `k // batches_per_epoch`
visits every window once in an order drawn from `numpy.random.default_rng([seed, epoch])`, and
batch `k` takes its slice of that order. Resuming at position `k` therefore yields exactly the
batches an uninterrupted run would have seen, with no generator state to save. Under data
parallelism each rank takes its own `batch_size / world_size` rows of the global batch.

Skipped ranges (an approved loss-spike proposal) advance the position past the offending global
batches, as PaLM did after a spike (Chowdhery et al. 2022, section 5.1: restart ~100 steps before
the spike and skip 200-500 batches).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    batch_size: int  # global batch, in sequences
    sequence_length: int
    seed: int
    rank: int = 0
    world_size: int = 1
    skip_ranges: tuple[tuple[int, int], ...] = ()  # half-open [first, end) global batch positions

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.sequence_length < 1:
            raise ValueError("batch_size and sequence_length must be positive")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError("rank must lie in [0, world_size)")
        if self.batch_size % self.world_size:
            raise ValueError("batch_size must be divisible by world_size")
        if any(first < 0 or end <= first for first, end in self.skip_ranges):
            raise ValueError("skip_ranges must be non-empty half-open ranges of positions >= 0")

    @property
    def rows_per_rank(self) -> int:
        return self.batch_size // self.world_size


class ResumableBatches:
    """`next_batch()` returns (position, x, y) with x, y of shape (B / world, T), int64."""

    def __init__(self, tokens: np.ndarray, plan: BatchPlan, *, position: int = 0):
        self.tokens = tokens
        self.plan = plan
        self.num_windows = max(0, (len(tokens) - 1) // plan.sequence_length)
        if self.num_windows < plan.batch_size:
            raise ValueError("tokens must hold at least batch_size windows of sequence_length + 1")
        self.batches_per_epoch = self.num_windows // plan.batch_size
        self.position = position
        self._epoch_order: tuple[int, np.ndarray] | None = None

    def _order(self, epoch: int) -> np.ndarray:
        if self._epoch_order is None or self._epoch_order[0] != epoch:
            self._epoch_order = (epoch, np.random.default_rng([self.plan.seed, epoch]).permutation(self.num_windows))
        return self._epoch_order[1]

    def _skip(self) -> None:
        for first, end in self.plan.skip_ranges:
            if first <= self.position < end:
                self.position = end

    def next_batch(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        self._skip()
        position = self.position
        epoch, index = divmod(position, self.batches_per_epoch)
        b, t = self.plan.batch_size, self.plan.sequence_length
        first = index * b + self.plan.rank * self.plan.rows_per_rank
        starts = self._order(epoch)[first : first + self.plan.rows_per_rank] * t
        rows = np.stack([np.asarray(self.tokens[s : s + t + 1], dtype=np.int64) for s in starts])  # (B/W, T+1)
        batch = torch.from_numpy(rows)
        self.position = position + 1
        return position, batch[:, :-1], batch[:, 1:]
