"""The eval index holds, for every view, exactly the seeds one view alone gives: its own seed size,
degenerate seeds left out and counted, a view without seeds left out and its item counted as
unindexed, views numbered in order. The index hashes all views at once; the reference below
hashes each view alone, as the index did before."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import examples
from ito_assets.data.config import DecontamConfig
from ito_assets.data.eval_index import build_index, is_degenerate
from ito_assets.data.text import ngram_hashes, word_tokens
from ito_assets.evals.suite import EvalItem, EvalSuite

CONFIG = DecontamConfig()
# Words that make degenerate seeds (numbers, repeats), words cut at punctuation, beyond ASCII.
WORDS = ["the", "0", "12", "1,000", "x", "list(set(l))", "a.b", "café", "ÀB", "foo-bar", "paris", "river", "q"]


def _suite(*items: tuple[str, str, str]) -> EvalSuite:
    return EvalSuite("unit", "sha256:" + "0" * 64, tuple(EvalItem(id=i, benchmark="b", question=q, answer=a) for i, q, a in items))


def _one_view_alone(words: tuple[str, ...], n: int, fraction: float) -> list[tuple[int, int]]:
    """(seed, position) of one view's non-degenerate n-grams, hashed on their own."""
    grams, starts = ngram_hashes(word_tokens([words]), n)
    return [(int(g), int(s)) for g, s in zip(grams, starts) if not is_degenerate(words[s : s + n], fraction)]


def _assert_each_view_holds_its_own_seeds(suite: EvalSuite, config: DecontamConfig) -> None:
    index = build_index(suite, config)
    seeds = index.seeds.to_dicts()
    assert [(s["view"], s["view_pos"]) for s in seeds] == sorted((s["view"], s["view_pos"]) for s in seeds)
    for number, view in enumerate(index.views):
        expected = _one_view_alone(view.words, view.seed_size, config.degenerate_fraction)
        got = [(s["seed"], s["view_pos"]) for s in seeds if s["view"] == number]
        assert got == expected and got, (view.item_id, view.kind)
        assert all(s["n"] == view.seed_size for s in seeds if s["view"] == number)
    assert {s["view"] for s in seeds} == set(range(len(index.views)))
    assert index.num_items_unindexed == len(suite.items) - len({v.item_id for v in index.views})


def test_a_view_of_degenerate_seeds_only_is_left_out_and_its_item_counted_unindexed():
    suite = _suite(("numbers", "0 0 0 0 0 0 0 0 0 0", "1"),
                   ("prose", "what is the capital city of france in europe today", "paris"))
    index = build_index(suite, CONFIG)
    assert [(v.item_id, v.kind) for v in index.views] == [("prose", "question_answer"), ("prose", "question")]
    assert index.num_items_unindexed == 1
    # The numbers' question: 10 words, seeds of 5 (half), 6 of them, all "0 0 0 0 0" (and its
    # question + answer view the same with one more): 6 + 7 degenerate.
    assert index.num_degenerate_seeds == 13
    _assert_each_view_holds_its_own_seeds(suite, CONFIG)


def test_a_suite_of_views_too_short_indexes_nothing():
    index = build_index(_suite(("short", "a question", "an answer")), CONFIG)
    assert index.views == () and index.seeds.height == 0 and index.windows.height == 0
    assert index.num_items_unindexed == 1 and index.num_degenerate_seeds == 0


@pytest.mark.fuzz
@settings(max_examples=examples(60, 600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(st.tuples(st.lists(st.sampled_from(WORDS), max_size=30), st.lists(st.sampled_from(WORDS), max_size=20)),
                      max_size=8),
       fraction=st.sampled_from([0.3, 0.5, 0.7]))
def test_every_view_holds_the_seeds_it_gives_alone(items, fraction):
    suite = _suite(*((f"i{k}", " ".join(q) or "q", " ".join(a) or "a") for k, (q, a) in enumerate(items)))
    _assert_each_view_holds_its_own_seeds(suite, DecontamConfig(min_seed_ngram_size=2, min_view_words=4,
                                                                degenerate_fraction=fraction))
