"""The n-gram index of an eval suite: what decontamination looks for.

Every item gives up to three *views*: question + answer, the question alone, and the answer alone
when it is long enough to be distinctive (a one-word answer would match half the corpus). A view
is a list of normalised words (lower case, punctuation stripped, digits -> "0"). Its *seeds* are
its word n-grams of `config.seed_size(len(view))` words, each with its position in the view;
degenerate seeds (few distinct words, or mostly numbers, e.g. "0 0 0 0 0 0") never enter the index.

Views shorter than `min_view_words` are not indexed; an item with no indexed view is counted as
unprotected in the report (`num_items_unindexed`), never silently skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ito_assets.data.config import DecontamConfig
from ito_assets.data.text import TokenHashes, hash_words, ngram_hashes, words_of
from ito_assets.evals.suite import EvalSuite

QUESTION_ANSWER = "question_answer"
QUESTION = "question"
ANSWER = "answer"
NUMBER_TOKEN = "0"  # what digit normalisation turns every run of digits into

SEED_SCHEMA = {"seed": pl.UInt64, "n": pl.Int32, "view": pl.Int32, "view_pos": pl.Int32}


@dataclass(frozen=True)
class View:
    item_id: str
    benchmark: str
    kind: str
    words: tuple[str, ...]  # normalised, digits -> "0"
    raw_words: tuple[str, ...]  # lower case, digits kept: breaks ties between template siblings
    seed_size: int
    evidence_words: int

    @property
    def length(self) -> int:
        return len(self.words)


@dataclass(frozen=True)
class EvalIndex:
    suite_id: str
    suite_digest: str
    views: tuple[View, ...]
    seeds: pl.DataFrame  # SEED_SCHEMA: one row per (seed hash, view, position)
    num_items: int
    num_items_unindexed: int
    num_degenerate_seeds: int

    @property
    def seed_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.seeds["n"].to_list())))

    def view_lengths(self) -> np.ndarray:
        return np.array([v.length for v in self.views], dtype=np.int32)


def is_degenerate(words: list[str] | tuple[str, ...], fraction: float) -> bool:
    """Too few distinct words, or too many numbers: such n-grams are runs of zeros, digit tables,
    hex padding or repeated lines, and they match without any shared meaning."""
    n = len(words)
    numbers = sum(1 for w in words if w.isdigit() or w == NUMBER_TOKEN)
    return len(set(words)) < fraction * n or numbers > fraction * n


def _views_of(item, config: DecontamConfig) -> list[tuple[str, str]]:
    views = [(QUESTION_ANSWER, f"{item.question}\n{item.answer}"), (QUESTION, item.question)]
    if len(words_of(item.answer, digits_normalized=True)) >= config.min_answer_words:
        views.append((ANSWER, item.answer))
    return views


def _seeds_of(view_number: int, words: list[str], n: int, fraction: float) -> tuple[pl.DataFrame, int]:
    hashes = hash_words(pl.Series(words, dtype=pl.String))
    grams, starts = ngram_hashes(TokenHashes(hashes, np.array([0, len(words)], dtype=np.int64)), n)
    keep = np.array([not is_degenerate(words[s : s + n], fraction) for s in starts.tolist()], dtype=bool)
    frame = pl.DataFrame(
        {
            "seed": grams[keep],
            "n": np.full(int(keep.sum()), n, dtype=np.int32),
            "view": np.full(int(keep.sum()), view_number, dtype=np.int32),
            "view_pos": starts[keep].astype(np.int32),
        },
        schema=SEED_SCHEMA,
    )
    return frame, int((~keep).sum())


def build_index(suite: EvalSuite, config: DecontamConfig) -> EvalIndex:
    views: list[View] = []
    frames: list[pl.DataFrame] = []
    num_degenerate = 0
    indexed_items: set[str] = set()
    for item in suite.items:
        for kind, text in _views_of(item, config):
            words = words_of(text, digits_normalized=True)
            if len(words) < config.min_view_words:
                continue
            n = config.seed_size(len(words))
            frame, degenerate = _seeds_of(len(views), words, n, config.degenerate_fraction)
            num_degenerate += degenerate
            if frame.height == 0:
                continue
            views.append(
                View(
                    item_id=item.id,
                    benchmark=item.benchmark,
                    kind=kind,
                    words=tuple(words),
                    raw_words=tuple(words_of(text, digits_normalized=False)),
                    seed_size=n,
                    evidence_words=config.evidence_words(len(words)),
                )
            )
            frames.append(frame)
            indexed_items.add(item.id)
    seeds = pl.concat(frames) if frames else pl.DataFrame(schema=SEED_SCHEMA)
    return EvalIndex(
        suite_id=suite.suite_id,
        suite_digest=suite.digest,
        views=tuple(views),
        seeds=seeds,
        num_items=len(suite.items),
        num_items_unindexed=len(suite.items) - len(indexed_items),
        num_degenerate_seeds=num_degenerate,
    )
