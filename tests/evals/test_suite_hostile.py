"""The eval suite under hostile text: an item written decomposed (NFD) is read in the documents'
form (NFC), so decontamination still finds its copies; ids that print the same are one id; the
digest stays the file's bytes."""

from __future__ import annotations

import hashlib
import json
import unicodedata

import polars as pl
import pytest

from ito_assets.data.config import DecontamConfig
from ito_assets.data.eval_index import build_index
from ito_assets.data.text import NORMALIZATION_FORM, normalize
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import TEXT_FORM, parse_suite
from reference_impl import scan

QUESTION = ("Which café served the résumé of the naïve coöperative when the élite jury met at the old château "
            "by the river")
ANSWER = "The one beside the église of the village"


def _line(form: str, item_id: str = "fr/1") -> str:
    item = {"id": item_id, "benchmark": "fr", "question": unicodedata.normalize(form, QUESTION),
            "answer": unicodedata.normalize(form, ANSWER)}
    return json.dumps(item, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("form", ["NFC", "NFD"])
def test_a_decomposed_item_is_still_found_in_the_documents(form):
    suite = parse_suite("s", _line(form).encode())
    # Documents are stored NFC (`data.text.normalize`); the item's words must be the same words.
    text = normalize(f"Some unrelated words come first. {QUESTION}? {ANSWER}. And more words after it.")
    docs = pl.DataFrame({"doc_id": ["d0000"], "text": [text]})
    hits, _ = scan(docs, build_index(suite, DecontamConfig()), DecontamConfig())
    assert hits["eval_item_id"].to_list() == ["fr/1"]


def test_the_texts_are_read_composed_and_the_digest_is_the_files_bytes():
    data = _line("NFD").encode()
    (item,) = parse_suite("s", data).items
    assert item.question == unicodedata.normalize("NFC", QUESTION)
    assert item.answer == unicodedata.normalize("NFC", ANSWER)
    assert parse_suite("s", data).digest == "sha256:" + hashlib.sha256(data).hexdigest()


def test_ids_that_print_the_same_are_one_id():
    composed, decomposed = "caf\N{LATIN SMALL LETTER E WITH ACUTE}/1", "cafe\N{COMBINING ACUTE ACCENT}/1"
    with pytest.raises(ItoError, match="line 2 repeats an item id") as caught:
        parse_suite("s", (_line("NFC", composed) + _line("NFC", decomposed)).encode())
    assert caught.value.code is ErrorCode.EVAL_SUITE_INVALID
    (item,) = parse_suite("s", _line("NFC", decomposed).encode()).items
    assert item.id == decomposed  # an id stays as written: it is given back on a command line


def test_a_huge_answer_is_kept_whole():
    huge = json.dumps({"id": "big", "benchmark": "b", "question": "q?", "answer": "x" * 1_000_000}) + "\n"
    (item,) = parse_suite("s", huge.encode()).items
    assert len(item.answer) == 1_000_000


def test_the_suite_reads_text_in_the_documents_form():
    assert TEXT_FORM == NORMALIZATION_FORM
