"""The data plane's thresholds, pinned exactly at their boundaries.

- near-duplicates: a pair at exactly the Jaccard threshold (0.8) is a duplicate, the nearest
  achievable pair below it is not; pairs whose MinHash estimate is below threshold - margin are
  never verified; LSH banding pairs documents on whole bands only;
- decontamination: an occurrence covering exactly `evidence_words` (13) words of a view is a hit,
  one word less is not; matches further apart than the view's length are separate occurrences;
  a seed is common only when strictly above both `common_min_docs` and the relative factor.
"""

from __future__ import annotations

import random

import numpy as np
import polars as pl
import pytest

from data_frames import WORDS, frame, random_text
from ito_assets.data.clean import apply_actions
from ito_assets.data.config import DecontamConfig, DedupConfig
from ito_assets.data.decontam import HIT_SCHEMA, common_seeds, occurrences, seed_frequency, seed_matches
from ito_assets.data.eval_index import build_index
from ito_assets.data.kernels import EMPTY
from ito_assets.data.minhash import MinHasher
from ito_assets.data.text import token_hashes
from ito_assets.data.near_dedup import (
    HISTOGRAM_BINS,
    band_keys,
    band_rows,
    candidate_pairs,
    exact_jaccard,
    histogram,
    keep_rule,
    near_duplicates,
    verify_pairs,
)
from ito_assets.evals.suite import EvalItem, EvalSuite
from reference_impl import deduplicate, scan

# --- near-duplicates -------------------------------------------------------------------------

K = DedupConfig().shingle_size  # 5 words
BASE = WORDS[:100]  # 100 distinct words: 96 shingles


def extended(extra: int) -> str:
    """BASE and `extra` more words: all of BASE's 96 shingles plus `extra` new ones, so its
    Jaccard with BASE is 96 / (96 + extra)."""
    return " ".join(BASE + WORDS[100 : 100 + extra])


AT = 24  # 96 / 120 = 0.8 exactly
BELOW = 25  # 96 / 121 = 0.7934: the nearest achievable below 0.8 with this base
ABOVE = 23  # 96 / 119 = 0.8067


def shingles_of(texts: list[str]):
    return MinHasher(num_perm=DedupConfig().num_perm).signatures_of_texts(pl.Series(texts), K)


def test_the_test_documents_have_the_intended_jaccard() -> None:
    assert len(BASE) - K + 1 == 96
    _, lists = shingles_of([" ".join(BASE), extended(AT), extended(BELOW), extended(ABOVE)])
    sets, position = lists.as_sets(np.arange(4))
    similarity = exact_jaccard(sets, position[[0, 0, 0]], position[[1, 2, 3]])
    assert similarity.tolist() == [96 / 120, 96 / 121, 96 / 119]
    assert similarity[0] == 0.8 == DedupConfig().threshold


def test_exact_verification_keeps_pairs_at_the_threshold_and_rejects_those_below() -> None:
    _, lists = shingles_of([" ".join(BASE), extended(AT), extended(BELOW), extended(ABOVE)])
    agreeing = np.zeros((4, 20), dtype=np.uint32)  # every estimate is 1: nothing is prefiltered
    a, b = np.array([0, 0, 0]), np.array([1, 2, 3])
    va, vb, similarity, estimate, verified = verify_pairs(agreeing, lists, a, b, DedupConfig())
    assert va.tolist() == [0, 0] and vb.tolist() == [1, 3]
    assert similarity.tolist() == [0.8, 96 / 119]
    assert estimate.tolist() == [1.0, 1.0, 1.0] and verified == 3


