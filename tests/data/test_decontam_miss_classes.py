"""Two classes of contaminated documents the seed rule alone missed, generated at their boundaries:

1. An edit that leaves fewer words than a seed before the view's end (or after its start): no
   seed fits there, so those words counted only once the ends of a match are compared directly.
2. Punctuation deleted between two words ("unique(l:" -> "uniquel", "list(set(l" -> "listset l"):
   the document's words are not the item's, and join windows (bytes from a word start) find them.

Each is tested on both sides of its boundary, with documents that must not match, and the fast
path (candidates) must agree with the authoritative one (hits), in memory and over work units."""

from __future__ import annotations

import dataclasses
import random
import string
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from data_frames import frame, random_text
from ito_assets.data.config import DecontamConfig, ScaleConfig
from ito_assets.data.decontam_units import scan_frames
from ito_assets.data.eval_index import build_index
from ito_assets.data.scratch import scratch_space
from ito_assets.data.text import token_hashes, window_hashes
from ito_assets.evals.suite import EvalItem, EvalSuite
from reference_impl import scan

CONFIG = DecontamConfig()
EDIT = "editword"  # 8 letters: never one of the generated words (3-7 letters)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def suite(*items: tuple[str, str, str]) -> EvalSuite:
    return EvalSuite("unit", "sha256:" + "0" * 64, tuple(EvalItem(id=i, benchmark="b", question=q, answer=a) for i, q, a in items))


def scanned(texts: list[str], items, config: DecontamConfig = CONFIG, *, windows: bool = True):
    index = build_index(suite(*items), config)
    if not windows:
        index = dataclasses.replace(index, windows=index.windows.clear())
    hits, counts = scan(frame(texts), index, config)
    # The fast path's candidates are exactly the documents the authoritative path finds hits in.
    assert counts.num_candidate_documents == counts.num_contaminated_documents
    return hits


def planted(plant: str, seed: int = 0) -> str:
    rng = random.Random(seed)  # filler words normalise to "w0": never an item word
    return f"{random_text(rng, 12)}. {plant}\n{random_text(rng, 12)}"


def question_hit(hits: pl.DataFrame) -> dict | None:
    rows = hits.filter(pl.col("view") == "question").to_dicts()
    return rows[0] if rows else None


words_of_length = st.integers(10, 30).flatmap(
    lambda n: st.lists(st.text(string.ascii_lowercase, min_size=3, max_size=7), min_size=n, max_size=n, unique=True)
)


# --- 1. an edit before a tail (after a head) shorter than a seed ------------------------------


def edited_tail(words: list[str], tail: int, kind: str, matched: int) -> str:
    """The question's last `tail` words intact, one edit just before them, and `matched` intact
    words before the edit."""
    end = len(words) - tail
    if kind == "insert":
        return " ".join(words[end - matched : end] + [EDIT] + words[end:])
    before = words[end - 1 - matched : end - 1]
    return " ".join(before + ([EDIT] if kind == "replace" else []) + words[end:])


def edited_head(words: list[str], head: int, kind: str, matched: int) -> str:
    """The mirror image: the first `head` words intact, one edit, then `matched` intact words."""
    if kind == "insert":
        return " ".join(words[:head] + [EDIT] + words[head : head + matched])
    after = words[head + 1 : head + 1 + matched]
    return " ".join(words[:head] + ([EDIT] if kind == "replace" else []) + after)


@pytest.mark.parametrize("end", ["tail", "head"])
@SETTINGS
@given(words=words_of_length, data=st.data())
def test_an_edit_leaving_a_short_end_counts_the_end(end: str, words: list[str], data) -> None:
    length = len(words)
    seed, evidence = CONFIG.seed_size(length), CONFIG.evidence_words(length)
    short = data.draw(st.integers(1, seed - 1), label=end)
    kind = data.draw(st.sampled_from(["replace", "drop", "insert"]), label="kind")
    # The words on the seed's side of the edit fall short of the evidence by 1..short: only the
    # short end makes it.
    matched = data.draw(st.integers(max(seed, evidence - short), evidence - 1), label="matched")
    assume(matched + short + (kind != "insert") <= length)
    edited = edited_tail(words, short, kind, matched) if end == "tail" else edited_head(words, short, kind, matched)
    hit = question_hit(scanned([planted(edited)], [("q/1", " ".join(words), "ok")]))
    assert hit is not None and hit["covered_words"] == matched + short
    assert hit["eval_item_id"] == "q/1"


