"""Characters drawn as nothing (a soft hyphen, a zero-width space, a word joiner, a byte-order mark)
and HTML's character references (`&nbsp;`) inside a copy of an eval item: rendered, the copy reads
as the item; cut at them, its words were pieces the index never held, and the copy was kept."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_frames import frame
from helpers import examples
from ito_assets.data.clean import DROP, apply_actions
from ito_assets.data.config import DecontamConfig, ScaleConfig
from ito_assets.data.decontam_units import scan_frames
from ito_assets.data.eval_index import build_index
from ito_assets.data.scratch import scratch_space
from ito_assets.data.text import _IGNORABLE_RANGES, _word_lists, decontam_words, words_of
from ito_assets.evals.suite import load_suite
from ito_assets.settings import PROJECT_ROOT

SUITE = load_suite(PROJECT_ROOT / "data/fixtures/evals/ito-fixture-evals-v1.jsonl")
ITEM = next(item for item in SUITE.items if item.id == "py-trivia/000")
IGNORABLE = {chr(code) for low, high in _IGNORABLE_RANGES for code in range(low, high + 1)}
FILLER = "This paragraph is ordinary prose about gardening, tomatoes and the weather in spring. " * 3


def sprinkled(text: str, mark: str) -> str:
    """`mark` in the middle of every word longer than four letters, as hyphenated web text has it."""
    return " ".join(w[: len(w) // 2] + mark + w[len(w) // 2 :] if len(w) > 4 else w for w in text.split(" "))


COPIES = {
    "soft hyphen": lambda text: sprinkled(text, "\u00ad"),
    "zero-width space": lambda text: sprinkled(text, "\u200b"),
    "word joiner": lambda text: sprinkled(text, "\u2060"),
    "byte-order mark": lambda text: sprinkled(text, "\ufeff"),
    "two marks in a row": lambda text: sprinkled(text, "\u00ad\u200b"),
    "&nbsp;": lambda text: text.replace(" ", "&nbsp;"),
    "&#160; and &amp;": lambda text: text.replace(" ", "&#160;").replace(",", "&amp;"),
}


def _scanned(tmp_path: Path, texts: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    config = DecontamConfig()
    docs = frame(texts).select("doc_id", "text")
    with scratch_space(tmp_path / "_scratch", ScaleConfig(num_workers=1)) as scratch:
        hits = scan_frames(scratch, [docs], build_index(SUITE, config), config).hits
    return hits, apply_actions(docs, hits, config)[0]


@pytest.mark.parametrize("copy", sorted(COPIES))
def test_a_copy_with_invisible_characters_or_html_references_is_found_and_dropped(tmp_path, copy):
    body = COPIES[copy](f"{ITEM.question}\n{ITEM.answer}")
    text = FILLER + body + " " + FILLER[::-1]
    hits, actions = _scanned(tmp_path, [text, FILLER])
    ours = hits.filter(pl.col("eval_item_id") == ITEM.id)
    assert ours["doc_id"].unique().to_list() == ["d0000"]
    assert actions.filter(pl.col("doc_id") == "d0000")["action"].to_list() == [DROP]
    # The offsets are the original text's: the hit begins at the copy's first word, ends at its last.
    start, end = ours["char_start"].min(), ours["char_end"].max()
    assert start == len(FILLER) and text[start:end].startswith(body[:2])
    assert end <= len(FILLER) + len(body)


def test_a_word_spans_its_invisible_characters_and_its_text_leaves_them_out():
    text = "Contami\u00adnation of 1\u00ad2 x&nbsp;y \u200bend\u200b"
    words, raw, spans = decontam_words(text)
    assert words == ["contamination", "of", "0", "x", "y", "end"]
    assert raw == ["contamination", "of", "12", "x", "y", "end"]
    assert [text[s:e] for s, e in spans] == ["Contami\u00adnation", "of", "1\u00ad2", "x", "y", "end"]
    assert _word_lists(pl.Series([text]), digits_normalized=True).to_list()[0] == words
    # Deduplication's words stay as written.
    assert words_of("contami\u00adnation", digits_normalized=False) == ["contami", "nation"]


@pytest.mark.parametrize("reference, words", [("&nbsp;", ["a", "b"]), ("&NBSP;", ["a", "b"]), ("&#160;", ["a", "b"]),
                                             ("&#xA0;", ["a", "b"]), ("&eacute;", ["a", "b"]),
                                             ("&;", ["a", "b"]), ("&nbsp ", ["a", "nbsp", "b"]), ("& nbsp;", ["a", "nbsp", "b"]),
                                             ("&#12345678;", ["a", "0", "b"]), ("&x;", ["a", "x", "b"])])
def test_an_html_reference_is_a_separator_and_what_is_not_one_stays_words(reference, words):
    text = f"a{reference}b"
    assert decontam_words(text)[0] == words
    assert _word_lists(pl.Series([text]), digits_normalized=True).to_list()[0] == words


def test_an_unrelated_text_with_soft_hyphens_is_not_flagged(tmp_path):
    near_miss = sprinkled("In Haskell, what does a pure function give back to the caller when it is "
                          "evaluated lazily and its result is never demanded by any other expression?\nThunk", "\u00ad")
    hits, actions = _scanned(tmp_path, [FILLER + near_miss, sprinkled(FILLER, "\u00ad")])
    assert hits.height == 0 and actions.height == 0


ALPHABET = st.sampled_from(["a", "B", "1", " ", "&", ";", "#", "x", "n", "b", "s", "p", "\u00ad", "\u200b", "\u200c", "\u200d",
                            "\u2060", "\ufeff", "\u3164", "\ufe0f", "\u0301", "İ", "Σ", "ｑ", "１", "-", "\U000e0041"])


@settings(max_examples=examples(300, 3_000), deadline=None)
@given(st.lists(ALPHABET, max_size=30).map("".join))
def test_both_engines_cut_invisible_characters_and_references_alike(text):
    words, raw, spans = decontam_words(text)
    assert _word_lists(pl.Series([text]), digits_normalized=True).to_list()[0] == words
    assert len(raw) == len(words) == len(spans)
    for (start, end), word in zip(spans, raw):  # a span starts and ends on a character of its word
        assert text[start] not in IGNORABLE and text[end - 1] not in IGNORABLE and not text[start:end].isspace()