@pytest.mark.parametrize(("extra", "is_duplicate"), [(AT, True), (BELOW, False), (ABOVE, True)], ids=["at", "below", "above"])
def test_deduplicate_at_the_jaccard_threshold(extra: int, is_duplicate: bool) -> None:
    decisions, counts = deduplicate(frame([" ".join(BASE), extended(extra)]), DedupConfig())
    # The pair was a candidate and was verified: the decision is the exact Jaccard's alone.
    assert (counts.near.num_candidate_pairs, counts.near.num_pairs_verified) == (1, 1)
    later = decisions.filter(pl.col("doc_id") == "d0001").row(0, named=True)
    if is_duplicate:
        assert later["dedup_state"] == "duplicate" and later["duplicate_of"] == "d0000" and later["method"] == "near"
        assert later["similarity"] == 96 / (96 + extra)
        assert counts.near.num_pairs_above_threshold == 1 and counts.num_kept == 1
    else:
        assert later["dedup_state"] == "kept" and later["duplicate_of"] is None
        assert counts.near.num_pairs_above_threshold == 0 and counts.num_kept == 2


def signatures_agreeing_on(slots: int, total: int = 20) -> np.ndarray:
    """Two signature rows that agree on exactly `slots` of `total` slots."""
    first = np.arange(total, dtype=np.uint32)
    second = first.copy()
    second[slots:] += 1000
    return np.stack([first, second])


def identical_sets():
    return shingles_of([" ".join(BASE), " ".join(BASE)])[1]  # exact Jaccard 1


@pytest.mark.parametrize(("slots", "verified"), [(13, 1), (12, 0), (14, 1)], ids=["at-margin", "below", "above"])
def test_the_prefilter_discards_estimates_below_threshold_minus_margin(slots: int, verified: int) -> None:
    # threshold 0.8 - margin 0.15 = 0.65 = 13 / 20 slots.
    assert DedupConfig().threshold - DedupConfig().prefilter_margin == 13 / 20
    va, vb, similarity, estimate, num_verified = verify_pairs(signatures_agreeing_on(slots), identical_sets(), np.array([0]), np.array([1]), DedupConfig())
    assert estimate.tolist() == [slots / 20] and num_verified == verified
    # A pair that is not verified is not a duplicate, even at an exact Jaccard of 1.
    assert va.tolist() == [0] * verified and vb.tolist() == [1] * verified and similarity.tolist() == [1.0] * verified


def test_the_prefilter_margin_is_configurable() -> None:
    config = DedupConfig(threshold=0.8, prefilter_margin=0.3)  # 0.5 = 10 / 20 slots
    assert verify_pairs(signatures_agreeing_on(10), identical_sets(), np.array([0]), np.array([1]), config)[4] == 1
    assert verify_pairs(signatures_agreeing_on(9), identical_sets(), np.array([0]), np.array([1]), config)[4] == 0


@pytest.mark.parametrize(("slots", "is_duplicate"), [(16, True), (15, False), (17, True)], ids=["at", "below", "above"])
def test_signature_verification_at_the_threshold(slots: int, is_duplicate: bool) -> None:
    # 16 / 20 = 0.8: the estimate alone decides, and nothing goes to exact verification.
    va, vb, similarity, estimate, num_verified = verify_pairs(signatures_agreeing_on(slots), identical_sets(), np.array([0]), np.array([1]), DedupConfig(verify="signature"))
    assert num_verified == 0 and estimate.tolist() == [slots / 20]
    assert (va.tolist(), vb.tolist(), similarity.tolist()) == (([0], [1], [slots / 20]) if is_duplicate else ([], [], []))


def test_exact_jaccard_of_empty_sets_is_zero() -> None:
    _, lists = shingles_of(["", "", "a b c d e f"])
    sets, position = lists.as_sets(np.arange(3))
    assert exact_jaccard(sets, position[[0, 0]], position[[1, 2]]).tolist() == [0.0, 0.0]
    assert exact_jaccard(sets, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).tolist() == []


def test_exact_jaccard_of_identical_one_shingle_documents_is_one() -> None:
    # Texts shorter than the shingle size have one shingle (all their words): a union of 1.
    _, lists = shingles_of(["too short", "too short", "other"])
    sets, position = lists.as_sets(np.arange(3))
    assert exact_jaccard(sets, position[[0, 0]], position[[1, 2]]).tolist() == [1.0, 0.0]


