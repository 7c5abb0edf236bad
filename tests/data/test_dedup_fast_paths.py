"""The vectorised paths of reading and deduplication give exactly what the per-document code gave:
NFC and empty texts in `SourceRead`, dedup's word hashes, shingle hashes and text keys."""

from __future__ import annotations

import random
import sys
import unicodedata

import numpy as np
import polars as pl
import pytest

from ito_assets.data.exact_units import text_hashes
from ito_assets.data.minhash import shingle_lists
from ito_assets.data.sources import BLANK, normalized
from ito_assets.data.text import TokenHashes, ngram_hashes, token_hashes, word_hashes

CODE_POINTS = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]  # no lone surrogates in UTF-8
# ASCII letters, digits, the characters that end words, and non-ASCII ones that lower-case,
# compose, expand or are letters of other scripts.
ALPHABET = list("abcXYZ019 _-.,\n\t") + ["é", "e\u0301", "ß", "İ", "Σ", "中", "٣", "\u200d", "Ⅻ", "ǅ", "\x1c",
                                        # lower-cases to ASCII; marks and punctuation inside a word's bytes; case-ignorable
                                        # characters, across which a capital sigma's lower case looks
                                        "\u212a", "’", "\u00ad", "'", ":", "ΑΣ", "\u0345"]


def test_blank_is_what_python_strip_removes_for_every_code_point() -> None:
    texts = pl.Series(CODE_POINTS)
    blank = texts.str.contains(BLANK).to_list()
    assert [c for c, b in zip(CODE_POINTS, blank) if b != (not c.strip())] == []
    padded = pl.Series([f" {c}\t{c}" for c in CODE_POINTS]).str.contains(BLANK).to_list()
    assert [c for c, b in zip(CODE_POINTS, padded) if b != (not f" {c}\t{c}".strip())] == []


def test_normalized_is_unicodedata_nfc_and_counts_the_changed() -> None:
    texts = pl.Series(CODE_POINTS + ["Cafe\u0301 au lait", "plain", "e\u0301\u0301x"])
    expected = [unicodedata.normalize("NFC", t) for t in texts.to_list()]
    out, changed = normalized(texts)
    assert out.to_list() == expected
    assert changed == sum(a != b for a, b in zip(texts.to_list(), expected)) > 0
    assert normalized(pl.Series(["ascii only", ""]))[1] == 0


def _random_texts(rng: random.Random) -> pl.Series:
    texts: list[str | None] = []
    for _ in range(rng.randint(0, 8)):
        roll = rng.random()
        pool = ALPHABET[:16] if rng.random() < 0.6 else ALPHABET
        texts.append(None if roll < 0.1 else "" if roll < 0.2 else "".join(rng.choice(pool) for _ in range(rng.randint(1, 30))))
    series = pl.Series(texts, dtype=pl.String)
    return series.slice(1) if len(texts) > 2 and rng.random() < 0.3 else series  # an Arrow offset too


@pytest.mark.parametrize(("native", "trials"), [(True, 2000), (False, 400)], ids=["C where built", "numpy"])
def test_word_hashes_equal_token_hashes(monkeypatch, native, trials) -> None:
    """numpy's version runs a fifth of the trials (1.4 s here against C's 5.7 s for 2,000): the
    sigma rule and the splice are the ones C's trials test, and its cutting into runs is held to
    its statement in test_kernels.py."""
    from ito_assets.data import kernels

    monkeypatch.setattr(kernels, "NATIVE", native and kernels.NATIVE)
    rng = random.Random(5)
    for _ in range(trials):
        texts = _random_texts(rng)
        fast, reference = word_hashes(texts), token_hashes(texts, digits_normalized=False)
        assert np.array_equal(fast.hashes, reference.hashes) and np.array_equal(fast.offsets, reference.offsets), texts.to_list()


@pytest.mark.parametrize("piece_bytes", [1, 2, 7, 64])
def test_word_hashes_taken_in_pieces_equal_token_hashes(monkeypatch, piece_bytes) -> None:
    """The bytes cut into pieces between words (one document across many pieces, a word longer
    than a piece, pieces that end on a document's edge): the regex's hashes and offsets. Pieces
    bound numpy's work arrays: the C kernel takes the bytes whole."""
    from ito_assets.data import kernels, text

    monkeypatch.setattr(text, "WORD_PIECE_BYTES", piece_bytes)
    monkeypatch.setattr(kernels, "NATIVE", False)
    rng = random.Random(piece_bytes)
    for _ in range(100):
        texts = pl.Series([" ".join(rng.choice(["a", "Bc", "x" * rng.randint(1, 90), "9z", "--", "", "é" * rng.randint(1, 40), "don’t", "中文"])
                                    for _ in range(rng.randint(0, 30)))
                           for _ in range(rng.randint(1, 6))])
        fast, reference = word_hashes(texts), token_hashes(texts, digits_normalized=False)
        assert np.array_equal(fast.hashes, reference.hashes) and np.array_equal(fast.offsets, reference.offsets), texts.to_list()


def _reference_shingles(tokens: TokenHashes, k: int) -> tuple[np.ndarray, np.ndarray]:
    """What shingle_lists computed per document before: ngram_hashes, whole short documents."""
    hashes, offsets = [], [0]
    for i in range(tokens.num_docs):
        words = tokens.hashes[tokens.offsets[i] : tokens.offsets[i + 1]]
        one = TokenHashes(words, np.array([0, len(words)], dtype=np.int64))
        grams = ngram_hashes(one, k)[0] if len(words) >= k else ngram_hashes(one, len(words))[0] if len(words) else []
        hashes += list(grams)
        offsets.append(len(hashes))
    return np.array(hashes, dtype=np.uint64), np.array(offsets, dtype=np.int64)


def test_shingle_lists_equal_ngram_hashes_per_document() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        lengths = rng.integers(0, 12, size=int(rng.integers(0, 10)))
        lengths[rng.random(len(lengths)) < 0.3] = 0
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = TokenHashes(rng.integers(0, 2**63, size=int(offsets[-1]), dtype=np.uint64) * np.uint64(3), offsets)
        for k in (1, 2, 5, 9):
            shingles = shingle_lists(tokens, k)
            hashes, expected_offsets = _reference_shingles(tokens, k)
            assert np.array_equal(shingles.hashes, hashes) and np.array_equal(shingles.offsets, expected_offsets)


def test_text_hashes_are_keys_of_the_text() -> None:
    texts = pl.Series(["a", "b", "a", None, "", "a" * 1000], dtype=pl.String)
    keys = text_hashes(texts)
    assert keys.shape == (6, 2) and keys.dtype == np.uint64
    assert (keys[0] == keys[2]).all() and (keys[3] == keys[4]).all()  # a null hashes as ""
    assert len({tuple(k) for k in keys.tolist()}) == 4
    assert (keys[:, 0] != keys[:, 1]).all()  # two seeds, two hashes
    chunked = pl.concat([texts[:2], texts[2:]], rechunk=False)
    assert np.array_equal(text_hashes(chunked), keys)