@SETTINGS
@given(words=words_of_length, data=st.data())
def test_a_different_tail_after_the_edit_is_not_counted(words: list[str], data) -> None:
    # The false-positive guard: the same near miss with other words (or the tail two words off)
    # after the edit stays below the evidence.
    length = len(words)
    seed, evidence = CONFIG.seed_size(length), CONFIG.evidence_words(length)
    tail = data.draw(st.integers(1, seed - 1), label="tail")
    matched = data.draw(st.integers(max(seed, evidence - tail), evidence - 1), label="matched")
    assume(matched + tail + 1 <= length)
    plant = edited_tail(words, tail, "replace", matched).split()
    other = plant[: -tail] + [f"other{w}" for w in plant[-tail:]]
    shifted = plant[: -tail] + [EDIT, EDIT] + plant[-tail:]  # two words inserted: out of reach
    hits = scanned([planted(" ".join(other)), planted(" ".join(shifted))], [("q/1", " ".join(words), "ok")])
    assert hits.height == 0


QUESTION = "which keyword lets a nested function rebind a variable that belongs to the enclosing scope".split()  # 15 words


@pytest.mark.parametrize("kind", ["replace", "drop", "insert"])
@pytest.mark.parametrize(("tail", "covered"), [(4, 11), (5, 12), (6, 12)])
def test_tail_shorter_than_a_seed_and_a_seed_long(kind: str, tail: int, covered: int) -> None:
    # 15 words: seeds of 6, evidence 11. The edit leaves `tail` words; before it, 11 - 4 = 7 or
    # 12 - 5 = 7 or 12 - 6 = 6 words. A tail of 5 (seed - 1) counts only through the ends rule, a
    # tail of 6 is a seed of its own: both are hits with the same coverage.
    assert (CONFIG.seed_size(15), CONFIG.evidence_words(15)) == (6, 11)
    hits = scanned([planted(edited_tail(QUESTION, tail, kind, covered - tail))], [("q/1", " ".join(QUESTION), "nonlocal")])
    hit = question_hit(hits)
    assert hit is not None and hit["covered_words"] == covered


@pytest.mark.parametrize(("tail_kept", "covered"), [(3, 11), (2, 10)])
def test_only_the_suffix_that_reaches_the_view_end_counts(tail_kept: int, covered: int) -> None:
    # Eight words, an edit, a tail of 3 of which the last `tail_kept` match: 8 + 3 reaches the
    # evidence (11), 8 + 2 does not (the tail's first word differs).
    plant = edited_tail(QUESTION, 3, "replace", 8).split()
    if tail_kept < 3:
        plant[-3] = "different"
    hits = scanned([planted(" ".join(plant))], [("q/1", " ".join(QUESTION), "nonlocal")])
    hit = question_hit(hits)
    assert (hit["covered_words"] if hit else 10) == covered
    assert (hit is not None) == (covered >= 11)


def test_the_tail_extends_the_offsets_of_the_hit() -> None:
    plant = edited_tail(QUESTION, 4, "drop", 7)
    text = planted(plant)
    hit = question_hit(scanned([text], [("q/1", " ".join(QUESTION), "nonlocal")]))
    assert text[hit["char_start"] : hit["char_end"]] == plant


# --- 2. punctuation deleted between words -------------------------------------------------

