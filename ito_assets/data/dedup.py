"""Deduplication of a document frame: exact copies first, then near-duplicates among the rest.

Output is one row per input document (`dedup_state` kept / duplicate) with the kept document it
duplicates (`duplicate_of`, always a kept document), the cluster id (that kept document's id),
the method (exact / near) and the Jaccard similarity to the kept document. An exact copy of a
text whose representative was itself removed as a near-duplicate points at the same kept
document with the representative's similarity (identical texts have identical shingle sets).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ito_assets.data.config import DedupConfig
from ito_assets.data.exact_dedup import ExactDedupCounts, exact_duplicates, in_keep_order
from ito_assets.data.minhash import MinHasher
from ito_assets.data.near_dedup import NearDedupCounts, near_duplicates

KEPT = "kept"
DUPLICATE = "duplicate"
DEDUP_SCHEMA = {
    "doc_id": pl.String,
    "dedup_state": pl.String,
    "method": pl.String,
    "duplicate_of": pl.String,
    "cluster_id": pl.String,
    "similarity": pl.Float64,
    "exact_copy_of": pl.String,
}


@dataclass(frozen=True)
class DedupCounts:
    exact: ExactDedupCounts
    near: NearDedupCounts
    num_input: int
    num_kept: int
    num_removed: int

    @property
    def duplicate_rate(self) -> float:
        return self.num_removed / self.num_input if self.num_input else 0.0


def deduplicate(docs: pl.DataFrame, config: DedupConfig) -> tuple[pl.DataFrame, DedupCounts]:
    """docs (DOCUMENT_SCHEMA) -> (one decision row per document in DEDUP_SCHEMA, counters), in
    memory (`dedup_units` is the out-of-core equivalent)."""
    ordered = in_keep_order(docs)
    representatives, copies, exact_counts = exact_duplicates(ordered)
    hasher = MinHasher(num_perm=config.num_perm, seed=config.seed)
    signatures, shingles = hasher.signatures_of_texts(representatives["text"], config.shingle_size)
    removed, near_counts = near_duplicates(signatures, shingles, config)
    return decide(ordered["doc_id"], copies, representatives["doc_id"], removed, exact_counts, near_counts)


def decide(
    ordered_ids: pl.Series,
    copies: pl.DataFrame,
    representative_ids: pl.Series,
    removed: dict[int, tuple[int, float]],
    exact_counts: ExactDedupCounts,
    near_counts: NearDedupCounts,
) -> tuple[pl.DataFrame, DedupCounts]:
    """Every document's decision from the exact copies (doc_id, exact_copy_of) and the
    near-duplicate removals (by position among the representatives, in keep order)."""
    # Gathered by position in polars: a Python list of every representative's id would cost ~100
    # bytes per document in the out-of-core path, where nothing else holds the ids as objects.
    near = pl.DataFrame(
        {
            "doc_id": representative_ids.gather(list(removed)),
            "near_of": representative_ids.gather([k for k, _ in removed.values()]),
            "near_similarity": [s for _, s in removed.values()],
        },
        schema={"doc_id": pl.String, "near_of": pl.String, "near_similarity": pl.Float64},
    )
    decisions = (
        ordered_ids.to_frame("doc_id")
        .join(copies, on="doc_id", how="left", maintain_order="left")
        # A copy inherits its representative's fate; a representative has its own.
        .with_columns(pl.coalesce("exact_copy_of", "doc_id").alias("_representative"))
        .join(near.rename({"doc_id": "_representative"}), on="_representative", how="left", maintain_order="left")
        .with_columns(
            pl.when(pl.col("near_of").is_not_null()).then(pl.col("near_of"))
            .when(pl.col("exact_copy_of").is_not_null()).then(pl.col("exact_copy_of"))
            .alias("duplicate_of")
        )
        .with_columns(
            pl.when(pl.col("duplicate_of").is_null()).then(pl.lit(KEPT)).otherwise(pl.lit(DUPLICATE)).alias("dedup_state"),
            pl.when(pl.col("near_of").is_not_null()).then(pl.lit("near"))
            .when(pl.col("exact_copy_of").is_not_null()).then(pl.lit("exact"))
            .alias("method"),
            pl.when(pl.col("near_of").is_not_null()).then(pl.col("near_similarity"))
            .when(pl.col("exact_copy_of").is_not_null()).then(pl.lit(1.0))
            .alias("similarity"),
            pl.coalesce("duplicate_of", "doc_id").alias("cluster_id"),
        )
        .select(list(DEDUP_SCHEMA))
        .cast(DEDUP_SCHEMA)
    )
    num_input = len(ordered_ids)
    num_removed = decisions.filter(pl.col("dedup_state") == DUPLICATE).height
    counts = DedupCounts(exact=exact_counts, near=near_counts, num_input=num_input, num_kept=num_input - num_removed, num_removed=num_removed)
    return decisions, counts


def kept_documents(docs: pl.DataFrame, decisions: pl.DataFrame) -> pl.DataFrame:
    """The documents that survive deduplication, in keep order."""
    kept = decisions.filter(pl.col("dedup_state") == KEPT).select("doc_id")
    return in_keep_order(docs.join(kept, on="doc_id", how="semi")).drop("rank")
