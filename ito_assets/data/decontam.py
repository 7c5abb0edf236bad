"""Decontamination scan: find where eval items occur in documents.

1. Seeds (vectorised over the whole corpus): every word n-gram of every document is hashed and
   joined with the index's seeds of the same size, and the bytes from every word start with the
   index's join windows (eval_index). A seed that ends (starts) fewer than a seed's words plus
   one from its view's end (start) also counts the view's last (first) words that the document
   holds next to it, aligned or one word off: the words past an edit near an end (`_ends`).
2. Common seeds are ignored: a seed found in more than `common_min_docs` documents *and* more than
   `common_relative_factor` x the median document frequency of its view's seeds (GPT-3's rule,
   made safe for a benchmark copied into many documents: then every seed of the view is frequent).
3. Evidence: the matches of one view in one document are grouped into occurrences (a gap larger
   than the view's length starts a new one); an occurrence whose seeds, windows and ends cover at
   least `evidence_words` distinct words of the view is a hit.
4. Documents with a hit are re-tokenised one by one with character spans (the authoritative path):
   each hit gets its offsets, the matched words, its overlap ratio (covered words / view length),
   and overlapping hits of different items keep only the items whose raw words (digits kept)
   agree best, so that template siblings differing only in numbers are not all blamed.

The steps here are what the streamed scan (`decontam_units`, run by the data stage) assembles; the
whole-frame composition the tests check it against is the reference implementation in
tests/reference_impl.py, not a production path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ito_assets.data.config import DecontamConfig
from ito_assets.data.eval_index import EvalIndex
from ito_assets.data.text import TokenHashes, decontam_words, ngram_hashes, window_hashes, window_words, word_tokens

HIT_SCHEMA = {
    "doc_id": pl.String,
    "eval_item_id": pl.String,
    "benchmark": pl.String,
    "view": pl.String,
    "matched_ngram": pl.String,
    "char_start": pl.Int64,
    "char_end": pl.Int64,
    "covered_words": pl.Int32,
    "view_words": pl.Int32,
    "overlap_ratio": pl.Float64,
}
# A match covers view words [view_pos, view_pos + n), the view's first `head` and last `tail` words,
# and document words [doc_start, doc_end).
_EMPTY_MATCHES = {"doc": pl.Int64, "doc_pos": pl.Int64, "seed": pl.UInt64, "n": pl.Int32, "view": pl.Int32, "view_pos": pl.Int32,
                  "head": pl.Int32, "tail": pl.Int32, "doc_start": pl.Int64, "doc_end": pl.Int64}
# Where a view's words are looked for past an edit: aligned (a word replaced), then one word
# earlier (the copy dropped one) or later (it inserted one).
_SHIFTS = (0, -1, 1)


@dataclass(frozen=True)
class ScanCounts:
    num_documents: int
    num_seed_matches: int
    num_common_seeds_ignored: int
    num_candidate_documents: int
    num_contaminated_documents: int
    num_hits: int


def seed_matches(tokens: TokenHashes, index: EvalIndex) -> pl.DataFrame:
    """Every (document, position) where an index seed or join window occurs, with what it covers
    (_EMPTY_MATCHES): doc, doc_pos, seed, n, view, view_pos, head, tail, doc_start, doc_end."""
    doc_of = tokens.doc_index()
    frames = [_word_matches(tokens, index, n, doc_of) for n in index.seed_sizes]
    frames.append(_window_matches(tokens, index, doc_of))
    frames = [f for f in frames if f.height]
    return pl.concat(frames) if frames else pl.DataFrame(schema=_EMPTY_MATCHES)


def _word_matches(tokens: TokenHashes, index: EvalIndex, n: int, doc_of: np.ndarray) -> pl.DataFrame:
    grams, starts = ngram_hashes(tokens, n)
    found = pl.DataFrame({"seed": grams, "start": starts}).join(index.seeds.filter(pl.col("n") == n), on="seed", how="inner")
    if found.height == 0:
        return pl.DataFrame(schema=_EMPTY_MATCHES)
    start = found["start"].to_numpy()
    doc = doc_of[start]
    found = found.with_columns(doc=pl.Series(doc), doc_pos=pl.Series(start - tokens.offsets[doc]))
    return _ends(found, tokens, index).select(list(_EMPTY_MATCHES))


def _window_matches(tokens: TokenHashes, index: EvalIndex, doc_of: np.ndarray) -> pl.DataFrame:
    """Join windows: the document side covers the words the window touches (fewer than the view's
    where the copy merged words)."""
    if index.windows.height == 0 or tokens.chars is None:
        return pl.DataFrame(schema=_EMPTY_MATCHES)
    grams, starts = window_hashes(tokens, index.window_bytes)
    found = pl.DataFrame({"seed": grams, "start": starts}).join(index.windows, on="seed", how="inner")
    if found.height == 0:
        return pl.DataFrame(schema=_EMPTY_MATCHES)
    start = found["start"].to_numpy()
    doc = doc_of[start]
    doc_pos = start - tokens.offsets[doc]
    return found.with_columns(
        doc=pl.Series(doc),
        doc_pos=pl.Series(doc_pos),
        head=pl.lit(0, pl.Int32),
        tail=pl.lit(0, pl.Int32),
        doc_start=pl.Series(doc_pos),
        doc_end=pl.Series(doc_pos + window_words(tokens, start, index.window_bytes)),
    ).select(list(_EMPTY_MATCHES))


def _ends(found: pl.DataFrame, tokens: TokenHashes, index: EvalIndex) -> pl.DataFrame:
    """Adds head, tail, doc_start and doc_end to word seed matches. A seed that leaves 1..n words
    before its view's end (an edit, then fewer words than a seed) counts the longest suffix of the
    view that the document holds contiguously after the seed, at the seed's alignment shifted by
    _SHIFTS; a seed that leaves 1..n words after the view's start, the longest prefix before it.
    No seed fits in such a tail, so without this one edit near the end of a short view leaves it a
    word short. The two sides' word hashes are compared directly, at most 3 x n places a match."""
    doc, doc_pos = found["doc"].to_numpy(), found["doc_pos"].to_numpy()
    view, view_pos, n = found["view"].to_numpy(), found["view_pos"].to_numpy().astype(np.int64), found["n"].to_numpy().astype(np.int64)
    view_len = index.view_tokens.lengths[view]
    align = doc_pos - view_pos  # where the seed puts the view's first word in the document
    tail, tail_shift = _end_run(tokens, index, doc, view, align, view_len - view_pos - n, n, doc_pos + n, from_end=True)
    head, head_shift = _end_run(tokens, index, doc, view, align, view_pos, n, doc_pos, from_end=False)
    return found.with_columns(
        head=pl.Series(head, dtype=pl.Int32),
        tail=pl.Series(tail, dtype=pl.Int32),
        doc_start=pl.Series(np.where(head > 0, align + head_shift, doc_pos)),
        doc_end=pl.Series(np.where(tail > 0, align + tail_shift + view_len, doc_pos + n)),
    )


