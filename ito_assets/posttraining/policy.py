"""What post-training needs of a model, and the per-token log-probabilities every loss starts from.

Any module mapping token ids (B, T) to logits (B, T, V) is a policy: `ito_assets.training.model.
DecoderLM` is one. A policy that also has `new_cache(capacity)` takes that cache as its forward's
`cache=` keyword, and decoding then feeds it one token a step (decoding.py). Log-probabilities are
taken in float32 whatever the model's dtype, and at the sampling temperature, so that the
trainer's and the generator's numbers agree.
"""

from __future__ import annotations

from typing import Protocol

import torch


class CausalLM(Protocol):
    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) int64 -> logits (B, T, V)."""
        ...

    def parameters(self): ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict, strict: bool = True): ...


def token_logprobs(policy: CausalLM, tokens: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """log pi(tokens[:, t+1] | tokens[:, :t+1]) for every position: (B, T) -> (B, T - 1)."""
    logits = policy(tokens[:, :-1]).float() / temperature  # (B, T-1, V)
    return gathered_logprobs(logits, tokens[:, 1:])


def gathered_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits (B, L, V), targets (B, L) -> log-softmax at the targets (B, L)."""
    # log_softmax then gather: memory O(B L V) once; the logsumexp form saves one (B, L, V) copy.
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is 1, over every element at once (token-level averaging);
    0 when the mask is empty (a batch of truncated samples contributes no gradient)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return (values * mask.to(values.dtype)).sum(dim=dim)
