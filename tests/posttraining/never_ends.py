"""The seeded policy with its eos forbidden, for the tests of completion lengths."""

from __future__ import annotations

import torch


class NeverEnds(torch.nn.Module):
    """The seeded model with its eos forbidden: every completion runs to max_new_tokens."""

    def __init__(self, model, eos_id: int):
        super().__init__()
        self.model, self.eos_id = model, eos_id

    def forward(self, tokens):
        logits = self.model(tokens).clone()
        logits[..., self.eos_id] = float("-inf")
        return logits
