"""The n-gram index of an eval suite: what decontamination looks for.

Every item gives up to three *views*: question + answer, the question alone, and the answer alone
when it is long enough to be distinctive (a one-word answer would match half the corpus). A view
is a list of normalised words (lower case, punctuation stripped, digits -> "0"). Its *seeds* are
its word n-grams of `config.seed_size(len(view))` words, each with its position in the view;
degenerate seeds (few distinct words, or mostly numbers, e.g. "0 0 0 0 0 0") never enter the index.

Where punctuation alone separates two words of a view ("unique(l: list)", "list(set(l))"), a copy
that deletes punctuation merges them ("uniquel list", "listset l") and every word seed across the
place is lost. Such views also get *join windows*: the `window_bytes` bytes of the view's words
written end to end from a word start, kept where the window crosses such a join (elsewhere the word
seeds see the same text). A document that merged words still has them from any word start it kept:
word boundaries are only ever removed. A window covers the view words wholly inside it. A second
view of joined words ("listsetl") would not do: it misses every stretch where a copy merged only
some of the joins ("listset l"), while the bytes from "list" on are the same whichever were
merged. (On benchmarks/decontam.py's merged plants both find every plant, their prose carrying
enough evidence; they differ on a code line merged in part: test_decontam_miss_classes.py.)

Views shorter than `min_view_words` are not indexed; an item with no indexed view is counted as
unprotected in the report (`num_items_unindexed`), never silently skipped.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from functools import cached_property

import numpy as np
import polars as pl

from ito_assets.data.completion import frame_digest
from ito_assets.data.config import DecontamConfig
from ito_assets.data.text import (DECONTAM_CUT_VERSION, TokenHashes, decontam_words, joins_between, ngram_hashes,
                                  window_full_words, window_hashes, window_words, word_tokens, words_of)
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
    windows: pl.DataFrame  # SEED_SCHEMA, join windows: n is the view words a window covers
    window_bytes: int
    view_tokens: TokenHashes  # the views' words, one "document" per view: ends of matches compare them

    @cached_property
    def digest(self) -> str:
        """SHA-256 of what a scan looks for: the views, their seeds and join windows."""
        body = hashlib.sha256(json.dumps([self.suite_digest, self.window_bytes, DECONTAM_CUT_VERSION, [asdict(v) for v in self.views]]).encode())
        return hashlib.sha256((body.hexdigest() + frame_digest(self.seeds) + frame_digest(self.windows)).encode()).hexdigest()

    @property
    def seed_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.seeds["n"].to_list())))

    def all_seeds(self) -> pl.DataFrame:
        """Word seeds and join windows: both count towards a view's seed frequencies."""
        return pl.concat([self.seeds, self.windows])

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


def _seeds(tokens: TokenHashes, words: list[tuple[str, ...]], sizes: np.ndarray, fraction: float) -> tuple[pl.DataFrame, int]:
    """Every view's non-degenerate seeds of its own size, in view then position order, and the
    number of degenerate ones: one pass over all the views' tokens per distinct seed size."""
    flat = [w for view in words for w in view]
    view_of = tokens.doc_index()
    frames, num_degenerate = [], 0
    for n in np.unique(sizes).tolist():
        grams, starts = ngram_hashes(tokens, n)
        ours = sizes[view_of[starts]] == n
        grams, starts = grams[ours], starts[ours]
        keep = np.array([not is_degenerate(flat[s : s + n], fraction) for s in starts.tolist()], dtype=bool)
        num_degenerate += int((~keep).sum())
        view = view_of[starts[keep]]
        frames.append(pl.DataFrame({"seed": grams[keep], "n": np.full(int(keep.sum()), n, dtype=np.int32),
                                    "view": view.astype(np.int32),
                                    "view_pos": (starts[keep] - tokens.offsets[view]).astype(np.int32)}, schema=SEED_SCHEMA))
    seeds = pl.concat(frames) if frames else pl.DataFrame(schema=SEED_SCHEMA)
    return seeds.sort(["view", "view_pos"]), num_degenerate


def _windows(views: list[View], joins: list[list[bool]], tokens: TokenHashes, config: DecontamConfig) -> pl.DataFrame:
    """The views' join windows: from each word start, `window_bytes` bytes that cross a join
    (punctuation without whitespace), cover at least one whole word and are not degenerate."""
    width = config.window_bytes
    hashes, starts = window_hashes(tokens, width)
    full = window_full_words(tokens, starts, width)
    touched = window_words(tokens, starts, width)
    words = [w for v in views for w in v.words]
    # Token t's join is with token t + 1; a view's last word joins nothing.
    joined = [j for view_joins in joins for j in [*view_joins, False]]
    keep = np.array(
        [
            covered >= 1 and any(joined[s : s + span - 1]) and not is_degenerate(words[s : s + span], config.degenerate_fraction)
            for s, covered, span in zip(starts.tolist(), full.tolist(), touched.tolist())
        ],
        dtype=bool,
    )
    view = tokens.doc_index()[starts[keep]]
    return pl.DataFrame(
        {
            "seed": hashes[keep],
            "n": full[keep].astype(np.int32),
            "view": view.astype(np.int32),
            "view_pos": (starts[keep] - tokens.offsets[view]).astype(np.int32),
        },
        schema=SEED_SCHEMA,
    )


def build_index(suite: EvalSuite, config: DecontamConfig) -> EvalIndex:
    """The suite's views, seeds and join windows. Views are cut one by one (the authoritative
    slow path, as matches are reported) and hashed all at once: the fixture suite (205 items) took
    263-280 ms when each view was hashed and framed alone, most of it polars' cost per call; 37-53
    ms so."""
    candidates: list[View] = []
    joins: list[list[bool]] = []
    for item in suite.items:
        for kind, text in _views_of(item, config):
            words, raw_words, spans = decontam_words(text)
            if len(words) < config.min_view_words:
                continue
            candidates.append(View(item_id=item.id, benchmark=item.benchmark, kind=kind, words=tuple(words),
                                   raw_words=tuple(raw_words), seed_size=config.seed_size(len(words)),
                                   evidence_words=config.evidence_words(len(words))))
            joins.append(joins_between(text, spans))
    sizes = np.array([v.seed_size for v in candidates], dtype=np.int64)
    seeds, num_degenerate = _seeds(word_tokens([v.words for v in candidates]), [v.words for v in candidates], sizes,
                                   config.degenerate_fraction)
    # A view all of whose seeds are degenerate is not indexed; the others are numbered in order.
    indexed = np.unique(seeds["view"].to_numpy())
    number = np.full(len(candidates), -1, dtype=np.int32)
    number[indexed] = np.arange(len(indexed), dtype=np.int32)
    seeds = seeds.with_columns(pl.Series("view", number[seeds["view"].to_numpy()], dtype=pl.Int32))
    views = [candidates[i] for i in indexed.tolist()]
    joins = [joins[i] for i in indexed.tolist()]
    indexed_items = {v.item_id for v in views}
    view_tokens = word_tokens([v.words for v in views])
    return EvalIndex(
        suite_id=suite.suite_id,
        suite_digest=suite.digest,
        views=tuple(views),
        seeds=seeds,
        num_items=len(suite.items),
        num_items_unindexed=len(suite.items) - len(indexed_items),
        num_degenerate_seeds=num_degenerate,
        windows=_windows(views, joins, view_tokens, config),
        window_bytes=config.window_bytes,
        view_tokens=view_tokens,
    )
