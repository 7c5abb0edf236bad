"""Exact deduplication on normalised (NFC) text, under the deterministic keep order.

The keep order is the contamination tier (clean documents first, then those decontamination
cuts, then those it drops: a duplicate cluster's survivor is never a document decontamination
drops while a clean member exists), then the order of the manifest's data references, then the
document id. Of a group of identical texts the first document in that order is kept and the
others are recorded against it (similarity 1.0); identical texts have identical hits, so the
same tier. Texts are compared whole, never by hash alone, so no collision can remove a document.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

KEEP_ORDER = ["tier", "source_index", "doc_id"]
CLEAN_TIER = 0  # a document decontamination leaves alone; cut and drop are `clean.tiers_of`


@dataclass(frozen=True)
class ExactDedupCounts:
    num_input: int
    num_distinct_texts: int
    num_removed: int
    num_groups_with_copies: int


def in_keep_order(docs: pl.DataFrame, tiers: pl.DataFrame | None = None) -> pl.DataFrame:
    """Documents sorted by the keep order, with their position as `rank` (UInt32); `tiers`
    (doc_id, tier) names the contaminated ones, every other document is CLEAN_TIER."""
    tiered = docs.join(tiers.select("doc_id", "tier"), on="doc_id", how="left") if tiers is not None else docs.with_columns(pl.lit(None, dtype=pl.Int8).alias("tier"))
    return tiered.with_columns(pl.col("tier").fill_null(CLEAN_TIER)).sort(KEEP_ORDER).drop("tier").with_row_index("rank")


def exact_duplicates(docs: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, ExactDedupCounts]:
    """docs (with `rank`, in keep order) -> (representatives, copies, counters).

    `copies` has doc_id and `exact_copy_of` (the representative's doc id); representatives are the
    first of each group of identical texts and keep every column of `docs`.
    """
    groups = docs.with_columns(pl.col("doc_id").first().over("text").alias("exact_copy_of"))
    is_copy = pl.col("doc_id") != pl.col("exact_copy_of")
    representatives = groups.filter(~is_copy).drop("exact_copy_of")
    copies = groups.filter(is_copy).select("doc_id", "exact_copy_of")
    counts = ExactDedupCounts(
        num_input=docs.height,
        num_distinct_texts=representatives.height,
        num_removed=copies.height,
        num_groups_with_copies=copies["exact_copy_of"].n_unique() if copies.height else 0,
    )
    return representatives, copies, counts
