"""Autoregressive sampling from a policy: G completions of one prompt in parallel, or of several
prompts of one length at once; at temperature 0 the one greedy decoder (the pretraining eval
battery's continuations are decoded here too, `ito_assets.training.evaluation.greedy_continuation`).

The rows of a batch share one prompt length, so no padding and no attention mask are needed while
decoding. Rows that produced eos keep decoding into a pad that is thrown away. A policy with a KV
cache (`new_cache`, as `DecoderLM` has) reads each prompt once and then feeds one token a step;
any other, or one whose window would have to slide (`max_context`), is fed the whole prefix each
step. Both give the same tokens up to float rounding.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from ito_assets.posttraining.policy import CausalLM
from ito_assets.posttraining.vocab import TextCodec


@dataclass(frozen=True, kw_only=True)
class Completion:
    ids: tuple[int, ...]  # eos (or the stop id that ended it) included when generated
    logprobs: tuple[float, ...]  # log pi(token) at the sampling temperature, one per id
    truncated: bool  # no eos or stop id within max_new_tokens

    def text(self, codec: TextCodec) -> str:
        return codec.decode([i for i in self.ids if i != codec.eos_id])


def encode_prompt(codec: TextCodec, prompt: str) -> list[int]:
    return [codec.bos_id] + codec.encode(prompt)


def sample(policy: CausalLM, prompt_ids: list[int], **options) -> list[Completion]:
    """The completions of one prompt: `sample_prompts` with a single prompt, its options alike."""
    [completions] = sample_prompts(policy, [prompt_ids], **options)
    return completions


@torch.no_grad()
def sample_prompts(
    policy: CausalLM,
    prompts: Sequence[list[int]],
    *,
    num_samples: int,
    max_new_tokens: int,
    eos_id: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    stop_ids: Collection[int] = (),
    max_context: int | None = None,
) -> list[list[Completion]]:
    """num_samples completions of each prompt, the prompts of one length decoded together in one
    batch of len(prompts) x num_samples rows (one forward per new token for all of them); returns
    each prompt's completions, in order. Temperature 0 decodes greedily. A completion ends at its
    first eos or `stop_ids` token; `max_context` feeds the model only the last that many tokens (a
    model with a fixed context length)."""
    if not prompts or len({len(p) for p in prompts}) != 1:
        raise ValueError("prompts must be one or more of one length")
    stops = torch.tensor(sorted({eos_id, *stop_ids}), dtype=torch.long)
    prompt = torch.tensor(prompts, dtype=torch.long)  # (N, P)
    tokens = prompt.repeat_interleave(num_samples, dim=0)  # (N G, P)
    # The positions fed: the prompt and every token but the last (sampled from the last logits).
    cache = _cache(policy, prompt.shape[1] + max_new_tokens - 1, max_context)
    if cache is not None:  # each prompt read once, its keys and values copied to its samples' rows
        last = policy(prompt, cache=cache)[:, -1, :].repeat_interleave(num_samples, dim=0)  # (N G, V)
        cache.repeat_rows(num_samples)
    picked, logps = [], []
    done = torch.zeros(len(tokens), dtype=torch.bool)  # (N G,)
    for step in range(max_new_tokens):
        if cache is None:
            window = tokens if max_context is None else tokens[:, -max_context:]
            last = policy(window)[:, -1, :]
        elif step:
            last = policy(picked[-1].unsqueeze(1), cache=cache)[:, -1, :]  # the newest token alone
        logits = last.float()  # (N G, V)
        log_probs = torch.log_softmax(logits / max(temperature, 1e-8), dim=-1)  # (N G, V)
        if temperature == 0:
            nxt = logits.argmax(dim=-1)  # (N G,)
        else:
            nxt = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(1)  # (N G,)
        picked.append(nxt)
        logps.append(log_probs.gather(1, nxt.unsqueeze(1)).squeeze(1))
        if cache is None:
            tokens = torch.cat([tokens, nxt.unsqueeze(1)], dim=1)  # (N G, P + t + 1)
        done |= torch.isin(nxt, stops)
        if bool(done.all()):
            break
    ids, lps = torch.stack(picked, dim=1), torch.stack(logps, dim=1)  # (N G, steps)
    rows = [_cut(ids[r], lps[r], stops) for r in range(len(ids))]
    return [rows[i * num_samples : (i + 1) * num_samples] for i in range(len(prompts))]


def _cache(policy: CausalLM, positions: int, max_context: int | None):
    """A KV cache for `positions`, or None where the policy has none or its window would slide
    (a sliding window moves every position, which a cache cannot follow)."""
    new_cache = getattr(policy, "new_cache", None)
    if new_cache is None or (max_context is not None and positions > max_context):
        return None
    return new_cache(positions)


def _cut(ids: torch.Tensor, logps: torch.Tensor, stops: torch.Tensor) -> Completion:
    """ids, logps (steps,) of one row -> the completion up to and including its first stop."""
    hits = torch.isin(ids, stops).nonzero()
    end = int(hits[0]) + 1 if len(hits) else len(ids)
    return Completion(ids=tuple(ids[:end].tolist()), logprobs=tuple(logps[:end].tolist()), truncated=not len(hits))