def test_exact_jaccard_counts_each_pair_on_its_own() -> None:
    # Pairs share documents and hashes: the intersection is counted within a pair only.
    texts = [" ".join(WORDS[:10]), " ".join(WORDS[:8]), " ".join(WORDS[2:10]), " ".join(WORDS[20:30])]
    _, lists = shingles_of(texts)
    sets, position = lists.as_sets(np.arange(4))
    got = exact_jaccard(sets, position[[0, 0, 1, 0]], position[[1, 2, 2, 3]])
    # 6 shingles; 4 in each half; the halves share 2 (w2..w6, w3..w7); nothing with the fourth.
    assert got.tolist() == [4 / 6, 4 / 6, 2 / 6, 0.0]


def test_banding_pairs_documents_that_agree_on_one_whole_band() -> None:
    # 3 bands x 2 rows. d1 agrees with d0 on band 1 only; d2 differs from d0 in one slot of every
    # band; d5 agrees with d2 on band 2 only; d3 and d4 are empty (equal, but never paired).
    signatures = np.array(
        [
            [1, 2, 3, 4, 5, 6],
            [9, 9, 3, 4, 9, 9],
            [1, 0, 3, 0, 5, 0],
            [EMPTY] * 6,
            [EMPTY] * 6,
            [7, 7, 8, 8, 5, 0],
        ],
        dtype=np.uint32,
    )
    a, b = candidate_pairs(signatures, 3, 2)
    assert list(zip(a.tolist(), b.tolist())) == [(0, 1), (2, 5)]
    # Equal slots in different bands do not pair.
    assert len(candidate_pairs(np.array([[1, 2, 3, 4], [3, 4, 1, 2]], dtype=np.uint32), 2, 2)[0]) == 0
    # Sharing several bands still makes one pair; three equal documents make three.
    a, b = candidate_pairs(np.array([[1, 2, 3, 4]] * 3, dtype=np.uint32), 2, 2)
    assert list(zip(a.tolist(), b.tolist())) == [(0, 1), (0, 2), (1, 2)]
    # Pairs come sorted by their later document, then the earlier one.
    a, b = candidate_pairs(np.array([[1, 1], [2, 2], [2, 2], [1, 1], [3, 3], [3, 3], [3, 3]], dtype=np.uint32), 1, 2)
    assert list(zip(a.tolist(), b.tolist())) == [(1, 2), (0, 3), (4, 5), (4, 6), (5, 6)]


@pytest.mark.parametrize("members", [3, 4, 5])
def test_a_bucket_pairs_its_members_with_its_first_anchors(members: int) -> None:
    """3 anchors: a bucket of 4 members (anchors + 1) is paired whole; of 5, its last two members
    do not pair with each other, each meeting the first 3."""
    a, b = candidate_pairs(np.array([[1, 2]] * members, dtype=np.uint32), 1, 2, anchors=3)
    every = {(x, y) for y in range(members) for x in range(y)}
    assert set(zip(a.tolist(), b.tolist())) == (every - {(3, 4)})


def test_a_pair_past_one_buckets_anchors_is_a_candidate_where_another_band_pairs_it() -> None:
    # Band 0: one bucket of 4 (documents 0-3), 2 anchors; band 1: documents 2 and 3 alone in theirs,
    # and 0 and 1 in two others.
    signatures = np.array([[1, 5], [1, 6], [1, 7], [1, 7]], dtype=np.uint32)
    a, b = candidate_pairs(signatures, 2, 1, anchors=2)
    assert list(zip(a.tolist(), b.tolist())) == [(0, 1), (0, 2), (1, 2), (0, 3), (1, 3), (2, 3)]
    a, b = candidate_pairs(signatures[:, :1], 1, 1, anchors=2)  # band 0 alone: (2, 3) is no pair
    assert (2, 3) not in set(zip(a.tolist(), b.tolist()))


def test_banding_with_a_single_slot() -> None:
    # num_perm = bands = rows = 1 is a valid configuration: the first slot is the only one.
    assert DedupConfig(num_perm=1, bands=1, rows=1).lsh_threshold == 1.0
    signatures = np.array([[5], [EMPTY], [5]], dtype=np.uint32)
    assert band_rows(signatures, 1, 1)["doc"].to_list() == [0, 2]
    a, b = candidate_pairs(signatures, 1, 1)
    assert (a.tolist(), b.tolist()) == ([0], [2])


