"""The eval battery on a small suite: metric ranges, modes, bits per byte."""

from __future__ import annotations

import math

import pytest

from ito_assets.evals.suite import EvalItem
from ito_assets.training.eval_config import EvalConfig
from ito_assets.training.evaluation import bits_per_byte, evaluate
from ito_assets.training.model import build_model, config_by_name
from ito_assets.training.tokenizer import TokenizerConfig, train_tokenizer


def _items() -> list[EvalItem]:
    arith = [EvalItem(id=f"a{i}", benchmark="arith", question=f"What is {i} plus {i}?", answer=str(2 * i)) for i in range(6)]
    yes_no = [EvalItem(id=f"y{i}", benchmark="yesno", question=f"Is {i} even?", answer="yes" if i % 2 == 0 else "no") for i in range(4)]
    return arith + yes_no


@pytest.fixture(scope="module")
def setup():
    texts = [f"Question: What is {i} plus {i}?\nAnswer: {2 * i}" for i in range(50)] + ["Is it even? yes", "no"]
    tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=320))
    model = build_model(config_by_name("micro", vocab_size=tokenizer.get_vocab_size()), seed=0)
    return model, tokenizer


def test_choice_and_greedy_modes(setup):
    model, tokenizer = setup
    report = evaluate(model, tokenizer, _items(), EvalConfig(num_candidates=4, max_new_tokens=4), heldout_texts=["held out text here"])
    by_name = {b.benchmark: b for b in report.benchmarks}
    assert by_name["arith"].mode == "choice" and by_name["yesno"].mode == "greedy"  # two distinct answers < 4
    for score in report.benchmarks:
        assert 0 <= score.accuracy <= 1 and 0 < score.correct_prob <= 1
        assert score.logprob_per_token < 0 and score.bits_per_byte > 0
    assert report.heldout_bits_per_byte > 0
    summary = report.summary()
    assert set(summary["benchmarks"]) == {"arith", "yesno"}
    assert summary["answer_bits_per_byte"] == pytest.approx((by_name["arith"].bits_per_byte + by_name["yesno"].bits_per_byte) / 2)


def test_untrained_model_is_near_uniform(setup):
    model, tokenizer = setup
    bpb = bits_per_byte(model, tokenizer, ["some held out words, and more of them."] * 3, sequence_length=16)
    tokens_per_byte = len(tokenizer.encode("some held out words, and more of them.").ids) / 39
    uniform = math.log2(tokenizer.get_vocab_size()) * tokens_per_byte
    assert 0.7 * uniform < bpb < 1.3 * uniform


def test_validation_names_the_field():
    with pytest.raises(ValueError, match="num_candidates"):
        EvalConfig(num_candidates=1)


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_a_continuation_is_scored_whole_up_to_the_window_and_refused_past_it(setup, extra):
    """micro's window scores 256 continuation tokens after one of context; one more would be cut to
    a fragment of its end while its bytes still counted whole."""
    from ito_assets.training.evaluation import continuation_logprobs

    model, _ = setup
    continuation = [5] * (model.config.max_seq_len + extra)
    if extra <= 0:
        (scored,) = continuation_logprobs(model, [([1, 2, 3], continuation)], batch_size=1)
        assert len(scored) == len(continuation)
        return
    with pytest.raises(ValueError, match="continuation 0 has 257 tokens"):
        continuation_logprobs(model, [([1, 2, 3], continuation)], batch_size=1)


def test_pairs_are_scored_in_their_order_as_each_alone_and_batched_by_length(setup):
    """Batches hold rows of similar length and come back in the callers' order, each row's
    log-probabilities those of its own forward (to float rounding)."""
    import torch

    from ito_assets.training.evaluation import continuation_logprobs

    model, _ = setup
    generator = torch.Generator().manual_seed(0)
    lengths = [(30, 4), (3, 1), (28, 6), (2, 2), (31, 3), (4, 5)]  # long and short alternate
    pairs = [(torch.randint(0, 300, (c,), generator=generator).tolist(),
              torch.randint(0, 300, (k,), generator=generator).tolist()) for c, k in lengths]
    widths = []
    hook = model.register_forward_pre_hook(lambda _, inputs: widths.append(tuple(inputs[0].shape)))
    try:
        batched = continuation_logprobs(model, pairs, batch_size=3)
    finally:
        hook.remove()
    assert widths == [(3, 8), (3, 33)]  # the three short rows together, then the three long ones
    for pair, scored in zip(pairs, batched):
        (alone,) = continuation_logprobs(model, [pair], batch_size=1)
        assert len(scored) == len(pair[1])
        assert scored == pytest.approx(alone, abs=1e-5)


def test_an_empty_context_is_refused_and_empty_continuations_need_no_forward(setup):
    from ito_assets.training.evaluation import continuation_logprobs

    model, _ = setup
    with pytest.raises(ValueError, match="pair 1 has an empty context"):
        continuation_logprobs(model, [([1], [2]), ([], [2, 3])], batch_size=4)
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:  # one-token contexts and nothing to score: a forward over no positions would fail
        assert continuation_logprobs(model, [([1], []), ([2], [])], batch_size=2) == [[], []]
        assert continuation_logprobs(model, [([1], []), ([2, 3], [4])], batch_size=1)[0] == []
    finally:
        hook.remove()
    assert calls == [1]  # the second call's scored pair alone
