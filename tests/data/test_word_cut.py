"""One cut of a text into words, whichever engine reads it: the vectorised path (polars' regex, in
Rust, over whole columns) and the per-text path (Python's `re`, for eval items and for a matched
document's offsets). Where they disagreed (combining marks, zero-width joiners, Unicode versions),
an eval item cut one way shared no seed with a document cut the other, and a verbatim copy of a
Hindi, Tamil, vowelled Arabic or pointed Hebrew question was never found."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_frames import frame
from ito_assets.data.config import DecontamConfig, ScaleConfig
from ito_assets.data.decontam_units import scan_frames
from ito_assets.data.eval_index import build_index
from ito_assets.data.scratch import scratch_space
from ito_assets.data.text import _word_lists, token_hashes, word_hashes, word_tokens, words_of, words_with_spans
from ito_assets.evals.suite import EvalItem, EvalSuite

# Questions of 13 words or more in scripts whose words hold combining marks or joiners.
QUESTIONS = {
    "hindi": "भारत की राजधानी नई दिल्ली है और यह देश का सबसे बड़ा शहर नहीं है बल्कि दूसरा सबसे बड़ा है",
    "bengali": "বাংলাদেশের রাজধানী ঢাকা এবং এটি দেশের সবচেয়ে বড় শহর যেখানে অনেক মানুষ বাস করে প্রতিদিন কাজে যায়",
    "tamil": "தமிழ்நாட்டின் தலைநகரம் சென்னை ஆகும் இது இந்தியாவின் மிகப் பெரிய நகரங்களில் ஒன்றாகும் என்று பலர் கூறுகின்றனர் இன்று",
    "arabic_vowelled": "ذَهَبَ الْوَلَدُ إِلَى الْمَدْرَسَةِ صَبَاحًا وَقَرَأَ كِتَابًا جَدِيدًا عَنِ التَّارِيخِ ثُمَّ عَادَ إِلَى الْبَيْتِ مَسَاءً مَعَ أَصْدِقَائِهِ",
    "hebrew_pointed": "בְּרֵאשִׁית בָּרָא אֱלֹהִים אֵת הַשָּׁמַיִם וְאֵת הָאָרֶץ וְהָאָרֶץ הָיְתָה תֹהוּ וָבֹהוּ וְחֹשֶׁךְ עַל פְּנֵי תְהוֹם",
    "persian_zwnj": "من می‌خواهم به کتاب‌خانه بروم و کتاب‌های تازه را بخوانم زیرا آن‌ها برای درس‌های فردا لازم هستند",
    "english": "which of the following rivers flows through the capital city of the country with the largest population",
}
MIXED = ["x² ½ ① Question 12 ٣٤ ١٢", "ﬁne a‿b _under_score", "e\u0301te\u0301 naïve", "Ⅻ ⅻ ǅ ǈ", "𝒜𝒷𝒸 𝟙𝟚", "ΣΑΣ ΟΔΥΣΣΕΥΣ",
         # Python's case tables are older than polars' (U+1C89, U+A7CB, U+10D50); a final sigma is read
         # in its context, also where a dotted capital I lengthens the text.
         "\u1c89\u1c89 question \ua7cb \U00010d50", "ΟΔΟΣ.Α İ", "İSTANBUL ΟΔΟΣ 12Σ3",
         "ＱＵＥＳＴＩＯＮ １２ ｗｈａｔ İｓ ΟΔΟΣ"]  # fullwidth Latin, as CJK text writes it


def polars_words(text: str, *, digits_normalized: bool) -> list[str]:
    return _word_lists(pl.Series([text]), digits_normalized=digits_normalized).to_list()[0] or []


def fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


@pytest.mark.parametrize("digits_normalized", [False, True])
@pytest.mark.parametrize("text", [*QUESTIONS.values(), *MIXED])
def test_both_engines_cut_a_text_into_the_same_words(text: str, digits_normalized: bool) -> None:
    assert words_of(text, digits_normalized=digits_normalized) == polars_words(text, digits_normalized=digits_normalized)


def test_spans_index_the_original_text_where_lower_casing_lengthens_it() -> None:
    words, spans = words_with_spans("İstanbul ve ΟΔΟΣ", digits_normalized=False)
    assert words == ["i\u0307stanbul", "ve", "οδος"] and spans == [(0, 8), (9, 11), (12, 16)]


def test_decontamination_folds_fullwidth_latin_one_letter_for_one() -> None:
    words, spans = words_with_spans("Ｑｕｅｓｔｉｏｎ １２: ＷＨＡＴ", digits_normalized=True)
    assert words == ["question", "0", "what"] and spans == [(0, 8), (9, 11), (13, 17)]
    assert polars_words("Ｑｕｅｓｔｉｏｎ １２: ＷＨＡＴ", digits_normalized=True) == words
    # Deduplication's words stay as written.
    assert words_of("Ｑｕｅｓｔｉｏｎ", digits_normalized=False) == ["ｑｕｅｓｔｉｏｎ"]


def test_a_word_keeps_its_combining_marks_and_joiners() -> None:
    assert words_of("नमस्ते दुनिया", digits_normalized=False) == ["नमस्ते", "दुनिया"]  # Python's own \w cuts 5
    assert words_of("می‌خواهم", digits_normalized=False) == ["می\u200cخواهم"]
    assert words_of("x² ½", digits_normalized=False) == ["x"]  # no digit of a number's own (Nd) is a word in either


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40))
def test_any_text_is_cut_alike_and_hashed_alike(text: str) -> None:
    for digits_normalized in (False, True):
        assert words_of(text, digits_normalized=digits_normalized) == polars_words(text, digits_normalized=digits_normalized)
    column = pl.Series([text])
    by_column = token_hashes(column, digits_normalized=True).hashes
    assert np.array_equal(by_column, word_tokens([words_of(text, digits_normalized=True)]).hashes)
    assert np.array_equal(word_hashes(column).hashes, token_hashes(column, digits_normalized=False).hashes)


@pytest.mark.parametrize("language", sorted(QUESTIONS) + ["fullwidth copy", "fullwidth item"])
def test_a_verbatim_copy_of_an_eval_item_is_found_in_any_script(tmp_path: Path, language: str) -> None:
    question = copy = QUESTIONS.get(language, QUESTIONS["english"])
    if language == "fullwidth copy":
        copy = fullwidth(question.upper())
    elif language == "fullwidth item":
        question = fullwidth(question)
    suite = EvalSuite("unit", "sha256:" + "0" * 64, (EvalItem(id=f"{language}/1", benchmark="b", question=question, answer="x"),))
    config = DecontamConfig()
    index = build_index(suite, config)
    assert index.views, "the item was indexed"
    docs = frame([f"some text before. {copy}\nand after.", "an unrelated document of plain words"]).select("doc_id", "text")
    with scratch_space(tmp_path / "_scratch", ScaleConfig(num_workers=1)) as scratch:
        hits = scan_frames(scratch, [docs], index, config).hits
    assert hits["doc_id"].to_list() == ["d0000"] and hits["eval_item_id"].to_list() == [f"{language}/1"]