UNIQUE_Q = 'def unique(l: list):\n    """Return sorted unique elements in a list\n    >>> unique([5, 3, 5, 2, 3, 3, 9, 0, 123])\n    [0, 2, 3, 5, 9, 123]\n    """'
UNIQUE_A = "    return sorted(list(set(l)))"


def test_a_doctest_with_merged_words_is_found_only_through_join_windows() -> None:
    # The doctest's numbers are degenerate seeds; "uniquel", "unique5" and "sortedlistset l" break
    # every word seed across them, and word seeds alone fall short of the evidence.
    doc = 'def uniquel list\n Return sorted unique elements in a list\n unique5 3 5 2 3 3 9 0 123\n 0 2 3 5 9 123\n return sortedlistset l'
    items = [("he/34", UNIQUE_Q, UNIQUE_A)]
    hits = scanned([planted(doc)], items)
    assert hits.select("eval_item_id", "view").rows() == [("he/34", "question_answer")]
    assert hits["covered_words"][0] >= CONFIG.evidence_words(hits["view_words"][0])
    assert scanned([planted(doc)], items, windows=False).height == 0


def test_windows_are_indexed_only_where_punctuation_alone_joins_words() -> None:
    plain = build_index(suite(("q/1", " ".join(QUESTION), "nonlocal")), CONFIG)
    assert plain.windows.height == 0
    code = build_index(suite(("he/34", UNIQUE_Q, UNIQUE_A)), CONFIG)
    assert code.windows.height > 0 and code.windows["n"].min() >= 1
    # Windows cross a join ("unique(l", "sorted(list(set(l") within 20 bytes and fit in the view:
    # none from the docstring's prose, none from "sorted" in the body (14 bytes to the end).
    words = code.views[0].words
    starts = [words[p] for p in code.windows.filter(pl.col("view") == 0)["view_pos"].to_list()]
    assert {"def", "unique", "return"} <= set(starts) <= {"def", "unique", "return", "0"}


@pytest.mark.parametrize(("width", "fits"), [(19, True), (20, True), (21, False)])
def test_a_window_must_lie_inside_its_document(width: int, fits: bool) -> None:
    # "abcde.fghij" and "klmnopqrst": 20 bytes from "abcde" on, then the next document.
    tokens = token_hashes(pl.Series(["abcde.fghij klmnopqrst", "uvwxyz"]), digits_normalized=True)
    _, starts = window_hashes(tokens, width)
    assert (0 in starts.tolist()) == fits


code_words = st.lists(st.text(string.ascii_lowercase, min_size=4, max_size=4), min_size=10, max_size=30, unique=True)


@SETTINGS
@given(words=code_words, data=st.data())
def test_any_merge_of_a_code_line_is_found(words: list[str], data) -> None:
    # Every separator is punctuation alone; the copy deletes each one (merging the words) or puts
    # a space for it, never merging more than 4 words into one: each of its word starts then has
    # a window of 20 bytes, 5 whole words, and these cover all but at most the last 3 words.
    seps = data.draw(st.lists(st.sampled_from([".", "(", "_", "[", "','", "):"]), min_size=len(words) - 1, max_size=len(words) - 1), label="seps")
    merges = data.draw(st.lists(st.booleans(), min_size=len(words) - 1, max_size=len(words) - 1), label="merges")
    run = 0
    for i, merge in enumerate(merges):
        run = run + 1 if merge else 0
        merges[i] = merge and run < 4
        run = run if merges[i] else 0
    question = "".join(w + s for w, s in zip(words, seps)) + words[-1]
    copy = "".join(w + ("" if m else " ") for w, m in zip(words, merges)) + words[-1]
    hits = scanned([planted(copy)], [("c/1", question, "ok")])
    hit = question_hit(hits)
    assert hit is not None and hit["covered_words"] >= len(words) - 3


@SETTINGS
@given(words=code_words, other=code_words)
def test_merged_words_of_another_line_are_not_found(words: list[str], other: list[str]) -> None:
    # The false-positive guard: the same shape (every second join merged) of other words, and the
    # item's own merged words with one letter changed in each, never match.
    assume(not set(words) & set(other))
    changed = [w[:-1] + ("x" if w[-1] != "x" else "y") for w in words]
    assert scanned([planted(pairs_merged(other)), planted(pairs_merged(changed))], [("c/1", ".".join(words), "ok")]).height == 0