def test_band_keys_depend_on_every_row_of_the_band_and_its_order() -> None:
    keys = band_keys(np.array([[1, 2, 3, 4], [1, 2, 3, 5], [2, 1, 3, 4], [1, 2, 4, 3]], dtype=np.uint32), 2, 2)
    assert keys.shape == (4, 2) and keys.dtype == np.uint64
    assert keys[0, 0] == keys[1, 0] and keys[0, 1] != keys[1, 1]  # the last row of the last band counts
    assert keys[0, 0] != keys[2, 0] and keys[0, 1] != keys[3, 1]  # order within a band counts
    assert keys[0, 1] == keys[2, 1]


def test_band_rows_number_documents_from_first_and_skip_empty_ones() -> None:
    signatures = np.array([[1, 2, 3, 4], [EMPTY] * 4, [5, 6, 7, 8]], dtype=np.uint32)
    rows = band_rows(signatures, 2, 2, first=10)
    assert rows["doc"].to_list() == [10, 10, 12, 12] and rows["band"].to_list() == [0, 1, 0, 1]
    assert rows["key"].to_list() == band_keys(signatures[[0, 2]], 2, 2).reshape(-1).tolist()
    assert rows.schema == pl.Schema({"doc": pl.Int64, "band": pl.Int32, "key": pl.UInt64})
    assert band_rows(np.zeros((0, 4), dtype=np.uint32), 2, 2).height == 0


def test_keep_rule_ties_go_to_the_earliest_kept_document() -> None:
    removed = keep_rule(np.array([1, 0]), np.array([2, 2]), np.array([0.9, 0.9]))
    assert removed.as_dict() == {2: (0, 0.9)}
    assert removed.removed.dtype == np.int64 and removed.kept.dtype == np.int64 and removed.similarity.dtype == np.float64
    empty = keep_rule(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0))
    assert len(empty) == 0 and empty.as_dict() == {}


def test_keep_rule_skips_an_edge_from_an_already_removed_document() -> None:
    # 3 is removed against 2 (the more similar); its weaker edge to 0 must not remove it twice,
    # and 1, 0 stay (0 ~ 1 below is a separate edge: 1 goes against 0).
    removed = keep_rule(np.array([0, 2, 0]), np.array([3, 3, 1]), np.array([0.85, 0.95, 0.9]))
    assert removed.removed.tolist() == [1, 3] and removed.kept.tolist() == [0, 2]
    assert removed.similarity.tolist() == [0.9, 0.95]


def test_histogram_bins_are_twenty_of_width_0_05() -> None:
    assert HISTOGRAM_BINS == 20
    counts = histogram(np.array([0.0, 0.049, 0.05, 0.5, 0.99, 1.0]))
    assert counts == (2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2)
    # The bins are fixed on [0, 1], not stretched over the values seen.
    assert histogram(np.array([0.5, 0.72])) == tuple(1 if i in (10, 14) else 0 for i in range(20))


def test_near_duplicates_counts() -> None:
    texts = [" ".join(BASE), extended(AT), extended(BELOW), " ".join(WORDS[1000:1100])]
    signatures, lists = shingles_of(texts)
    removals, families, counts = near_duplicates(signatures, lists, DedupConfig())
    assert removals.as_dict() == {1: (0, 0.8)}
    # 2 pairs with 1 only, and 1 is removed, so 2 is kept in a cluster of its own; the chain
    # 0-1-2 is one family all the same, named by its first document.
    assert families.member.tolist() == [0, 1, 2] and families.root.tolist() == [0, 0, 0]
    # Candidates: 0-1, 0-2, 1-2 (extended(AT) is a prefix of extended(BELOW): 120 / 121).
    assert (counts.num_input, counts.num_candidate_pairs, counts.num_pairs_verified, counts.num_pairs_above_threshold, counts.num_removed) == (4, 3, 3, 2, 1)
    assert sum(counts.similarity_histogram) == 3 and len(counts.similarity_histogram) == 20


