"""Exact dedup, MinHash signatures, LSH candidates, verification and the keep rule."""

from __future__ import annotations

import random

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from datasketch import MinHash

from data_frames import edit_words, frame, random_text
from ito_assets.data.config import DedupConfig
from ito_assets.data.kernels import EMPTY
from ito_assets.data.minhash import MinHasher, shingle_lists
from ito_assets.data.near_dedup import candidate_pairs, exact_jaccard, keep_rule
from ito_assets.data.text import token_hashes, words_of
from reference_impl import deduplicate


def _shingles(text: str, k: int = 5) -> set[str]:
    words = words_of(text, digits_normalized=False)
    return {" ".join(words[i : i + k]) for i in range(len(words) - k + 1)} or ({" ".join(words)} if words else set())


def test_exact_copies_keep_the_first_in_keep_order() -> None:
    docs = pl.concat([frame(["beta text here", "alpha"], source_index=1, prefix="b"), frame(["alpha", "other words entirely"], source_index=0)])
    decisions, counts = deduplicate(docs, DedupConfig())
    row = decisions.filter(pl.col("doc_id") == "b0001").row(0, named=True)
    assert row["dedup_state"] == "duplicate" and row["method"] == "exact"
    assert row["duplicate_of"] == "d0000" and row["cluster_id"] == "d0000" and row["similarity"] == 1.0
    assert counts.exact.num_removed == 1 and counts.num_kept == 3


def test_shingle_sets_and_exact_jaccard_match_python_sets() -> None:
    rng = random.Random(3)
    base = random_text(rng, 60)
    texts = [base, edit_words(rng, base, 3), random_text(rng, 40), "too short", ""]
    shingles, _ = shingle_lists(token_hashes(pl.Series(texts), digits_normalized=False), 5).as_sets(np.arange(len(texts)))
    assert shingles.lengths.tolist() == [len(_shingles(t)) for t in texts]
    a, b = np.array([0, 0, 1, 3]), np.array([1, 2, 2, 4])
    expected = [len(_shingles(texts[i]) & _shingles(texts[j])) / len(_shingles(texts[i]) | _shingles(texts[j])) if _shingles(texts[i]) | _shingles(texts[j]) else 0.0 for i, j in zip(a, b)]
    assert np.allclose(exact_jaccard(shingles, a, b), expected)


def test_signatures_estimate_jaccard_like_datasketch() -> None:
    rng = random.Random(7)
    base = random_text(rng, 300)
    texts = [base] + [edit_words(rng, base, e) for e in (5, 15, 30, 60)]
    hasher = MinHasher(num_perm=256, seed=1)
    signatures, lists = hasher.signatures_of_texts(pl.Series(texts), 5)
    shingles, _ = lists.as_sets(np.arange(len(texts)))
    assert signatures.shape == (5, 256) and signatures.dtype == np.uint32
    for j in range(1, 5):
        truth = exact_jaccard(shingles, np.array([0]), np.array([j]))[0]
        ours = float((signatures[0] == signatures[j]).mean())
        reference = MinHash(num_perm=256, seed=1)
        other = MinHash(num_perm=256, seed=1)
        reference.update_batch([s.encode() for s in _shingles(texts[0])])
        other.update_batch([s.encode() for s in _shingles(texts[j])])
        # Both estimators have a standard deviation of sqrt(J(1-J)/256) <= 0.031: 4 sigma.
        assert abs(ours - truth) < 0.125 and abs(reference.jaccard(other) - truth) < 0.125


def test_empty_documents_get_empty_signatures_and_never_pair() -> None:
    signatures, _ = MinHasher(num_perm=12).signatures_of_texts(pl.Series(["", "", "a b c d e f"]), 5)
    assert (signatures[:2] == EMPTY).all()
    a, b = candidate_pairs(signatures, 4, 3)
    assert len(a) == 0


def test_near_duplicates_are_removed_against_the_kept_document() -> None:
    rng = random.Random(11)
    original = random_text(rng, 200)
    texts = [original, edit_words(rng, original, 2), random_text(rng, 200)]
    decisions, counts = deduplicate(frame(texts), DedupConfig())
    removed = decisions.filter(pl.col("dedup_state") == "duplicate").row(0, named=True)
    assert removed["doc_id"] == "d0001" and removed["duplicate_of"] == "d0000" and removed["method"] == "near"
    assert removed["similarity"] >= 0.8 and counts.near.num_removed == 1
    assert counts.near.num_candidate_pairs >= 1 and sum(counts.near.similarity_histogram) == counts.near.num_candidate_pairs


def test_keep_rule_never_chains_through_a_removed_document() -> None:
    # 0 ~ 1 and 1 ~ 2 but 0 !~ 2: 1 goes (against 0); 2 stays, since 1 is no longer kept.
    removed = keep_rule(np.array([0, 1]), np.array([1, 2]), np.array([0.9, 0.9]))
    assert removed.as_dict() == {1: (0, 0.9)}
    # Of two kept targets, the more similar one wins.
    assert keep_rule(np.array([0, 1]), np.array([2, 2]), np.array([0.85, 0.95])).as_dict() == {2: (1, 0.95)}


def test_signature_verification_mode_and_config_validation() -> None:
    rng = random.Random(5)
    original = random_text(rng, 200)
    decisions, _ = deduplicate(frame([original, edit_words(rng, original, 1)]), DedupConfig(verify="signature"))
    assert decisions.filter(pl.col("dedup_state") == "duplicate").height == 1
    for bad in ({"num_perm": 10}, {"threshold": 0.0}, {"shingle_size": 0}):
        try:
            DedupConfig(**bad)
        except ValueError as error:
            assert next(iter(bad)) in str(error)
        else:
            raise AssertionError(f"{bad} was accepted")


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 40), st.integers(1, 4))
def test_candidate_pairs_are_every_two_documents_that_agree_on_a_whole_band(seed, num_docs, values) -> None:
    """Signatures over a few values, so that bands collide often (runs of two, three and more
    documents in one band, the same pair in several bands), and documents without shingles (EMPTY)
    that never pair: the pairs, each once, ordered by (later, earlier)."""
    rng = np.random.default_rng(seed)
    bands, rows = 4, 2
    signatures = rng.integers(0, values, size=(num_docs, bands * rows), dtype=np.uint64).astype(np.uint32)
    signatures[rng.random(num_docs) < 0.2] = EMPTY
    expected = sorted(
        (b, a) for a in range(num_docs) for b in range(a + 1, num_docs)
        if signatures[a, 0] != EMPTY and signatures[b, 0] != EMPTY
        and any((signatures[a, j * rows:(j + 1) * rows] == signatures[b, j * rows:(j + 1) * rows]).all() for j in range(bands))
    )
    a, b = candidate_pairs(signatures, bands, rows)
    assert list(zip(b.tolist(), a.tolist())) == expected