def _end_run(tokens: TokenHashes, index: EvalIndex, doc: np.ndarray, view: np.ndarray, align: np.ndarray, gap: np.ndarray, n: np.ndarray, bound: np.ndarray, *, from_end: bool) -> tuple[np.ndarray, np.ndarray]:
    """(words, shift) per match: the longest run of view words that ends at the view's end
    (from_end) or starts at its start, within the `gap` words the seed leaves there (1..n), that
    the document holds at `align` + shift, beyond the seed (from `bound` on, or before it)."""
    best = np.zeros(len(doc), dtype=np.int64)
    best_shift = np.zeros(len(doc), dtype=np.int64)
    rows = np.flatnonzero((gap >= 1) & (gap <= n))
    if len(rows) == 0:
        return best, best_shift
    doc, view, align, gap, bound = doc[rows, None], view[rows, None], align[rows, None], gap[rows, None], bound[rows, None]
    step = np.arange(int(n[rows].max()), dtype=np.int64)[None, :]
    view_at = index.view_tokens.lengths[view] - 1 - step if from_end else step  # outermost word first
    inside = step < gap
    view_words = index.view_tokens.hashes[index.view_tokens.offsets[view] + np.where(inside, view_at, 0)]
    found, found_shift = best[rows], best_shift[rows]
    for shift in _SHIFTS:
        at = view_at + align + shift
        ok = inside & ((at >= bound) if from_end else (at < bound)) & (at >= 0) & (at < tokens.lengths[doc])
        same = ok & (tokens.hashes[tokens.offsets[doc] + np.where(ok, at, 0)] == view_words)
        run = np.cumprod(same, axis=1).sum(axis=1)
        found_shift = np.where(run > found, shift, found_shift)
        found = np.maximum(run, found)
    best[rows], best_shift[rows] = found, found_shift
    return best, best_shift


