"""Exact deduplication on normalised (NFC) text, under the deterministic keep order.

The keep order is the order of the manifest's data references, then the document id: of a group
of identical texts the first document in that order is kept and the others are recorded against
it (similarity 1.0). Texts are compared whole, never by hash alone, so no collision can remove a
document.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

KEEP_ORDER = ["source_index", "doc_id"]


@dataclass(frozen=True)
class ExactDedupCounts:
    num_input: int
    num_distinct_texts: int
    num_removed: int
    num_groups_with_copies: int


def in_keep_order(docs: pl.DataFrame) -> pl.DataFrame:
    """Documents sorted by the keep order, with their position as `rank` (UInt32)."""
    return docs.sort(KEEP_ORDER).with_row_index("rank")


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
