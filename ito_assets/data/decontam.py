"""Decontamination scan: find where eval items occur in documents.

1. Seeds (vectorised over the whole corpus): every word n-gram of every document is hashed and
   joined with the index's seeds of the same size.
2. Common seeds are ignored: a seed found in more than `common_min_docs` documents *and* more than
   `common_relative_factor` x the median document frequency of its view's seeds (GPT-3's rule,
   made safe for a benchmark copied into many documents: then every seed of the view is frequent).
3. Evidence: the matches of one view in one document are grouped into occurrences (a gap larger
   than the view's length starts a new one); an occurrence whose seeds cover at least
   `evidence_words` distinct words of the view is a hit.
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
from ito_assets.data.text import TokenHashes, hash_words, ngram_hashes, words_with_spans

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
_EMPTY_MATCHES = {"doc": pl.Int64, "doc_pos": pl.Int64, "seed": pl.UInt64, "n": pl.Int32, "view": pl.Int32, "view_pos": pl.Int32}


@dataclass(frozen=True)
class ScanCounts:
    num_documents: int
    num_seed_matches: int
    num_common_seeds_ignored: int
    num_candidate_documents: int
    num_contaminated_documents: int
    num_hits: int


def seed_matches(tokens: TokenHashes, index: EvalIndex) -> pl.DataFrame:
    """Every (document, position) where an index seed occurs: doc, doc_pos, seed, n, view, view_pos."""
    doc_of = tokens.doc_index()
    frames = []
    for n in index.seed_sizes:
        grams, starts = ngram_hashes(tokens, n)
        if len(grams) == 0:
            continue
        seeds = index.seeds.filter(pl.col("n") == n)
        found = pl.DataFrame({"seed": grams, "start": starts}).join(seeds, on="seed", how="inner")
        if found.height == 0:
            continue
        start = found["start"].to_numpy()
        doc = doc_of[start]
        frames.append(
            found.with_columns(doc=pl.Series(doc), doc_pos=pl.Series(start - tokens.offsets[doc])).select(list(_EMPTY_MATCHES))
        )
    return pl.concat(frames) if frames else pl.DataFrame(schema=_EMPTY_MATCHES)


def seed_frequency(matches: pl.DataFrame) -> pl.DataFrame:
    """Documents per seed (seed, num_docs). Units hold disjoint documents, so theirs add up."""
    return matches.group_by("seed").agg(pl.col("doc").n_unique().cast(pl.Int64).alias("num_docs"))


def common_seeds(frequency: pl.DataFrame, index: EvalIndex, config: DecontamConfig) -> pl.DataFrame:
    """(seed, view) pairs to ignore: frequent in the corpus and far above their view's median."""
    per_view = index.seeds.join(frequency, on="seed", how="left").with_columns(pl.col("num_docs").fill_null(0))
    median = per_view.group_by("view").agg(pl.col("num_docs").median().alias("median_docs"))
    return (
        per_view.join(median, on="view")
        .filter(
            (pl.col("num_docs") > config.common_min_docs)
            & (pl.col("num_docs") > config.common_relative_factor * pl.col("median_docs"))
        )
        .select("seed", "view")
        .unique()
        .sort("seed", "view")
    )


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
    ordered = matches.join(lengths, on="view").sort("doc", "view", "doc_pos")
    starts_new = (
        (pl.col("doc") != pl.col("doc").shift(1))
        | (pl.col("view") != pl.col("view").shift(1))
        | ((pl.col("doc_pos") - pl.col("doc_pos").shift(1)) > pl.col("view_len"))
    ).fill_null(True)
    grouped = ordered.with_columns(starts_new.cast(pl.UInt32).cum_sum().alias("occurrence"))
    covered = (
        grouped.with_columns(pl.int_ranges("view_pos", pl.col("view_pos") + pl.col("n")).alias("word"))
        .explode("word")
        .group_by("occurrence")
        .agg(pl.col("word").n_unique().alias("covered_words"))
    )
    return (
        grouped.group_by("occurrence")
        .agg(
            pl.col("doc").first(),
            pl.col("view").first(),
            pl.col("evidence").first(),
            pl.col("doc_pos").min().alias("doc_start"),
            (pl.col("doc_pos") + pl.col("n")).max().alias("doc_end"),
        )
        .join(covered, on="occurrence")
        .with_columns((pl.col("covered_words") >= pl.col("evidence")).alias("is_hit"))
        .drop("evidence")
    )


def _raw_agreement(doc_raw: list[str], view, matches: pl.DataFrame) -> int:
    """View positions whose raw word (digits kept) equals the document's at the matched place."""
    agree: set[int] = set()
    for doc_pos, view_pos, n in matches.select("doc_pos", "view_pos", "n").iter_rows():
        for k in range(n):
            if doc_pos + k < len(doc_raw) and doc_raw[doc_pos + k] == view.raw_words[view_pos + k]:
                agree.add(view_pos + k)
    return len(agree)


def _hits_in_document(doc_id: str, text: str, index: EvalIndex, ignored: pl.DataFrame, config: DecontamConfig) -> list[dict]:
    """The authoritative path for one document: tokens with spans, same seeds and evidence."""
    words, spans = words_with_spans(text, digits_normalized=True)
    raw = words_with_spans(text, digits_normalized=False)[0]
    tokens = TokenHashes(hash_words(pl.Series(words, dtype=pl.String)), np.array([0, len(words)], dtype=np.int64))
    matches = seed_matches(tokens, index).join(ignored, on=["seed", "view"], how="anti")
    found = occurrences(matches, index).filter(pl.col("is_hit"))
    hits = []
    for occurrence, view_number, start, end, covered in found.select("occurrence", "view", "doc_start", "doc_end", "covered_words").iter_rows():
        view = index.views[view_number]
        in_occurrence = matches.filter((pl.col("view") == view_number) & pl.col("doc_pos").is_between(start, end - 1))
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
    """The authoritative hits of the candidate documents (positions in `docs`), in HIT_SCHEMA."""
    ids, texts = docs["doc_id"], docs["text"]
    rows: list[dict] = []
    for doc in candidates:
        rows.extend(_hits_in_document(ids[doc], texts[doc], index, ignored, config))
    return pl.DataFrame(rows, schema=HIT_SCHEMA) if rows else pl.DataFrame(schema=HIT_SCHEMA)