def seed_frequency(matches: pl.DataFrame) -> pl.DataFrame:
    """Documents per seed (seed, num_docs). Units hold disjoint documents, so theirs add up."""
    return matches.group_by("seed").agg(pl.col("doc").n_unique().cast(pl.Int64).alias("num_docs"))


def common_seeds(frequency: pl.DataFrame, index: EvalIndex, config: DecontamConfig) -> pl.DataFrame:
    """(seed, view) pairs to ignore: frequent in the corpus and far above their view's median.
    The median is of the view's word seeds: join windows are judged by it but do not move it (they
    sit only around joins and are rarely seen, so they would halve a code item's median and make
    its shared phrasing common)."""
    median = _counted(index.seeds, frequency).group_by("view").agg(pl.col("num_docs").median().alias("median_docs"))
    return (
        _counted(index.all_seeds(), frequency)
        .join(median, on="view")
        .filter(
            (pl.col("num_docs") > config.common_min_docs)
            & (pl.col("num_docs") > config.common_relative_factor * pl.col("median_docs"))
        )
        .select("seed", "view")
        .unique()
        .sort("seed", "view")
    )


def _counted(seeds: pl.DataFrame, frequency: pl.DataFrame) -> pl.DataFrame:
    return seeds.join(frequency, on="seed", how="left").with_columns(pl.col("num_docs").fill_null(0))


def occurrences(matches: pl.DataFrame, index: EvalIndex) -> pl.DataFrame:
    """Group matches into occurrences and measure each: doc, view, occurrence, covered_words,
    doc_start and doc_end (word positions), and whether the evidence suffices."""
    if matches.height == 0:
        return pl.DataFrame(schema={"doc": pl.Int64, "view": pl.Int32, "occurrence": pl.UInt32, "covered_words": pl.UInt32, "doc_start": pl.Int64, "doc_end": pl.Int64, "is_hit": pl.Boolean})
    lengths = pl.DataFrame(
        {
            "view": np.arange(len(index.views), dtype=np.int32),
            "view_len": index.view_lengths(),
            "evidence": np.array([v.evidence_words for v in index.views], dtype=np.int32),
        }
    )
    ordered = _with_extents(matches).join(lengths, on="view").sort("doc", "view", "doc_pos")
    starts_new = (
        (pl.col("doc") != pl.col("doc").shift(1))
        | (pl.col("view") != pl.col("view").shift(1))
        | ((pl.col("doc_pos") - pl.col("doc_pos").shift(1)) > pl.col("view_len"))
    ).fill_null(True)
    grouped = ordered.with_columns(starts_new.cast(pl.UInt32).cum_sum().alias("occurrence"))
    words = pl.concat_list(
        pl.int_ranges("view_pos", pl.col("view_pos") + pl.col("n"), dtype=pl.Int64),
        pl.int_ranges(0, "head", dtype=pl.Int64),
        pl.int_ranges(pl.col("view_len") - pl.col("tail"), "view_len", dtype=pl.Int64),
    )
    covered = grouped.with_columns(words.alias("word")).explode("word").drop_nulls("word").group_by("occurrence").agg(pl.col("word").n_unique().alias("covered_words"))
    return (
        grouped.group_by("occurrence")
        .agg(
            pl.col("doc").first(),
            pl.col("view").first(),
            pl.col("evidence").first(),
            pl.col("doc_start").min(),
            pl.col("doc_end").max(),
        )
        .join(covered, on="occurrence")
        .with_columns((pl.col("covered_words") >= pl.col("evidence")).alias("is_hit"))
        .drop("evidence")
    )


def _with_extents(matches: pl.DataFrame) -> pl.DataFrame:
    """Matches built without head, tail and document extent (a seed alone) get a seed's."""
    if "head" in matches.columns:
        return matches
    return matches.with_columns(
        head=pl.lit(0, pl.Int32), tail=pl.lit(0, pl.Int32), doc_start=pl.col("doc_pos"), doc_end=pl.col("doc_pos") + pl.col("n")
    )


_AGREEMENT_COLUMNS = ("view", "doc_pos", "view_pos", "n", "head", "tail", "doc_start", "doc_end")


def _raw_agreement(doc_raw: list[str], view, rows: list[list[int]]) -> int:
    """View positions whose raw word (digits kept) equals the document's at the matched place:
    the seed's words, and the head and tail words counted with it. `rows`: the occurrence's
    matches as (doc_pos, view_pos, n, head, tail, doc_start, doc_end)."""
    agree: set[int] = set()
    for doc_pos, view_pos, n, head, tail, doc_start, doc_end in rows:
        pairs = [(doc_pos + k, view_pos + k) for k in range(n)]
        pairs += [(doc_start + k, k) for k in range(head)]
        pairs += [(doc_end - tail + k, view.length - tail + k) for k in range(tail)]
        agree.update(v for d, v in pairs if d < len(doc_raw) and doc_raw[d] == view.raw_words[v])
    return len(agree)


