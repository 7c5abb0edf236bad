"""The eval index and the decontamination scan: the four planted styles, degenerate and common
n-grams, short items, offsets, and attribution between template siblings."""

from __future__ import annotations

import random

import polars as pl
import pytest

from data_frames import WORDS, frame, random_text
from ito_assets.data.config import DecontamConfig
from ito_assets.data.eval_index import build_index, is_degenerate
from ito_assets.evals.suite import EvalItem, EvalSuite
from reference_impl import scan

QUESTION = "When a default argument value is a mutable list how many times is that list object created across repeated calls of the function"
ANSWER = "Once when the def statement runs"
SIBLING_A = "A shelf holds 46 rows of apples and each row has 6 of them so Priya removes 15 and Mateo adds 46 more apples today"
SIBLING_B = "A shelf holds 12 rows of apples and each row has 9 of them so Priya removes 30 and Mateo adds 11 more apples today"


def suite(*items: tuple[str, str, str]) -> EvalSuite:
    return EvalSuite(
        suite_id="unit",
        digest="sha256:" + "0" * 64,
        items=tuple(EvalItem(id=i, benchmark=i.split("/")[0], question=q, answer=a) for i, q, a in items),
    )


def run(texts: list[str], items, config: DecontamConfig = DecontamConfig()) -> pl.DataFrame:
    hits, _ = scan(frame(texts), build_index(suite(*items), config), config)
    return hits


def wrap(rng: random.Random, plant: str) -> str:
    return f"{random_text(rng, 30)}. {plant}\n{random_text(rng, 30)}"


@pytest.mark.parametrize(
    "style",
    ["verbatim_qa", "question_only", "edited_question", "case_punct"],
)
def test_each_planted_style_is_caught_with_offsets(style: str) -> None:
    rng = random.Random(style)
    words = QUESTION.split()
    if style == "edited_question":
        # Two words in 23 (~9%), placed so that no 13-gram of the question survives.
        words[9] = "umm"
        words[17] = "many"
    plant = {
        "verbatim_qa": f"{QUESTION}? Answer: {ANSWER}.",
        "question_only": f"{QUESTION}?",
        "edited_question": " ".join(words) + "?",
        "case_punct": f"{QUESTION.upper().replace(' IS ', ', IS; ')}!! {ANSWER.title()}",
    }[style]
    text = wrap(rng, plant)
    hits = run([text, random_text(rng, 80)], [("py-trivia/002", QUESTION, ANSWER)])
    assert hits["doc_id"].to_list() == ["d0000"]
    hit = hits.row(0, named=True)
    assert hit["eval_item_id"] == "py-trivia/002" and hit["benchmark"] == "py-trivia"
    assert hit["overlap_ratio"] >= 0.6 and hit["covered_words"] >= 13
    matched = text[hit["char_start"] : hit["char_end"]]
    assert matched.lower().startswith("when a default") and len(hit["matched_ngram"].split()) == 13


def test_degenerate_runs_never_count() -> None:
    numbers = "Compute the sum 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 and report it please"
    text = "my tensor is " + " ".join(str(i % 10) for i in range(300))
    assert run([text], [("code/1", numbers, "210")]).height == 0
    assert is_degenerate(["0"] * 6, 0.5) and is_degenerate(["a", "b", "a", "b", "a", "b"], 0.5)
    assert not is_degenerate(["which", "keyword", "defines", "a", "function", "in"], 0.5)


def test_common_seeds_are_ignored_but_a_widely_copied_item_is_not() -> None:
    rng = random.Random(1)
    boilerplate = "permission is hereby granted free of charge to any person obtaining a copy"
    question = f"{boilerplate} what does the licence header of the zebra project forbid"
    docs = [f"{random_text(rng, 20)} {boilerplate} {random_text(rng, 20)}" for _ in range(30)]
    assert run(docs, [("q/1", question, "nothing")]).height == 0
    copied = [wrap(rng, QUESTION) for _ in range(30)]
    assert run(copied, [("q/2", QUESTION, ANSWER)])["doc_id"].n_unique() == 30


def test_short_items_use_shorter_ngrams_and_long_answers_are_indexed() -> None:
    rng = random.Random(2)
    short = "Which keyword defines a generator function body"  # 7 words: below min_view_words alone
    long_answer = "the interpreter allocates the default list exactly once when the def statement is executed at import"
    texts = [wrap(rng, f"{short} yield"), wrap(rng, long_answer), random_text(rng, 50)]
    hits = run(texts, [("s/1", short, "yield"), ("l/1", "What happens to defaults?", long_answer)])
    assert sorted(hits["doc_id"].to_list()) == ["d0000", "d0001"]
    assert set(hits["view"].to_list()) == {"question_answer", "answer"}


def test_template_siblings_blame_the_item_whose_numbers_match() -> None:
    rng = random.Random(4)
    hits = run([wrap(rng, SIBLING_B)], [("arith/a", SIBLING_A, "307"), ("arith/b", SIBLING_B, "99")])
    assert hits["eval_item_id"].to_list() == ["arith/b"]


def test_clean_documents_with_shared_vocabulary_are_not_flagged() -> None:
    rng = random.Random(9)
    vocabulary = QUESTION.lower().split()
    # Same words, shuffled: many shared words, no shared 6-gram run long enough to be evidence.
    docs = [" ".join(rng.sample(vocabulary, len(vocabulary))) + " " + random_text(rng, 40) for _ in range(200)]
    assert run(docs, [("py-trivia/002", QUESTION, ANSWER)]).height == 0
    assert len(WORDS) > 1000


def test_config_rules() -> None:
    config = DecontamConfig()
    assert config.seed_size(30) == 6 and config.seed_size(10) == 5 and config.seed_size(8) == 4
    assert config.evidence_words(40) == 13 and config.evidence_words(10) == 7
    with pytest.raises(ValueError, match="action"):
        DecontamConfig(action="blur")  # type: ignore[arg-type]
