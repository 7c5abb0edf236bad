"""The one decoder: greedy at temperature 0, sampled otherwise; the pretraining eval battery's
greedy continuations are decoded by it too."""

from __future__ import annotations

import types

import pytest
import torch

from ito_assets.posttraining.decoding import sample, sample_prompts
from ito_assets.training import evaluation

VOCAB = 8


class Counter(torch.nn.Module):
    """Predicts last token + 1 (mod VOCAB), and records how many tokens each call was shown."""

    def __init__(self, max_seq_len: int = 1024) -> None:
        super().__init__()
        self.config = types.SimpleNamespace(max_seq_len=max_seq_len)
        self.seen: list[int] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.seen.append(tokens.shape[1])
        nxt = (tokens + 1) % VOCAB  # (B, T)
        return torch.nn.functional.one_hot(nxt, VOCAB).float() * 10.0  # (B, T, V)


def test_greedy_follows_the_argmax_and_ends_at_the_first_stop_included():
    [done] = sample(Counter(), [2], num_samples=1, max_new_tokens=10, eos_id=7, temperature=0)
    assert done.ids == (3, 4, 5, 6, 7) and not done.truncated
    assert all(lp == 0.0 for lp in done.logprobs)  # a point mass at temperature 0
    [early] = sample(Counter(), [2], num_samples=1, max_new_tokens=10, eos_id=7, stop_ids={5}, temperature=0)
    assert early.ids == (3, 4, 5) and not early.truncated
    [cut] = sample(Counter(), [2], num_samples=1, max_new_tokens=2, eos_id=7, temperature=0)
    assert cut.ids == (3, 4) and cut.truncated


def test_max_context_shows_the_model_only_the_last_tokens():
    model = Counter()
    sample(model, [0, 1, 2], num_samples=2, max_new_tokens=4, eos_id=7, temperature=0, max_context=4)
    assert model.seen == [3, 4, 4, 4]
    unbounded = Counter()
    sample(unbounded, [0, 1, 2], num_samples=2, max_new_tokens=4, eos_id=7, temperature=0)
    assert unbounded.seen == [3, 4, 5, 6]


def test_sampling_is_seeded():
    def draw(seed: int):
        generator = torch.Generator().manual_seed(seed)
        return sample(Counter(), [1], num_samples=3, max_new_tokens=5, eos_id=7, temperature=5.0, generator=generator)

    assert draw(0) == draw(0)


class _Tokenizer:
    """Token i is the character "abcdefg\\n"[i]: id 7 is the newline; id 6 stands for the end of text."""

    def encode(self, text: str):
        return types.SimpleNamespace(ids=["abcdefg\n".index(c) for c in text])

    def decode(self, ids):
        return "".join("abcdefg\n"[i] for i in ids)


def test_the_eval_batterys_greedy_continuation_is_this_decoder(monkeypatch):
    calls = []
    real = evaluation.sample
    monkeypatch.setattr(evaluation, "sample", lambda *a, **k: calls.append(k) or real(*a, **k))
    monkeypatch.setattr(evaluation, "end_of_text_id", lambda tokenizer: 6)
    model = Counter(max_seq_len=3)
    # From "b": c d e f, then id 6 (end of text) stops, excluded from the text.
    assert evaluation.greedy_continuation(model, _Tokenizer(), "ab", 10) == "cdef"
    assert calls and calls[0]["temperature"] == 0 and calls[0]["max_context"] == 3
    assert max(model.seen) == 3


def test_prompts_of_one_length_decode_at_once_as_each_would_alone():
    prompts = [[0], [2], [4]]
    together = sample_prompts(Counter(), prompts, num_samples=2, max_new_tokens=10, eos_id=7, temperature=0)
    assert together == [sample(Counter(), p, num_samples=2, max_new_tokens=10, eos_id=7, temperature=0)
                        for p in prompts]
    assert [len(c) for c in together] == [2, 2, 2]
    assert [c[0].ids for c in together] == [(1, 2, 3, 4, 5, 6, 7), (3, 4, 5, 6, 7), (5, 6, 7)]
    model = Counter()
    sample_prompts(model, prompts, num_samples=2, max_new_tokens=10, eos_id=7, temperature=0)
    assert len(model.seen) == 7  # one forward per new token for all six rows, until the last ends


def test_one_prompt_is_sampled_exactly_as_before_and_mixed_lengths_are_refused():
    def draw(fn, prompt):
        generator = torch.Generator().manual_seed(3)
        return fn(Counter(), prompt, num_samples=4, max_new_tokens=6, eos_id=7, temperature=5.0, generator=generator)

    assert draw(sample_prompts, [[1, 2]]) == [draw(sample, [1, 2])]
    with pytest.raises(ValueError, match="one length"):
        sample_prompts(Counter(), [[1], [1, 2]], num_samples=1, max_new_tokens=2, eos_id=7)
    with pytest.raises(ValueError, match="one length"):
        sample_prompts(Counter(), [], num_samples=1, max_new_tokens=2, eos_id=7)