# --- decontamination -------------------------------------------------------------------------

# 25 distinct words; with a one-word answer the views are question_answer (26) and question (25).
QUESTION = "Which standard library module provides a decorator that caches the results of expensive function calls keyed by their arguments using bounded least recently used eviction"
Q = QUESTION.split()
ITEM = EvalItem(id="lib/1", benchmark="lib", question=QUESTION, answer="functools")
SUITE = EvalSuite("unit", "sha256:" + "0" * 64, (ITEM,))
CONFIG = DecontamConfig()


def test_the_question_needs_thirteen_words_of_evidence() -> None:
    index = build_index(SUITE, CONFIG)
    assert [(v.kind, v.length, v.seed_size, v.evidence_words) for v in index.views] == [("question_answer", 26, 6, 13), ("question", 25, 6, 13)]
    assert len(set(Q)) == 25


def planted(num_words: int, *, start: int = 0, gap: int | None = None) -> tuple[pl.DataFrame, str, str]:
    """Two documents, the second holding `num_words` consecutive question words (from `start`)
    between filler; with `gap`, Q[0:7] and Q[7:14] with `gap` filler words between them."""
    rng = random.Random(num_words * 100 + (gap or 0))
    plant = " ".join(Q[start : start + num_words]) if gap is None else " ".join(Q[:7] + [random_text(rng, gap)] + Q[7:14])
    text = f"{random_text(rng, 30)}. {plant}, {random_text(rng, 30)}"
    return frame([random_text(rng, 60), text]), text, plant


def scan_of(docs: pl.DataFrame) -> tuple[pl.DataFrame, object]:
    return scan(docs, build_index(SUITE, CONFIG), CONFIG)


@pytest.mark.parametrize("num_words", [13, 14, 25])
def test_a_plant_of_at_least_thirteen_words_is_a_hit(num_words: int) -> None:
    docs, text, plant = planted(num_words)
    hits, counts = scan_of(docs)
    assert hits.height == 1 and hits.schema == pl.Schema(HIT_SCHEMA)
    hit = hits.row(0, named=True)
    start = text.index(plant)
    assert hit == {
        "doc_id": "d0001",
        "eval_item_id": "lib/1",
        "benchmark": "lib",
        "view": "question",  # both views cover the same words; the question view is preferred
        "matched_ngram": " ".join(Q[:13]).lower(),
        "char_start": start,
        "char_end": start + len(plant),
        "covered_words": num_words,
        "view_words": 25,
        "overlap_ratio": num_words / 25,
    }
    seeds = num_words - 6 + 1
    assert (counts.num_documents, counts.num_seed_matches, counts.num_common_seeds_ignored) == (2, 2 * seeds, 0)
    assert (counts.num_candidate_documents, counts.num_contaminated_documents, counts.num_hits) == (1, 1, 1)
    actions, pieces = apply_actions(docs, hits, CONFIG)
    assert actions.to_dicts() == [{"doc_id": "d0001", "action": "drop", "num_pieces": 0}] and pieces.height == 0


@pytest.mark.parametrize("start", [0, 6, 13])
def test_twelve_words_are_not_a_hit(start: int) -> None:
    docs, _, _ = planted(12, start=start)
    hits, counts = scan_of(docs)
    assert hits.height == 0 and hits.schema == pl.Schema(HIT_SCHEMA)
    assert counts.num_seed_matches == 2 * 7 and counts.num_candidate_documents == 0 and counts.num_contaminated_documents == 0
    actions, _ = apply_actions(docs, hits, CONFIG)
    assert actions.height == 0


def test_the_full_question_and_answer_prefers_the_longer_view() -> None:
    rng = random.Random(5)
    text = f"{random_text(rng, 20)} {QUESTION} functools {random_text(rng, 20)}"
    hits, _ = scan_of(frame([text]))
    assert hits.select("view", "covered_words", "view_words").rows() == [("question_answer", 26, 26)]
    assert hits["overlap_ratio"].to_list() == [1.0]
    assert hits["char_end"].to_list() == [text.index("functools") + len("functools")]


