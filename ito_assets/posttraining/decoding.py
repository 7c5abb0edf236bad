"""Autoregressive sampling from a policy, one prompt at a time, G completions in parallel.

The G rows of a group share one prompt, so they have one length: no padding and no attention
mask are needed while decoding. Rows that produced eos keep decoding into a pad that is thrown
away (the tiny models have no KV cache; each step is one forward over the whole prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ito_assets.posttraining.policy import CausalLM
from ito_assets.posttraining.vocab import TextCodec


@dataclass(frozen=True, kw_only=True)
class Completion:
    ids: tuple[int, ...]  # eos included when generated
    logprobs: tuple[float, ...]  # log pi(token) at the sampling temperature, one per id
    truncated: bool  # no eos within max_new_tokens

    def text(self, codec: TextCodec) -> str:
        return codec.decode([i for i in self.ids if i != codec.eos_id])


def encode_prompt(codec: TextCodec, prompt: str) -> list[int]:
    return [codec.bos_id] + codec.encode(prompt)


@torch.no_grad()
def sample(
    policy: CausalLM,
    prompt_ids: list[int],
    *,
    num_samples: int,
    max_new_tokens: int,
    eos_id: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> list[Completion]:
    """num_samples completions of one prompt; temperature 0 decodes greedily."""
    tokens = torch.tensor([prompt_ids] * num_samples, dtype=torch.long)  # (G, P)
    picked, logps = [], []
    done = torch.zeros(num_samples, dtype=torch.bool)  # (G,)
    for _ in range(max_new_tokens):
        logits = policy(tokens)[:, -1, :].float()  # (G, V)
        log_probs = torch.log_softmax(logits / max(temperature, 1e-8), dim=-1)  # (G, V)
        if temperature == 0:
            nxt = logits.argmax(dim=-1)  # (G,)
        else:
            nxt = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(1)  # (G,)
        picked.append(nxt)
        logps.append(log_probs.gather(1, nxt.unsqueeze(1)).squeeze(1))
        tokens = torch.cat([tokens, nxt.unsqueeze(1)], dim=1)  # (G, P + t + 1)
        done |= nxt == eos_id
        if bool(done.all()):
            break
    return [_cut(torch.stack(picked)[:, g], torch.stack(logps)[:, g], eos_id) for g in range(num_samples)]


def _cut(ids: torch.Tensor, logps: torch.Tensor, eos_id: int) -> Completion:
    """ids, logps (steps,) of one row -> the completion up to and including its first eos."""
    hits = (ids == eos_id).nonzero()
    end = int(hits[0]) + 1 if len(hits) else len(ids)
    return Completion(ids=tuple(ids[:end].tolist()), logprobs=tuple(logps[:end].tolist()), truncated=not len(hits))
