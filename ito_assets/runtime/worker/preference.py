"""DPO as the worker's objective (`WorkerConfig.preference`): each micro-batch of pair rows takes
`posttraining.losses.pair_loss` against the reference's log-probabilities read beside its rows.
The loss is a mean over pairs, so the layout's micro-batches (divided by their number) and the
data-parallel ranks (averaged by DDP or FSDP2) give the whole batch's, as for windows.

Beside the loss it counts, over the step's micro-batches, the pairs, those whose implicit reward
margin is positive, and the margins' sum: the step's accuracy and mean margin, summed over the
ranks when asked (`take_metrics`), as the in-process loop reports them."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.losses import pair_loss
from ito_assets.runtime.stage.config import PreferenceObjective


class Preference(nn.Module):
    def __init__(self, model: nn.Module, objective: PreferenceObjective):
        super().__init__()
        self.model = model
        self.objective = objective
        self.counts = torch.zeros(3, dtype=torch.float64)  # pairs, positive margins, sum of margins

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """tokens, targets (b, 2, T); reference (b, 2) -> the micro-batch's mean loss over its pairs."""
        result = pair_loss(self.model, tokens, targets, reference, beta=self.objective.beta,
                           label_smoothing=self.objective.label_smoothing, rpo_alpha=self.objective.rpo_alpha)
        margins = result.margins.double().cpu()
        self.counts += torch.stack([torch.tensor(float(len(margins)), dtype=torch.float64),
                                    (margins > 0).double().sum(), margins.sum()])
        return result.loss

    def take_metrics(self, device: torch.device) -> dict[str, float]:
        """The step's accuracy and mean margin over every rank's pairs; the counts start again.
        A collective when the group has several ranks: every rank calls it after every step."""
        counts = self.counts.to(device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        self.counts = torch.zeros(3, dtype=torch.float64)
        pairs, positive, margins = (float(c) for c in counts.cpu())
        return {"accuracy": positive / pairs, "margin": margins / pairs} if pairs else {}


def read_reference(path: Path, num_rows: int) -> torch.Tensor:
    """The reference log-probabilities, one (chosen, rejected) per row of the shard, float32.
    Refused unless there is one per row, each finite and at most 0 (a log-probability): a file
    of another stage or another shard would otherwise train on silently."""
    return checked_reference(np.load(path), num_rows)


def compute_reference(reference: nn.Module, rows: np.ndarray, *, rank: int, world_size: int,
                      on_pass: Callable[[], object] | None = None) -> torch.Tensor:
    """The reference log-probabilities of every row, computed on the reference's device: each
    rank a share of the pairs (`dpo.reference_logprobs`), summed over the ranks (the others' rows
    are 0 on each, so the sum is exact). A collective on several ranks. Checked as a file is."""
    from ito_assets.posttraining.dpo import reference_logprobs  # the pairs' stack, for DPO's workers only

    found = torch.from_numpy(reference_logprobs(reference, rows, rank=rank, world_size=world_size, on_pass=on_pass))
    if world_size > 1:
        device = next(reference.parameters()).device
        summed = found.to(device)
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        found = summed.cpu()
    return checked_reference(found.numpy(), len(rows))


def checked_reference(reference: np.ndarray, num_rows: int) -> torch.Tensor:
    """POSTTRAINING_DATA_INVALID unless one (chosen, rejected) log-probability per row, each finite
    and at most 0: read, the table of another stage or shard; computed, a start whose answers'
    log-probabilities overflow. Neither changes on a restart."""
    if reference.shape != (num_rows, 2):
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID,
                       f"the reference log-probabilities must have shape ({num_rows}, 2), not {reference.shape}")
    bad = ~(np.isfinite(reference) & (reference <= 0))
    if bad.any():
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, "the reference log-probabilities must be finite and at "
                       f"most 0; {int(bad.any(axis=1).sum())} of {num_rows} pairs are not")
    return torch.from_numpy(np.asarray(reference, dtype=np.float32))