@pytest.mark.parametrize(("gap", "view"), [(19, "question"), (20, "question_answer"), (21, None)])
def test_matches_further_apart_than_the_view_length_are_separate_occurrences(gap: int, view: str | None) -> None:
    # Seeds at view positions 0, 1 and 7, 8 cover 14 words when they form one occurrence. The
    # doc_pos step between them is 6 + gap: one occurrence while it is <= the view's length
    # (25 for the question, 26 with the answer).
    docs, text, plant = planted(0, gap=gap)
    hits, _ = scan_of(docs)
    if view is None:
        assert hits.height == 0
        return
    assert hits.select("eval_item_id", "view", "covered_words").rows() == [("lib/1", view, 14)]
    start = text.index(plant)
    assert hits.select("char_start", "char_end").rows() == [(start, start + len(plant))]


def matches(rows: list[tuple[int, int, int, int]]) -> pl.DataFrame:
    """(doc, doc_pos, view, view_pos) rows of 6-word seeds."""
    return pl.DataFrame(
        [{"doc": d, "doc_pos": p, "seed": 0, "n": 6, "view": v, "view_pos": q} for d, p, v, q in rows],
        schema={"doc": pl.Int64, "doc_pos": pl.Int64, "seed": pl.UInt64, "n": pl.Int32, "view": pl.Int32, "view_pos": pl.Int32},
    )


def test_occurrences_measure_distinct_covered_words_per_document_and_view() -> None:
    index = build_index(SUITE, CONFIG)
    found = occurrences(
        matches(
            [
                (0, 10, 1, 0), (0, 11, 1, 1), (0, 12, 1, 2), (0, 17, 1, 7),  # 13 distinct words: a hit
                (0, 10, 0, 0), (0, 16, 0, 6),  # the other view: 12 words
                (1, 5, 1, 0), (1, 5, 1, 0), (1, 6, 1, 1), (1, 32, 1, 19),  # repeats count once; 32 - 6 > 25
                (2, 0, 1, 0), (2, 25, 1, 19),  # 25 - 0 is not more than 25: one occurrence
            ]
        ),
        index,
    ).sort("doc", "view", "doc_start")
    assert found.select("doc", "view", "covered_words", "doc_start", "doc_end", "is_hit").rows() == [
        (0, 0, 12, 10, 22, False),
        (0, 1, 13, 10, 23, True),
        (1, 1, 7, 5, 12, False),
        (1, 1, 6, 32, 38, False),
        (2, 1, 12, 0, 31, False),
    ]


def test_seed_frequency_counts_documents_not_matches() -> None:
    frequency = seed_frequency(pl.DataFrame({"seed": [1, 1, 1, 2], "doc": [0, 0, 3, 5]}, schema={"seed": pl.UInt64, "doc": pl.Int64}))
    assert sorted(frequency.rows()) == [(1, 2), (2, 1)]


def frequency_of(index, docs_by_position: dict[int, int], default: int | None = None) -> pl.DataFrame:
    """num_docs for the question view's seeds by position (others: `default`, or absent)."""
    seeds = index.seeds.filter(pl.col("view") == 1).sort("view_pos")
    rows = {int(s): default for s in seeds["seed"]} if default is not None else {}
    for position, num_docs in docs_by_position.items():
        rows[int(seeds["seed"][position])] = num_docs
    return pl.DataFrame({"seed": list(rows), "num_docs": list(rows.values())}, schema={"seed": pl.UInt64, "num_docs": pl.Int64})


@pytest.mark.parametrize(("num_docs", "is_common"), [(10, False), (11, True)])
def test_a_seed_is_common_only_in_more_than_common_min_docs_documents(num_docs: int, is_common: bool) -> None:
    index = build_index(SUITE, CONFIG)
    ignored = common_seeds(frequency_of(index, {0: num_docs}), index, CONFIG)  # median 0
    seed = int(index.seeds.filter((pl.col("view") == 1) & (pl.col("view_pos") == 0))["seed"][0])
    assert ignored.rows() == ([(seed, 0), (seed, 1)] if is_common else [])


