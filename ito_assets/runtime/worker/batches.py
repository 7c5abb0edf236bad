"""A data loader whose position is one integer, so that a checkpoint can record it exactly.

Batch `k` of a stage is a pure function of (tokens, seed, k): epoch `k // batches_per_epoch`
visits every window once in an order drawn from `numpy.random.default_rng([seed, epoch])`, and
batch `k` takes its slice of that order. Resuming at position `k` therefore yields exactly the
batches an uninterrupted run would have seen, with no generator state to save. Under data
parallelism each rank takes its own `batch_size / world_size` rows of the global batch.

A shard is either a token stream (1-D: pretraining's windows of `sequence_length + 1` tokens) or a
set of rows with their targets (3-D, (N, 2, T): inputs and targets, a target of -100 where no loss
is taken, as supervised fine-tuning's prompt and padding; see `ito_assets.posttraining.sft.sft_rows`),
or rows of S sequences that train together (4-D, (N, S, 2, T): DPO's chosen and rejected answers,
`ito_assets.posttraining.dpo.dpo_rows`), never split across ranks or micro-batches. Rows are visited
in the same seeded epoch order as windows. A batch of rows is cut after the last position where any
of its rows takes a loss: the rows are right-padded to the longest pair of the stage, and under a
causal model the positions up to that one do not depend on the padding after it, so computing it
would change nothing but the step's time.

Skipped ranges (an approved loss-spike proposal) advance the position past the offending global
batches, as PaLM did after a spike (Chowdhery et al. 2022, section 5.1: restart ~100 steps before
the spike and skip 200-500 batches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch


def window_count(tokens: np.ndarray, sequence_length: int) -> int:
    """The sequences a shard holds: its rows, or a stream's windows of sequence_length + 1 tokens.
    A global batch larger than this cannot be drawn."""
    return len(tokens) if tokens.ndim > 1 else max(0, (len(tokens) - 1) // sequence_length)


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    batch_size: int  # global batch, in sequences
    sequence_length: int
    seed: int
    rank: int = 0
    world_size: int = 1
    skip_ranges: tuple[tuple[int, int], ...] = ()  # half-open [first, end) global batch positions
    # A batch of rows is cut to a multiple of this many positions: tensor parallelism's sequence
    # sharding splits the positions evenly over its ranks.
    length_multiple: int = 1

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.sequence_length < 1:
            raise ValueError("batch_size and sequence_length must be positive")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError("rank must lie in [0, world_size)")
        if self.batch_size % self.world_size:
            raise ValueError("batch_size must be divisible by world_size")
        if self.length_multiple < 1:
            raise ValueError("length_multiple must be positive")
        if any(first < 0 or end <= first for first, end in self.skip_ranges):
            raise ValueError("skip_ranges must be non-empty half-open ranges of positions >= 0")

    @property
    def rows_per_rank(self) -> int:
        return self.batch_size // self.world_size


# F.cross_entropy's default ignore_index: a target that takes no loss.
IGNORE = -100


class Loader(Protocol):
    """What the worker's loop reads batches from: `ResumableBatches` over a shard, or GRPO's
    `ito_assets.posttraining.rollout_source.RolloutSource` over a generator's groups."""

    position: int  # what a checkpoint records: the next batch's
    has_rows: bool  # targets may be -100: a step weighs every target of the global batch once

    def next_batch(self) -> tuple[int, torch.Tensor, torch.Tensor]: ...

    def tokens_at(self, position: int) -> int: ...


