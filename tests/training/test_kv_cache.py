"""The KV cache: a prompt read once and then one token a step gives the logits a whole-prefix
forward gives, and decoding with it samples what decoding without it samples."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ito_assets.posttraining.decoding import sample_prompts
from ito_assets.training.model import DecoderLM
from ito_assets.training.model_config import CONFIGS

# Grouped-query attention (two heads share each key/value head), a short context to reach its end.
GQA = replace(CONFIGS["micro"], name="micro-gqa", num_heads=4, num_kv_heads=2, max_seq_len=24)
ATOL = 1e-5  # fp32: the cached and whole-prefix forwards differ only in the order of their sums


class Recording(DecoderLM):
    """Records how many positions each forward is fed."""

    def __init__(self, config):
        super().__init__(config)
        self.seen: list[int] = []

    def forward(self, tokens, cache=None):
        self.seen.append(tokens.shape[1])
        return super().forward(tokens, cache)


class NoCache(torch.nn.Module):
    """The same model without `new_cache`: decoding then feeds it the whole prefix each step."""

    def __init__(self, model: DecoderLM):
        super().__init__()
        self.model = model

    def forward(self, tokens):
        return self.model(tokens)


def _model(config=GQA, seed=0) -> Recording:
    torch.manual_seed(seed)
    return Recording(config).eval()


@torch.no_grad()
@pytest.mark.parametrize("config", [GQA, replace(CONFIGS["micro"], mlp="gelu", tie_embeddings=False)])
def test_cached_logits_equal_the_whole_prefix_forward_at_every_position(config):
    model = _model(config)
    tokens = torch.randint(0, config.vocab_size, (3, min(20, config.max_seq_len)))
    full = model(tokens)  # (B, T, V)
    cache = model.new_cache(tokens.shape[1])
    # A prompt of 7, one token, a chunk of 3 (causal within it, every cached position before it), then one at a time.
    pieces = [model(tokens[:, a:b], cache=cache) for a, b in ((0, 7), (7, 8), (8, 11))]
    pieces += [model(tokens[:, t : t + 1], cache=cache) for t in range(11, tokens.shape[1])]
    assert cache.length == tokens.shape[1]
    assert torch.allclose(torch.cat(pieces, dim=1), full, atol=ATOL)


@torch.no_grad()
def test_the_cache_holds_exactly_its_capacity_and_never_more_than_the_model_can_place():
    model = _model()
    tokens = torch.randint(0, GQA.vocab_size, (1, 10))
    cache = model.new_cache(10)
    model(tokens[:, :9], cache=cache)
    model(tokens[:, 9:], cache=cache)  # the tenth position: exactly full
    with pytest.raises(ValueError, match="holds 10 positions; 11 asked"):
        model(tokens[:, :1], cache=cache)
    assert model.new_cache(GQA.max_seq_len + 100).layers[0].capacity == GQA.max_seq_len
    long = model.new_cache(GQA.max_seq_len + 100)
    model(torch.zeros(1, GQA.max_seq_len, dtype=torch.long), cache=long)  # the model's last position
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=long)


@torch.no_grad()
def test_repeated_rows_continue_as_if_each_prompt_had_been_read_once_a_row():
    model = _model()
    prompts, repeats = torch.randint(0, GQA.vocab_size, (2, 6)), 3
    shared = model.new_cache(8)
    model(prompts, cache=shared)
    shared.repeat_rows(repeats)
    separate = model.new_cache(8)
    model(prompts.repeat_interleave(repeats, dim=0), cache=separate)
    nxt = torch.randint(0, GQA.vocab_size, (2 * repeats, 1))
    assert torch.allclose(model(nxt, cache=shared), model(nxt, cache=separate), atol=ATOL)


def test_decoding_reads_the_prompt_once_then_one_token_a_step_and_samples_as_without_the_cache():
    model = _model()
    prompts = torch.randint(0, GQA.vocab_size, (2, 5)).tolist()
    options = dict(num_samples=3, max_new_tokens=6, eos_id=-1)  # no stop: every row runs to the end
    for temperature in (0, 1.0):
        cached = sample_prompts(model, prompts, temperature=temperature,
                                generator=torch.Generator().manual_seed(7), **options)
        assert model.seen == [5, 1, 1, 1, 1, 1]  # one prefill for both prompts, no forward after the last token
        model.seen.clear()
        whole = sample_prompts(NoCache(model), prompts, temperature=temperature,
                               generator=torch.Generator().manual_seed(7), **options)
        assert model.seen == [5, 6, 7, 8, 9, 10]
        model.seen.clear()
        assert [[c.ids for c in row] for row in cached] == [[c.ids for c in row] for row in whole]
        for row, other in zip(cached, whole):
            for c, o in zip(row, other):
                assert c.logprobs == pytest.approx(o.logprobs, abs=ATOL)


def test_a_window_that_would_slide_is_decoded_without_the_cache():
    model = _model()
    prompt = [torch.randint(0, GQA.vocab_size, (4,)).tolist()]
    options = dict(num_samples=1, eos_id=-1, temperature=0)
    # 4 + 5 tokens, the last never fed: 8 positions, exactly the window.
    sample_prompts(model, prompt, max_new_tokens=5, max_context=8, **options)
    assert model.seen == [4, 1, 1, 1, 1]
    model.seen.clear()
    sample_prompts(model, prompt, max_new_tokens=6, max_context=8, **options)  # one more: the window slides
    assert model.seen == [4, 5, 6, 7, 8, 8]


def test_a_completion_past_the_models_context_is_refused_as_without_the_cache():
    model = _model()
    prompt = [[1] * (GQA.max_seq_len - 2)]
    options = dict(num_samples=1, eos_id=-1, temperature=0)
    assert len(sample_prompts(model, prompt, max_new_tokens=3, **options)[0][0].ids) == 3  # ends at max_seq_len + 1
    for policy in (model, NoCache(model)):
        with pytest.raises(ValueError, match="max_seq_len"):
            sample_prompts(policy, prompt, max_new_tokens=4, **options)


@torch.no_grad()
def test_a_forward_that_fails_part_way_leaves_the_cache_as_before_it():
    model = _model()
    tokens = torch.randint(0, GQA.vocab_size, (4, 8))
    cache = model.new_cache(8)
    model(tokens[:, :5], cache=cache)

    def fail(module, args):
        raise RuntimeError("a block failed")

    hook = model.blocks[1].register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="a block failed"):
        model(tokens[:, 5:6], cache=cache)  # the first block has written position 5, the second has not
    hook.remove()
    assert [layer.length for layer in cache.layers] == [5, 5]
    resumed = torch.cat([model(tokens[:, t : t + 1], cache=cache) for t in range(5, 8)], dim=1)
    assert torch.allclose(resumed, model(tokens)[:, 5:], atol=ATOL)


@torch.no_grad()
def test_a_cache_refuses_other_rows_than_it_holds():
    model = _model()
    cache = model.new_cache(8)
    model(torch.zeros(4, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="holds 4 rows; 1 fed"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    assert cache.length == 3


def test_decoding_through_a_cache_with_gradients_is_refused():
    model = _model()
    with pytest.raises(ValueError, match="without gradients"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=model.new_cache(4))


@torch.no_grad()
def test_decoding_runs_each_block_eagerly_whatever_its_training_body():
    """A compiled body is specialised to training's shapes (and takes no cache): decoding bypasses it."""
    model = _model()
    tokens = torch.randint(0, GQA.vocab_size, (2, 6))
    expected = model(tokens)

    def compiled(*args):
        raise AssertionError("the training body ran while decoding")

    for block in model.blocks:
        block.body, block.recompute = compiled, True
    cache = model.new_cache(6)
    got = torch.cat([model(tokens[:, :3], cache=cache)] + [model(tokens[:, t : t + 1], cache=cache) for t in (3, 4, 5)],
                    dim=1)
    assert torch.allclose(got, expected, atol=ATOL)