@pytest.mark.parametrize(("num_docs", "is_common"), [(12, False), (13, True)])
def test_a_seed_is_common_only_above_the_relative_factor_times_the_median(num_docs: int, is_common: bool) -> None:
    # Every other question seed is in 3 documents: median 3, factor 4 -> more than 12 needed.
    index = build_index(SUITE, CONFIG)
    ignored = common_seeds(frequency_of(index, {4: num_docs}, default=3), index, CONFIG)
    seed = int(index.seeds.filter((pl.col("view") == 1) & (pl.col("view_pos") == 4))["seed"][0])
    assert ignored.rows() == ([(seed, 0), (seed, 1)] if is_common else [])


def test_common_seeds_at_the_document_threshold_in_a_scan() -> None:
    # The first 13 words of the question copied into 10 documents are a hit in each; in 11 they
    # are common (and nothing else of the question is seen, so the median is 0): no hit.
    rng = random.Random(8)
    plant = " ".join(Q[:13])
    for copies, hit_docs in ((10, 10), (11, 0)):
        hits, counts = scan_of(frame([f"{random_text(rng, 10)} {plant} {random_text(rng, 10)}" for _ in range(copies)]))
        assert hits["doc_id"].n_unique() == hit_docs
        assert counts.num_common_seeds_ignored == (0 if hit_docs else 2 * 8)
        assert counts.num_contaminated_documents == hit_docs and counts.num_hits == hit_docs


def test_identical_items_are_both_blamed() -> None:
    suite = EvalSuite("unit", "sha256:" + "0" * 64, (EvalItem(id="b/2", benchmark="b", question=QUESTION, answer="x"), ITEM))
    docs, _, _ = planted(13)
    hits, _ = scan(docs, build_index(suite, CONFIG), CONFIG)
    assert hits.select("doc_id", "eval_item_id", "benchmark").rows() == [("d0001", "b/2", "b"), ("d0001", "lib/1", "lib")]


def test_one_item_found_in_two_places_of_a_document_is_two_hits() -> None:
    rng = random.Random(3)
    text = f"{' '.join(Q[:13])} {random_text(rng, 40)} {' '.join(Q[12:25])}"
    hits, counts = scan_of(frame([text]))
    assert hits.select("eval_item_id", "view", "covered_words").rows() == [("lib/1", "question", 13), ("lib/1", "question", 13)]
    assert hits["char_start"].to_list() == [0, text.index(Q[12] + " " + Q[13])]
    assert counts.num_contaminated_documents == 1 and counts.num_hits == 2


def test_every_seed_size_is_searched_even_when_a_smaller_one_finds_nothing() -> None:
    # A short item (views of 10 and 9 words: seeds of 5 and 4 words) before the long one: the
    # document holds only the long item, so the 4- and 5-word seeds find nothing.
    short = EvalItem(id="s/1", benchmark="s", question="Name the builtin returning an iterator over paired items", answer="zip")
    suite = EvalSuite("unit", "sha256:" + "0" * 64, (short, ITEM))
    index = build_index(suite, CONFIG)
    assert index.seed_sizes == (4, 5, 6)
    docs, _, _ = planted(13)
    hits, _ = scan(docs, index, CONFIG)
    assert hits.select("doc_id", "eval_item_id").rows() == [("d0001", "lib/1")]


