"""Byte-level BPE round trip, token shards as memory maps, deterministic batches."""

from __future__ import annotations

import numpy as np
import pytest

from ito_assets.training.tokenizer import (
    LoaderConfig, TokenizerConfig, encode_documents, end_of_text_id, iterate_batches, load_tokenizer,
    open_token_shard, save_tokenizer, token_dtype, train_tokenizer, write_token_shard,
)

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Unicode survives: naïve café, 東京, emoji 🙂, tabs\tand\r\nnewlines.",
    "Return the number of items in a container; len() calls __len__.",
] * 5


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, TokenizerConfig(vocab_size=300))


def test_round_trip_is_exact(tokenizer):
    for text in TEXTS[:4] + ["never seen: ∑ x² — ok", "   leading spaces"]:
        assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_training_is_deterministic_and_bounded(tokenizer):
    again = train_tokenizer(TEXTS, TokenizerConfig(vocab_size=300))
    assert again.to_str() == tokenizer.to_str()
    assert 257 <= tokenizer.get_vocab_size() <= 300


def test_saved_with_digest_and_reloaded(tokenizer, tmp_path):
    digest = save_tokenizer(tokenizer, tmp_path / "tokenizer.json")
    assert len(digest) == 64
    assert load_tokenizer(tmp_path / "tokenizer.json").encode(TEXTS[2]).ids == tokenizer.encode(TEXTS[2]).ids


def test_dtype_follows_vocabulary():
    assert token_dtype(50_304) == np.uint16
    assert token_dtype(65_536) == np.uint16
    assert token_dtype(128_256) == np.uint32


def test_documents_are_separated_by_end_of_text(tokenizer, tmp_path):
    tokens = encode_documents(tokenizer, TEXTS[:2])
    eot = end_of_text_id(tokenizer)
    assert tokens.dtype == np.uint16 and list(tokens).count(eot) == 2 and tokens[-1] == eot
    shard = write_token_shard(tokens, tmp_path / "shard.npy")
    mapped = open_token_shard(tmp_path / "shard.npy")
    assert isinstance(mapped, np.memmap) and shard.num_tokens == len(tokens) and shard.dtype == "uint16"
    assert np.array_equal(mapped, tokens)


@pytest.mark.parametrize("reloaded", [False, True])
def test_the_separators_text_inside_a_document_is_text_not_the_separator(tokenizer, tmp_path, reloaded):
    if reloaded:
        save_tokenizer(tokenizer, tmp_path / "tokenizer.json")
        tokenizer = load_tokenizer(tmp_path / "tokenizer.json")
    quoted = "GPT-2 ends documents with <|endoftext|> between them."
    tokens = encode_documents(tokenizer, [quoted, "next"])
    eot = end_of_text_id(tokenizer)
    assert list(tokens).count(eot) == 2  # the two separators the shard puts after each document
    first = list(tokens[: list(tokens).index(eot)])
    assert tokenizer.decode(first) == quoted


def test_batches_are_deterministic_shifted_and_cover_an_epoch():
    tokens = np.arange(1 + 8 * 10, dtype=np.uint16)  # 10 windows of 8
    config = LoaderConfig(batch_size=5, sequence_length=8, seed=7)
    first = [next(iterate_batches(tokens, config)) for _ in range(1)][0]
    again = next(iterate_batches(tokens, config))
    x, y = first
    assert x.shape == (5, 8) and x.dtype.is_floating_point is False
    assert (y == x + 1).all() and (x == again[0]).all()
    batches = iterate_batches(tokens, config)
    starts = sorted(int(b[0][i, 0]) for b in (next(batches), next(batches)) for i in range(5))
    assert starts == list(range(0, 80, 8))  # one epoch visits every window once
    other = next(iterate_batches(tokens, LoaderConfig(batch_size=5, sequence_length=8, seed=8)))[0]
    assert not (other == x).all()


def test_loader_refuses_too_little_data():
    with pytest.raises(ValueError, match="tokens"):
        next(iterate_batches(np.arange(10, dtype=np.uint16), LoaderConfig(batch_size=4, sequence_length=8, seed=0)))


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="vocab_size"):
        TokenizerConfig(vocab_size=100)