class ResumableBatches:
    """`next_batch()` returns (position, x, y) with x, y of shape (B / world, T), int64, or
    (B / world, S, T) for rows of S sequences."""

    def __init__(self, tokens: np.ndarray, plan: BatchPlan, *, position: int = 0):
        self.tokens = tokens
        self.plan = plan
        if tokens.ndim not in (1, 3, 4):
            raise ValueError(f"a shard is a token stream (1-D) or rows with targets ((N, 2, T) or (N, S, 2, T)), "
                             f"not {tokens.ndim}-D")
        self.has_rows = tokens.ndim > 1
        if self.has_rows:
            _check_rows(tokens, plan.sequence_length)
        self.num_windows = window_count(tokens, plan.sequence_length)
        if self.num_windows < plan.batch_size:
            raise ValueError("tokens must hold at least batch_size windows of sequence_length + 1 (or rows)")
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

    def rows_at(self, position: int) -> np.ndarray:
        """This rank's windows (or rows) of the global batch at `position`, in its order: what a
        side table indexed like the rows (DPO's reference log-probabilities) is read at."""
        epoch, index = divmod(position, self.batches_per_epoch)
        first = index * self.plan.batch_size + self.plan.rank * self.plan.rows_per_rank
        return self._order(epoch)[first : first + self.plan.rows_per_rank]

    def next_batch(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        self._skip()
        position = self.position
        chosen = self.rows_at(position)
        self.position = position + 1
        if self.has_rows:
            rows = np.asarray(self.tokens[chosen], dtype=np.int64)  # (B/W, [S,] 2, T)
            rows = torch.from_numpy(np.ascontiguousarray(rows[..., :cut_length(rows, self.plan.length_multiple)]))
            return position, rows.select(-2, 0), rows.select(-2, 1)
        t = self.plan.sequence_length
        starts = chosen * t
        rows = np.stack([np.asarray(self.tokens[s : s + t + 1], dtype=np.int64) for s in starts])  # (B/W, T+1)
        batch = torch.from_numpy(rows)
        return position, batch[:, :-1], batch[:, 1:]


    def tokens_at(self, position: int) -> int:
        """The tokens the global batch at `position` trains on, every rank's share: its windows'
        batch_size x sequence_length, or each row's (each sequence's) inputs up to its last
        target, since the padding after a row's end is computed but is not data."""
        b, t = self.plan.batch_size, self.plan.sequence_length
        if not self.has_rows:
            return b * t
        epoch, index = divmod(position, self.batches_per_epoch)
        rows = np.sort(self._order(epoch)[index * b : (index + 1) * b])
        taken = (np.asarray(self.tokens[rows])[..., 1, :] != IGNORE).reshape(-1, t)  # (B [x S], T); each has a target
        return int((t - np.argmax(taken[:, ::-1], axis=1)).sum())


def cut_length(rows: np.ndarray, multiple: int = 1) -> int:
    """The positions a batch of `rows` ((..., 2, T)) keeps: up to the last one where any row has a
    target, rounded up to a multiple of `multiple`, at most T."""
    t = rows.shape[-1]
    taken = (rows[..., 1, :] != IGNORE).reshape(-1, t).any(axis=0)
    end = int(t - np.argmax(taken[::-1])) if taken.any() else t
    return min(t, -(-end // multiple) * multiple)


def _check_rows(rows: np.ndarray, sequence_length: int) -> None:
    """A rows shard must match the stage's sequence length, and every row (every sequence of a
    row) must take a loss somewhere: a micro-batch of rows without a target would average nothing
    (NaN), and a DPO answer without one has no likelihood. Read in chunks, so that a memory-mapped
    shard of any size is checked in bounded memory."""
    if rows.shape[-2] != 2 or rows.shape[-1] != sequence_length:
        shape = "(N, 2, T)" if rows.ndim == 3 else "(N, S, 2, T)"
        raise ValueError(f"rows must have shape {shape} with T = {sequence_length}, not {tuple(rows.shape)}")
    for first in range(0, len(rows), _CHECK_ROWS):
        if not bool((np.asarray(rows[first : first + _CHECK_ROWS])[..., 1, :] != IGNORE).any(axis=-1).all()):
            raise ValueError("every row must have at least one target other than -100")


# Rows read at a time by the check: 4,096 rows of 4,096 int32 targets are 64 MiB.
_CHECK_ROWS = 4096