def _document_hits(doc_id: str, words: list[str], spans: list[tuple[int, int]], raw: list[str], found: pl.DataFrame,
                   matches: pl.DataFrame, index: EvalIndex, config: DecontamConfig) -> list[dict]:
    """One document's hits from its sufficient occurrences (`found`) and its matches."""
    hits = []
    # The matches as one integer array, filtered per occurrence in numpy: a polars filter per
    # occurrence cost ~0.4 ms, most of the authoritative path's time.
    table = matches.select(_AGREEMENT_COLUMNS).to_numpy().astype(np.int64, copy=False)
    for view_number, start, end, covered in found.select("view", "doc_start", "doc_end", "covered_words").iter_rows():
        view = index.views[view_number]
        in_occurrence = table[(table[:, 0] == view_number) & (table[:, 1] >= start) & (table[:, 1] <= end - 1), 1:].tolist()
        hits.append(
            {
                "doc_id": doc_id,
                "eval_item_id": view.item_id,
                "benchmark": view.benchmark,
                "view": view.kind,
                "matched_ngram": " ".join(words[start : min(end, start + config.ngram_size)]),
                "char_start": spans[start][0],
                "char_end": spans[end - 1][1],
                "covered_words": covered,
                "view_words": view.length,
                "overlap_ratio": covered / view.length,
                "_raw": _raw_agreement(raw, view, in_occurrence),
            }
        )
    return _attribute(hits)


def _overlap(a: dict, b: dict) -> bool:
    return a["char_start"] < b["char_end"] and b["char_start"] < a["char_end"]


def _attribute(hits: list[dict]) -> list[dict]:
    """One hit per item and place (its best view); where hits of different items overlap, keep the
    items with the most raw-word agreement (ties keep all)."""
    best: list[dict] = []
    for hit in sorted(hits, key=lambda h: (-h["covered_words"], h["view"], h["char_start"])):
        if not any(h["eval_item_id"] == hit["eval_item_id"] and _overlap(h, hit) for h in best):
            best.append(hit)
    kept = [h for h in best if h["_raw"] >= max(r["_raw"] for r in best if _overlap(r, h))]
    return sorted(({k: v for k, v in h.items() if k != "_raw"} for h in kept), key=lambda h: (h["char_start"], h["eval_item_id"]))


def candidate_documents(matches: pl.DataFrame, ignored: pl.DataFrame, index: EvalIndex) -> list[int]:
    """Documents (positions) with at least one hit on the fast path, in order."""
    useful = matches.join(ignored, on=["seed", "view"], how="anti")
    return occurrences(useful, index).filter(pl.col("is_hit"))["doc"].unique().sort().to_list()


def hits_of(candidates: list[int], docs: pl.DataFrame, index: EvalIndex, ignored: pl.DataFrame, config: DecontamConfig) -> pl.DataFrame:
    """The authoritative hits of the candidate documents (positions in `docs`), in HIT_SCHEMA:
    their words re-read with character spans, the same seeds and evidence rule. The candidates'
    seeds and occurrences are found together, in one pass over all of them (per document they
    cost ~17 ms of small queries each); each document's hits are then assembled alone."""
    ids, texts = docs["doc_id"], docs["text"]
    parsed = [decontam_words(texts[doc]) for doc in candidates]
    tokens = word_tokens([words for words, _, _ in parsed])
    matches = seed_matches(tokens, index).join(ignored, on=["seed", "view"], how="anti")
    found = occurrences(matches, index).filter(pl.col("is_hit"))
    found_by_doc = found.partition_by("doc", as_dict=True) if found.height else {}
    matches_by_doc = matches.partition_by("doc", as_dict=True) if matches.height else {}
    rows: list[dict] = []
    for position, doc in enumerate(candidates):
        if (position,) not in found_by_doc:
            continue
        words, raw, spans = parsed[position]
        rows.extend(_document_hits(ids[doc], words, spans, raw, found_by_doc[(position,)], matches_by_doc[(position,)], index, config))
    return pl.DataFrame(rows, schema=HIT_SCHEMA) if rows else pl.DataFrame(schema=HIT_SCHEMA)

