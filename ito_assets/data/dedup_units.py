"""Deduplication out of core, over byte-sized work units: the same decisions as
`dedup.deduplicate`, with memory bounded by the units and DuckDB's cap rather than the corpus.

1. DuckDB ranks the source shards in keep order and groups identical texts (whole texts, never
   hashes) under its memory cap; the first of each group is the representative, as in
   `exact_dedup`.
2. The representatives, in keep order, are cut into work units of about `unit_bytes`; each unit's
   shingles, MinHash signatures and band rows are computed by a worker alone and written to the
   scratch folder (`signature_unit`).
3. `band_join` finds, verifies and settles the near-duplicates from those files.
4. The kept documents are streamed back out of DuckDB in keep order (`kept_frames`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ito_assets.data.band_join import UnitArrays, near_duplicates_out_of_core
from ito_assets.data.config import DedupConfig
from ito_assets.data.dedup import KEPT, DedupCounts, decide
from ito_assets.data.exact_dedup import ExactDedupCounts
from ito_assets.data.minhash import MinHasher
from ito_assets.data.near_dedup import band_rows
from ito_assets.data.scratch import Scratch, sql_list
from ito_assets.data.sources import DOCUMENT_SCHEMA
from ito_assets.data.units import READ_BATCH_ROWS, WorkUnit, map_units, worker_pool, write_units

RANK_SQL = """
CREATE OR REPLACE TABLE ranked AS
SELECT row_number() OVER (ORDER BY source_index, doc_id) - 1 AS rank, * FROM read_parquet({files})
"""
# The first document of each group of identical texts, in keep order, as exact_dedup decides it.
GROUP_SQL = """
CREATE OR REPLACE TABLE grouped AS
SELECT rank, doc_id, first_value(doc_id) OVER (PARTITION BY text ORDER BY rank) AS first_id FROM ranked
"""
REPRESENTATIVES_SQL = """
SELECT r.doc_id, r.text FROM ranked r SEMI JOIN (SELECT rank FROM grouped WHERE doc_id = first_id) f USING (rank)
ORDER BY r.rank
"""


@dataclass(frozen=True)
class SignatureTask:
    unit: WorkUnit
    folder: str
    config: DedupConfig


def signature_unit(task: SignatureTask) -> None:
    """One unit's shingle lists, signatures and band rows, written beside the unit."""
    config, unit, folder = task.config, task.unit, Path(task.folder)
    hasher = MinHasher(num_perm=config.num_perm, seed=config.seed)
    signatures, shingles = hasher.signatures_of_texts(unit.read(["text"])["text"], config.shingle_size)
    np.save(folder / f"signatures-{unit.index:05d}.npy", signatures)
    np.save(folder / f"shingles-{unit.index:05d}.npy", shingles.hashes)
    np.save(folder / f"offsets-{unit.index:05d}.npy", shingles.offsets)
    band_rows(signatures, config.bands, config.rows, first=unit.first).write_parquet(folder / f"bands-{unit.index:05d}.parquet")


def _frames(scratch: Scratch, sql: str) -> Iterator[pl.DataFrame]:
    for batch in scratch.db.execute(sql).fetch_record_batch(READ_BATCH_ROWS):
        yield pl.from_arrow(batch)


def exact_groups(scratch: Scratch, shard_paths: Sequence[str]) -> tuple[pl.Series, pl.DataFrame, pl.Series, ExactDedupCounts]:
    """-> (every doc id in keep order, copies (doc_id, exact_copy_of), representative ids in keep
    order, counters); leaves the `ranked` and `grouped` tables in the scratch database."""
    db = scratch.db
    db.execute(RANK_SQL.format(files=sql_list(shard_paths)))
    db.execute(GROUP_SQL)
    ordered = db.execute("SELECT doc_id FROM ranked ORDER BY rank").pl()["doc_id"].cast(pl.String)
    copies = db.execute("SELECT doc_id, first_id AS exact_copy_of FROM grouped WHERE doc_id <> first_id").pl().cast(pl.String)
    representatives = db.execute("SELECT doc_id FROM grouped WHERE doc_id = first_id ORDER BY rank").pl()["doc_id"].cast(pl.String)
    counts = ExactDedupCounts(
        num_input=len(ordered),
        num_distinct_texts=len(representatives),
        num_removed=copies.height,
        num_groups_with_copies=copies["exact_copy_of"].n_unique() if copies.height else 0,
    )
    return ordered, copies, representatives, counts


def deduplicate_units(scratch: Scratch, shard_paths: Sequence[str], config: DedupConfig) -> tuple[pl.DataFrame, DedupCounts]:
    """Source shards -> (one decision row per document in DEDUP_SCHEMA, counters)."""
    ordered, copies, representatives, exact_counts = exact_groups(scratch, shard_paths)
    units = write_units(_frames(scratch, REPRESENTATIVES_SQL), scratch.sub("dedup-units"), scratch.scale.unit_bytes)
    folder = scratch.sub("dedup-arrays")
    with worker_pool(scratch.scale.num_workers) as pool:
        map_units(signature_unit, [SignatureTask(unit=u, folder=str(folder), config=config) for u in units], pool)
    band_files = [str(folder / f"bands-{u.index:05d}.parquet") for u in units]
    arrays = UnitArrays(folder, [u.first for u in units])
    removed, near_counts = near_duplicates_out_of_core(scratch.db, band_files, arrays, len(representatives), config, scratch.scale.pair_batch)
    return decide(ordered, copies, representatives, removed, exact_counts, near_counts)


def kept_frames(scratch: Scratch, decisions: pl.DataFrame) -> Iterator[pl.DataFrame]:
    """The documents that survive deduplication, in keep order, a batch at a time (as
    `dedup.kept_documents` returns them whole)."""
    kept_ids = decisions.filter(pl.col("dedup_state") == KEPT).select("doc_id").to_arrow()
    scratch.db.register("kept_ids", kept_ids)
    columns = ", ".join(f'r."{c}"' for c in DOCUMENT_SCHEMA)
    sql = f"SELECT {columns} FROM ranked r SEMI JOIN kept_ids k USING (doc_id) ORDER BY r.rank"
    try:
        for frame in _frames(scratch, sql):
            yield frame.cast(DOCUMENT_SCHEMA)
    finally:
        scratch.db.unregister("kept_ids")