def pairs_merged(words: list[str]) -> str:
    return " ".join("".join(words[i : i + 2]) for i in range(0, len(words), 2))


@pytest.mark.parametrize(("present", "covered"), [(14, 14), (13, 12)])
def test_merged_words_at_the_evidence_boundary(present: int, covered: int | None) -> None:
    # 20 words of 5 letters joined by ".", the copy keeps every second word start ("w0w1 w2w3"):
    # no word seed matches, nor would a second view of the joined words (one word, "w0w1...w19").
    # Each kept start has a window of exactly 4 whole words (20 bytes), and windows must end
    # inside the copy: the first 14 words are covered by windows at 0, 2, ..., 10; of the first
    # 13, windows at 0, ..., 8 cover 12, one short of the 13 needed.
    rng = random.Random(5)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(5)) for _ in range(20)]
    copy = pairs_merged(words[:present])
    hits = scanned([planted(copy)], [("c/1", ".".join(words), "ok")])
    hit = question_hit(hits)
    assert (hit["covered_words"] if hit else 12) == covered
    assert (hit is not None) == (covered >= CONFIG.evidence_words(20))


def test_join_windows_do_not_move_the_median_of_the_common_seed_rule() -> None:
    # The phrasing's word seeds (with the answer) are in 13 documents, the 7 across the expression
    # in 1: the median is 7 or 13, and 13 is not 4 x 7. The item's join windows, also in 1
    # document, would pull the median to 1 and make the phrasing common, were they counted in it.
    phrasing = "In Python 3, what does the expression `{}` evaluate to when you type it at the interactive prompt? x"
    texts = [planted(phrasing.format("len(x)"), seed=i) for i in range(12)] + [planted(phrasing.format("sorted('banana')"), seed=12)]
    index = build_index(suite(("cr/0", phrasing.format("sorted('banana')"), "x")), CONFIG)
    assert index.windows.height > 0
    _, counts = scan(frame(texts), index, CONFIG)
    assert counts.num_common_seeds_ignored == 0


# --- the streamed scan agrees with the in-memory reference on both classes ------------------


def miss_class_corpus() -> tuple[pl.DataFrame, list[tuple[str, str, str]]]:
    items = [("q/1", " ".join(QUESTION), "nonlocal"), ("he/34", UNIQUE_Q, UNIQUE_A)]
    rng = random.Random(11)
    texts = [planted(edited_tail(QUESTION, t, k, 11 - t), seed=i) for i, (t, k) in enumerate([(4, "replace"), (5, "drop"), (3, "insert")])]
    texts += [planted(edited_head(QUESTION, 3, "replace", 8), seed=4)]
    texts += [planted('def uniquel list Return sorted unique elements in a list unique5 3 5 2 return sortedlistset l', seed=5)]
    texts += [random_text(rng, rng.randint(5, 80)) for _ in range(20)]
    rng.shuffle(texts)
    return frame(texts).select("doc_id", "text"), items


@pytest.mark.parametrize("num_workers", [1, 2])
def test_the_streamed_scan_equals_the_reference_on_both_classes(tmp_path: Path, num_workers: int) -> None:
    docs, items = miss_class_corpus()
    index = build_index(suite(*items), CONFIG)
    expected, expected_counts = scan(docs, index, CONFIG)
    assert expected["doc_id"].n_unique() == 5
    with scratch_space(tmp_path / "_scratch", ScaleConfig(unit_bytes=300, num_workers=num_workers)) as scratch:
        scanned_units = scan_frames(scratch, [docs], index, CONFIG)
        hits, counts = scanned_units.hits, scanned_units.counts
    assert_frame_equal(hits, expected)
    assert counts == expected_counts
