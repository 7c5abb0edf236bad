"""Deduplication of a document frame: exact copies first, then near-duplicates among the rest.

Output is one row per input document (`dedup_state` kept / duplicate) with the kept document it
duplicates (`duplicate_of`, always a kept document), the cluster id (that kept document's id),
the method (exact / near) and the Jaccard similarity to the kept document. An exact copy of a
text whose representative was itself removed as a near-duplicate points at the same kept
document with the representative's similarity (identical texts have identical shingle sets).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl
import pyarrow as pa

from ito_assets.data.config import DedupConfig
from ito_assets.data.exact_dedup import ExactDedupCounts, exact_duplicates, in_keep_order
from ito_assets.data.minhash import MinHasher
from ito_assets.data.near_dedup import NearDedupCounts, Removals, near_duplicates
from ito_assets.data.units import READ_BATCH_ROWS

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


# Every document's decision, in keep order, from tables `keys` (rank, doc_id: every document),
# `copies` (doc_id, exact_copy_of) and `removals` (removed, kept, similarity: near-duplicates by
# position among the representatives, the documents that are no exact copy, in keep order). A
# copy inherits its representative's fate; a representative has its own. In DuckDB, under the
# step's memory cap, so that no per-document frame is held in Python.
DECISIONS_SQL = f"""
WITH representatives AS (
    SELECT doc_id, row_number() OVER (ORDER BY rank) - 1 AS position FROM keys ANTI JOIN copies USING (doc_id)
),
near AS (
    SELECT r.doc_id, k.doc_id AS near_of, n.similarity AS near_similarity
    FROM removals n JOIN representatives r ON r.position = n.removed JOIN representatives k ON k.position = n.kept
),
joined AS (
    SELECT keys.rank, keys.doc_id, c.exact_copy_of, near.near_of, near.near_similarity
    FROM keys LEFT JOIN copies c USING (doc_id) LEFT JOIN near ON near.doc_id = coalesce(c.exact_copy_of, keys.doc_id)
)
SELECT CAST(doc_id AS VARCHAR) AS doc_id,
       CASE WHEN coalesce(near_of, exact_copy_of) IS NULL THEN '{KEPT}' ELSE '{DUPLICATE}' END AS dedup_state,
       CASE WHEN near_of IS NOT NULL THEN 'near' WHEN exact_copy_of IS NOT NULL THEN 'exact' END AS method,
       coalesce(near_of, exact_copy_of) AS duplicate_of,
       coalesce(near_of, exact_copy_of, doc_id) AS cluster_id,
       CASE WHEN near_of IS NOT NULL THEN near_similarity WHEN exact_copy_of IS NOT NULL THEN CAST(1.0 AS DOUBLE) END AS similarity,
       CAST(exact_copy_of AS VARCHAR) AS exact_copy_of
FROM joined ORDER BY rank
"""


def deduplicate(docs: pl.DataFrame, config: DedupConfig) -> tuple[pl.DataFrame, DedupCounts]:
    """docs (DOCUMENT_SCHEMA) -> (one decision row per document in DEDUP_SCHEMA, counters), in
    memory (`dedup_units` is the out-of-core equivalent)."""
    ordered = in_keep_order(docs)
    representatives, copies, exact_counts = exact_duplicates(ordered)
    hasher = MinHasher(num_perm=config.num_perm, seed=config.seed)
    signatures, shingles = hasher.signatures_of_texts(representatives["text"], config.shingle_size)
    removals, near_counts = near_duplicates(signatures, shingles, config)
    with duckdb.connect() as db:
        db.register("keys", ordered.select("rank", "doc_id"))
        db.register("copies", copies)
        decisions = pl.from_arrow(decision_batches(db, removals, READ_BATCH_ROWS).read_all())
    return decisions.cast(DEDUP_SCHEMA), counts_of(exact_counts, near_counts)


def decision_batches(db: duckdb.DuckDBPyConnection, removals: Removals, batch_rows: int) -> pa.RecordBatchReader:
    """Every document's decision (DEDUP_SCHEMA) in keep order, `batch_rows` at a time, from the
    tables `keys` and `copies` of `db` and the near-duplicate removals."""
    db.register("removals", pa.table({"removed": removals.removed, "kept": removals.kept, "similarity": removals.similarity}))
    return db.execute(DECISIONS_SQL).fetch_record_batch(batch_rows)


def counts_of(exact: ExactDedupCounts, near: NearDedupCounts) -> DedupCounts:
    # Every exact copy is removed, and a representative exactly when it is a near-duplicate.
    num_removed = exact.num_removed + near.num_removed
    return DedupCounts(exact=exact, near=near, num_input=exact.num_input, num_kept=exact.num_input - num_removed, num_removed=num_removed)


def kept_documents(docs: pl.DataFrame, decisions: pl.DataFrame) -> pl.DataFrame:
    """The documents that survive deduplication, in keep order."""
    kept = decisions.filter(pl.col("dedup_state") == KEPT).select("doc_id")
    return in_keep_order(docs.join(kept, on="doc_id", how="semi")).drop("rank")
