"""The stages' token shards are made from the clean shards a batch of rows at a time: the same
tokens as from the corpus in memory, with Python memory bounded by a batch, not by the corpus,
and a tampered shard refused (SHARD_CORRUPT) before anything is written."""

from __future__ import annotations

import tracemalloc

import numpy as np
import polars as pl
import pytest

from ito_assets.data.shards import write_shards
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.runtime.stage import corpus
from ito_assets.training.heldout import split_heldout
from ito_assets.training.tokenizer import TokenizerConfig, encode_documents, load_tokenizer, train_tokenizer

CONFIG = TokenizerConfig(vocab_size=512)


def _texts(count: int, words: int = 150) -> list[str]:
    rng = np.random.default_rng(0)
    vocabulary = [f"w{i}" for i in range(400)]
    return [" ".join(rng.choice(vocabulary, size=words)) + f" doc{i}." for i in range(count)]


def test_streamed_tokens_equal_the_in_memory_ones(tmp_path, monkeypatch):
    texts = _texts(300)
    monkeypatch.setattr(corpus, "BATCH_DOCUMENTS", 7)  # batches that straddle shard boundaries
    shards = write_shards(pl.DataFrame({"text": texts}), tmp_path / "clean", prefix="clean", max_rows=64)
    streamed = corpus.prepare_from_shards(shards, tmp_path / "tokens", config=CONFIG)
    train, heldout = split_heldout(texts, corpus.HELDOUT_FRACTION, 0)
    tokenizer = train_tokenizer(train, CONFIG)  # the oracle: every text in one list
    assert load_tokenizer(tmp_path / "tokens" / "tokenizer.json").to_str() == tokenizer.to_str()
    np.testing.assert_array_equal(np.load(streamed.train_path), encode_documents(tokenizer, train))
    np.testing.assert_array_equal(np.load(streamed.heldout_path), encode_documents(tokenizer, heldout))
    assert (streamed.num_documents, streamed.num_heldout_documents) == (300, len(heldout))
    assert streamed == corpus.prepare(texts, tmp_path / "tokens", config=CONFIG)  # the marker: no second pass


def _peak_python_bytes(tmp_path, count: int) -> tuple[int, int]:
    texts = _texts(count)
    text_bytes = sum(len(t) for t in texts)
    shards = write_shards(pl.DataFrame({"text": texts}), tmp_path / f"clean-{count}", prefix="clean", max_rows=1000)
    del texts
    tracemalloc.start()
    try:
        corpus.prepare_from_shards(shards, tmp_path / f"tokens-{count}", config=CONFIG)
        return tracemalloc.get_traced_memory()[1], text_bytes
    finally:
        tracemalloc.stop()


def test_python_memory_is_bounded_by_a_batch_not_the_corpus(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "BATCH_DOCUMENTS", 256)
    small, _ = _peak_python_bytes(tmp_path, 1500)
    large, large_text = _peak_python_bytes(tmp_path, 6000)  # four times the corpus, about 4 MB of text
    # The same batches: the peak does not grow with the corpus, and stays under its text.
    assert large < 1.25 * small and large < large_text / 2, (small, large, large_text)


def test_a_tampered_clean_shard_is_refused_before_any_token_is_written(tmp_path):
    shards = write_shards(pl.DataFrame({"text": _texts(50)}), tmp_path / "clean", prefix="clean", max_rows=20)
    with open(shards.shards[-1].path, "r+b") as handle:
        handle.seek(20)
        handle.write(b"\x00")
    with pytest.raises(ItoError) as refused:
        corpus.prepare_from_shards(shards, tmp_path / "tokens", config=CONFIG)
    assert refused.value.code is ErrorCode.SHARD_CORRUPT
    assert not (tmp_path / "tokens" / corpus.MARKER_NAME).exists()
    assert not list((tmp_path / "tokens").glob("*.npy"))


@pytest.mark.parametrize("count,said", [(10, 11), (10, 9)])
def test_a_corpus_with_other_than_its_counted_documents_is_refused(tmp_path, count, said):
    texts = _texts(count, words=5)
    with pytest.raises(ValueError, match="documents than it said"):
        corpus._prepare(lambda: iter([texts]), said, tmp_path / "tokens", config=CONFIG, seed=0)
