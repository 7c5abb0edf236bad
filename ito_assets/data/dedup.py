"""Deduplication of a document frame: exact copies first, then near-duplicates among the rest.

Output is one row per input document (`dedup_state` kept / duplicate), with the user's own id
(`source_record_id`), the kept document it duplicates (`duplicate_of`, always a kept document),
the cluster id (that kept document's id), the method (exact / near), the Jaccard similarity to
the kept document, and the family id (`family_id`: the first document in keep order of its
connected component of verified pairs; its own id when it pairs with none). An exact copy of a
text whose representative was itself removed as a near-duplicate points at the same kept
document with the representative's similarity (identical texts have identical shingle sets),
and is in its representative's family.

The pieces here are what the streamed path (`dedup_units`, run by the data stage) assembles; the
whole-frame composition the tests check it against is the reference implementation in
tests/reference_impl.py, not a production path.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl
import pyarrow as pa

from ito_assets.data.exact_dedup import ExactDedupCounts
from ito_assets.data.near_dedup import Families, NearDedupCounts, Removals

KEPT = "kept"
DUPLICATE = "duplicate"
DEDUP_SCHEMA = {
    "doc_id": pl.String,
    "source_record_id": pl.String,
    "dedup_state": pl.String,
    "method": pl.String,
    "duplicate_of": pl.String,
    "cluster_id": pl.String,
    "similarity": pl.Float64,
    "exact_copy_of": pl.String,
    "family_id": pl.String,
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


# The near-duplicates' ids, from tables `keys` (rank, doc_id: every document), `copies` (doc_id,
# exact_copy_of) and `removals` (removed, kept, similarity: near-duplicates by position among the
# representatives, the documents that are no exact copy, in keep order). In DuckDB: the
# positions are numbered there, under the step's memory cap, and only the removals come back.
NEAR_SQL = """
WITH representatives AS (
    SELECT doc_id, row_number() OVER (ORDER BY rank) - 1 AS position FROM keys ANTI JOIN copies USING (doc_id)
)
SELECT CAST(r.doc_id AS VARCHAR) AS doc_id, CAST(k.doc_id AS VARCHAR) AS near_of, n.similarity AS near_similarity
FROM removals n JOIN representatives r ON r.position = n.removed JOIN representatives k ON k.position = n.kept
"""
NEAR_SCHEMA = {"doc_id": pl.String, "near_of": pl.String, "near_similarity": pl.Float64}
# The families' ids, from table `families` (member, root: positions among the representatives).
FAMILY_SQL = """
WITH representatives AS (
    SELECT doc_id, row_number() OVER (ORDER BY rank) - 1 AS position FROM keys ANTI JOIN copies USING (doc_id)
)
SELECT CAST(m.doc_id AS VARCHAR) AS doc_id, CAST(r.doc_id AS VARCHAR) AS family_of
FROM families f JOIN representatives m ON m.position = f.member JOIN representatives r ON r.position = f.root
"""
FAMILY_SCHEMA = {"doc_id": pl.String, "family_of": pl.String}


def near_ids(db: duckdb.DuckDBPyConnection, removals: Removals) -> pl.DataFrame:
    """NEAR_SQL's rows (NEAR_SCHEMA) for the removals, over the tables `keys` and `copies` of `db`."""
    db.register("removals", pa.table({"removed": removals.removed, "kept": removals.kept, "similarity": removals.similarity}))
    try:
        return db.execute(NEAR_SQL).pl().cast(NEAR_SCHEMA)
    finally:
        db.unregister("removals")


def family_ids(db: duckdb.DuckDBPyConnection, families: Families) -> pl.DataFrame:
    """FAMILY_SQL's rows (FAMILY_SCHEMA) for the families, over the tables `keys` and `copies` of `db`."""
    db.register("families", pa.table({"member": families.member, "root": families.root}))
    try:
        return db.execute(FAMILY_SQL).pl().cast(FAMILY_SCHEMA)
    finally:
        db.unregister("families")


def decide(ordered: pl.DataFrame, copies: pl.DataFrame, near: pl.DataFrame, families: pl.DataFrame) -> pl.DataFrame:
    """Decisions (DEDUP_SCHEMA) of documents `ordered` (doc_id, source_record_id; any slice of
    the keep order, in order), from all the exact copies (doc_id, exact_copy_of), near-duplicates
    (NEAR_SCHEMA) and family members (FAMILY_SCHEMA): only those are held whole, so the decisions
    can be made a batch of documents at a time."""
    return (
        ordered.select("doc_id", "source_record_id")
        .join(copies, on="doc_id", how="left", maintain_order="left")
        # A copy inherits its representative's fate and family; a representative has its own.
        .with_columns(pl.coalesce("exact_copy_of", "doc_id").alias("_representative"))
        .join(near.rename({"doc_id": "_representative"}), on="_representative", how="left", maintain_order="left")
        .join(families.rename({"doc_id": "_representative"}), on="_representative", how="left", maintain_order="left")
        .with_columns(
            pl.when(pl.col("near_of").is_not_null()).then(pl.col("near_of"))
            .when(pl.col("exact_copy_of").is_not_null()).then(pl.col("exact_copy_of"))
            .alias("duplicate_of")
        )
        .with_columns(
            pl.when(pl.col("duplicate_of").is_null()).then(pl.lit(KEPT)).otherwise(pl.lit(DUPLICATE)).alias("dedup_state"),
            # The method names the relation to `duplicate_of`, the kept document a removal points at:
            # an exact copy whose representative was removed as a near-duplicate is "near" (it points
            # at that near-duplicate's kept document, Jaccard below 1), and "exact" always means
            # byte-identical to `duplicate_of`. Its identical twin stays in `exact_copy_of`. Every
            # count of removals by method reads this column (lineage.removals_by_method).
            pl.when(pl.col("near_of").is_not_null()).then(pl.lit("near"))
            .when(pl.col("exact_copy_of").is_not_null()).then(pl.lit("exact"))
            .alias("method"),
            pl.when(pl.col("near_of").is_not_null()).then(pl.col("near_similarity"))
            .when(pl.col("exact_copy_of").is_not_null()).then(pl.lit(1.0))
            .alias("similarity"),
            pl.coalesce("duplicate_of", "doc_id").alias("cluster_id"),
            pl.coalesce("family_of", "_representative").alias("family_id"),
        )
        .select(list(DEDUP_SCHEMA))
        .cast(DEDUP_SCHEMA)
    )


def counts_of(exact: ExactDedupCounts, near: NearDedupCounts) -> DedupCounts:
    # Every exact copy is removed, and a representative exactly when it is a near-duplicate.
    num_removed = exact.num_removed + near.num_removed
    return DedupCounts(exact=exact, near=near, num_input=exact.num_input, num_kept=exact.num_input - num_removed, num_removed=num_removed)

