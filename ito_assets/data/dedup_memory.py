"""Deduplication of a corpus that fits in the step's memory: the same decisions, counters and side
files as the streamed path (`dedup_units`), composed on whole frames.

The streamed path writes every phase to the scratch folder (keys, work units, signatures, band
rows, pairs) and joins in DuckDB, so that memory stays bounded by a unit whatever the corpus. On a
corpus of a few tens of MB those files and joins are most of the work: on 60,000 documents of
100-600 bytes (20.9 MB, benchmarks/dedup_speed.py's short corpus) the benchmark's path, the
sources step's ~0.7 s included, took 2.75 s of CPU streamed and 1.58 s with this (best of 5,
2-core AMD EPYC). `ScaleConfig.in_memory_mb` says which corpora take this path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ito_assets.data.config import DedupConfig
from ito_assets.data.dedup import DEDUP_SCHEMA, FAMILY_SCHEMA, NEAR_SCHEMA, DedupCounts, counts_of, decide
from ito_assets.data.exact_dedup import exact_duplicates, in_keep_order
from ito_assets.data.minhash import MinHasher
from ito_assets.data.near_dedup import Removals, near_duplicates
from ito_assets.data.shards import Shard, record_batches, write_table_batches
from ito_assets.data.sources import DOCUMENT_SCHEMA
from ito_assets.data.units import READ_BATCH_ROWS


def text_bytes(shards: Sequence[Shard], up_to: int) -> int:
    """The UTF-8 bytes of the shards' texts, about (and 4 a row), counted until they pass `up_to`.
    A text column written PLAIN tells them in its Parquet footer (its uncompressed size: each
    text's bytes after a 4-byte length), without a text read; one written with a dictionary of
    repeated texts tells only the dictionary's, so its texts' lengths are read, a batch at a time."""
    total = 0
    for shard in shards:
        file = pq.ParquetFile(shard.path)
        meta = file.metadata
        column = next(i for i in range(meta.num_columns) if meta.schema.column(i).name == "text")
        for group in range(meta.num_row_groups):
            chunk = meta.row_group(group).column(column)
            if not chunk.has_dictionary_page:
                total += chunk.total_uncompressed_size
            else:
                for batch in file.iter_batches(batch_size=READ_BATCH_ROWS, row_groups=[group], columns=["text"]):
                    total += 4 * batch.num_rows + (pc.sum(pc.binary_length(batch.column(0))).as_py() or 0)
                    if total > up_to:
                        return total
            if total > up_to:
                return total
    return total


def deduplicate_frame(docs: pl.DataFrame, config: DedupConfig, tiers: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame, Removals, DedupCounts]:
    """docs (DOCUMENT_SCHEMA) -> (one decision row per document in DEDUP_SCHEMA, keep order; the
    representatives, the documents that are no exact copy, in keep order; the near-duplicates among
    them by position; counters). `tiers` (doc_id, tier): the contaminated documents, which come
    last in the keep order."""
    ordered = in_keep_order(docs, tiers)
    representatives, copies, exact_counts = exact_duplicates(ordered)
    hasher = MinHasher(num_perm=config.num_perm, seed=config.seed)
    signatures, shingles = hasher.signatures_of_texts(representatives["text"], config.shingle_size)
    removals, families, near_counts = near_duplicates(signatures, shingles, config)
    ids = representatives["doc_id"]
    near = pl.DataFrame({"doc_id": ids.gather(removals.removed), "near_of": ids.gather(removals.kept), "near_similarity": removals.similarity}, schema=NEAR_SCHEMA)
    family = pl.DataFrame({"doc_id": ids.gather(families.member), "family_of": ids.gather(families.root)}, schema=FAMILY_SCHEMA)
    decisions = decide(ordered, copies, near, family)
    return decisions, representatives, removals, counts_of(exact_counts, near_counts)


def deduplicate_in_memory(
    shards: Sequence[Shard], config: DedupConfig, decisions_path: Path, representatives_path: Path, store: Path | None = None,
    tiers: pl.DataFrame | None = None,
) -> tuple[Shard, Removals, int, DedupCounts]:
    """`dedup_units.deduplicate_units` on whole frames: the decisions file, and the representatives'
    rows in keep order written to `representatives_path` (what `kept_frames` reads) -> (the
    decisions file, the removals, the number of representatives, counters)."""
    docs = pl.read_parquet([s.path for s in shards], columns=list(DOCUMENT_SCHEMA)) if shards else pl.DataFrame(schema=DOCUMENT_SCHEMA)
    decisions, representatives, removals, counts = deduplicate_frame(docs.cast(DOCUMENT_SCHEMA), config, tiers)
    del docs
    # Scratch data, read once by `kept_frames`: uncompressed writes in a third of lz4's time.
    representatives.select(list(DOCUMENT_SCHEMA)).cast(DOCUMENT_SCHEMA).write_parquet(representatives_path, compression="uncompressed")
    # In the streamed path's batches, so that the file is the same bytes whichever path wrote it.
    batches = (decisions.slice(low, READ_BATCH_ROWS) for low in range(0, decisions.height, READ_BATCH_ROWS))
    return write_table_batches(record_batches(batches, DEDUP_SCHEMA), decisions_path, store=store), removals, representatives.height, counts