def test_attribution_counts_raw_agreement_over_every_matched_word() -> None:
    # Two template siblings that differ from the document only in numbers: X at three of the
    # last five words (covered by the last seed only, never the start of one), Y at two early
    # words. Y agrees on 23 words, X on 22: Y is blamed. Counting only the first word of each
    # seed would give X 20 and Y 18.
    words = Q[:]
    document = dict(zip((2, 10, 21, 22, 23), ("11", "12", "13", "14", "15")))
    x = document | {21: "31", 22: "32", 23: "33"}
    y = document | {2: "41", 10: "42"}

    def text(numbers: dict[int, str]) -> str:
        return " ".join(numbers.get(i, w) for i, w in enumerate(words))

    suite = EvalSuite("unit", "sha256:" + "0" * 64, (EvalItem(id="n/x", benchmark="n", question=text(x), answer="x"), EvalItem(id="n/y", benchmark="n", question=text(y), answer="y")))
    rng = random.Random(6)
    hits, _ = scan(frame([f"{random_text(rng, 20)} {text(document)} {random_text(rng, 20)}"]), build_index(suite, CONFIG), CONFIG)
    assert hits.select("eval_item_id", "view", "covered_words").rows() == [("n/y", "question", 25)]


def test_keep_rule_goes_on_after_a_skipped_edge() -> None:
    # (1, 2) is skipped (1 was removed); the later edge (0, 3) must still be settled.
    removed = keep_rule(np.array([0, 1, 0]), np.array([1, 2, 3]), np.array([0.9, 0.9, 0.9]))
    assert removed.as_dict() == {1: (0, 0.9), 3: (0, 0.9)}


def test_seed_matches_give_positions_within_each_document() -> None:
    index = build_index(SUITE, CONFIG)
    texts = ["alpha beta gamma", " ".join(Q[:7]), "delta " + " ".join(Q[19:]) + " functools"]
    found = seed_matches(token_hashes(pl.Series(texts), digits_normalized=True), index).sort("doc", "view", "doc_pos")
    # Q[:7] holds the seeds at view positions 0 and 1 of both views; the third document the
    # question's last seed (19) and the seed only the question_answer view has (20: "... functools").
    assert found.select("doc", "doc_pos", "view", "view_pos").rows() == [
        (1, 0, 0, 0), (1, 1, 0, 1), (1, 0, 1, 0), (1, 1, 1, 1),
        (2, 1, 0, 19), (2, 2, 0, 20), (2, 1, 1, 19),
    ]


@pytest.mark.parametrize(("text", "num_matches"), [(" ".join(Q[20:]) + " functools", 1), (" ".join(Q[19:]), 2), (" ".join(Q[19:24]), 0)])
def test_a_document_of_exactly_one_seed(text: str, num_matches: int) -> None:
    # Six words are one 6-gram: the question_answer view's own last seed, or the seed both views
    # share; five words are none. Never a hit (13 words are needed), but the matches are counted.
    hits, counts = scan_of(frame([text]))
    assert hits.height == 0 and counts.num_seed_matches == num_matches


def test_occurrences_of_one_match_and_of_none() -> None:
    index = build_index(SUITE, CONFIG)
    assert occurrences(matches([(0, 3, 1, 0)]), index).select("doc", "view", "covered_words", "doc_start", "doc_end", "is_hit").rows() == [(0, 1, 6, 3, 9, False)]
    empty = occurrences(matches([]), index)
    assert empty.height == 0
    assert empty.schema == pl.Schema({"doc": pl.Int64, "view": pl.Int32, "occurrence": pl.UInt32, "covered_words": pl.UInt32, "doc_start": pl.Int64, "doc_end": pl.Int64, "is_hit": pl.Boolean})


def test_seeds_never_seen_count_as_zero_documents_for_the_median() -> None:
    # Only one seed is seen (11 documents): the median of the view is 0, so even a factor of 20
    # leaves it common (11 > 20 x 0).
    index = build_index(SUITE, CONFIG)
    config = DecontamConfig(common_relative_factor=20.0)
    assert common_seeds(frequency_of(index, {0: 11}), index, config).height == 2


def test_common_seeds_come_sorted_by_seed_then_view() -> None:
    index = build_index(SUITE, CONFIG)
    ignored = common_seeds(frequency_of(index, {0: 11, 1: 11, 2: 11}), index, CONFIG)
    seeds = sorted(int(s) for s in index.seeds.filter((pl.col("view") == 1) & (pl.col("view_pos") < 3))["seed"])
    assert ignored.rows() == [(s, v) for s in seeds for v in (0, 1)]
