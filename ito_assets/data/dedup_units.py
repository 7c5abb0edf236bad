"""Deduplication out of core, over byte-sized work units: the same decisions as the in-memory
reference (`deduplicate`, tests/reference_impl.py), with memory bounded by the units and DuckDB's
cap rather than the corpus.

1. `exact_units` numbers the documents in keep order and finds the exact copies (ids and text
   hashes in DuckDB; texts compared only inside a hash group); the first of each group of
   identical texts is the representative, as in `exact_dedup`.
2. The representatives are read from the source shards into keep order by `bucket_sort` (DuckDB
   orders their ids, never their text), once: their whole rows go to a side file in keep order,
   and their texts are cut into work units of about `unit_bytes`; each unit's shingles, MinHash
   signatures and band rows are computed by a worker alone and written to the scratch folder
   (`signature_unit`). On a pool (several workers, or Ray) the buckets are tasks instead
   (`bucket_sort.spread_shard`, then `representative_unit`): each bucket of the keep order is a
   work unit and a part of the side file, and no text passes through the step's process.
3. `band_join` finds, verifies and settles the near-duplicates from those files, a partition of
   the band rows a task (on the step's workers or Ray).
4. Every document's decision is made a batch of ids at a time (`decision_frames`) and streamed
   to a Parquet file: only the duplicates' rows are held whole, never a frame of every document.
5. The kept documents, a subset of the representatives, are the side file's rows filtered by
   position (`kept_frames`): no second pass over the source shards, no second sort.

DuckDB's allocator keeps memory it used after a query, beyond its cap's accounting, until the
connection closes (measured: ~100 MB), so the step reconnects (`Scratch.reconnect`) between its
DuckDB phases and the phases that hold batches of text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from ito_assets.data.band_join import near_duplicates_out_of_core, num_partitions, write_band_rows
from ito_assets.data.bucket_sort import GatherTask, bucket_sort, gathered, place, placed_rows, spread_shard, spread_tasks
from ito_assets.data.completion import LOGGER
from ito_assets.data.config import DedupConfig, ScaleConfig
from ito_assets.data.dedup import DEDUP_SCHEMA, DedupCounts, counts_of, decide, family_ids, near_ids
from ito_assets.data.dedup_memory import deduplicate_in_memory, text_bytes
from ito_assets.data.exact_units import exact_copies, source_digests
from ito_assets.data.minhash import MinHasher
from ito_assets.data.near_dedup import Families, Removals, band_rows
from ito_assets.data.scratch import Scratch
from ito_assets.data.sources import DOCUMENT_SCHEMA
from ito_assets.data.shards import Shard, record_batches, write_table_batches
from ito_assets.data.units import (READ_BATCH_ROWS, UNIT_SCHEMA, Pool, WorkUnit, compacted, map_units, parquet_frames, worker_pool,
                                   write_units)

# The representatives: the documents that are no exact copy.
REPRESENTATIVES_SQL = "SELECT k.* FROM keys k ANTI JOIN copies USING (doc_id)"
# Their whole rows in keep order, written while their units are, and the positions among them of
# the near-duplicates removed: what `kept_frames` reads.
REPRESENTATIVES_FILE = "representatives.parquet"
REPRESENTATIVES_PARTS = "representatives.json"  # on a pool: the side file's parts, in keep order
REMOVED_FILE = "removed.npz"


@dataclass(frozen=True)
class SignatureTask:
    unit: WorkUnit
    folder: str
    config: DedupConfig
    num_partitions: int  # of the band join, which the unit's band rows are laid out for

    def key(self) -> dict:
        return {"unit": self.unit.key(), "config": asdict(self.config), "num_partitions": self.num_partitions}

    def inputs(self) -> tuple[str, ...]:
        return (self.unit.path,)

    def outputs(self) -> tuple[str, ...]:
        return tuple(str(Path(self.folder) / f"{name}-{self.unit.index:05d}.{kind}")
                     for name, kind in (("signatures", "npy"), ("shingles", "npy"), ("offsets", "npy"), ("bands", "parquet")))


def signature_unit(task: SignatureTask) -> None:
    """One unit's shingle lists, signatures and band rows (in the band join's partitions), written
    beside the unit."""
    config, unit = task.config, task.unit
    signatures_path, shingles_path, offsets_path, bands_path = task.outputs()
    hasher = MinHasher(num_perm=config.num_perm, seed=config.seed)
    signatures, shingles = hasher.signatures_of_texts(unit.read(["text"])["text"], config.shingle_size)
    np.save(signatures_path, signatures)
    np.save(shingles_path, shingles.hashes)
    np.save(offsets_path, shingles.offsets)
    bands = band_rows(signatures, config.bands, config.rows, first=unit.first).with_columns(pl.lit(unit.index, dtype=pl.Int32).alias("unit"))
    write_band_rows(bands, bands_path, task.num_partitions)


def representative_frames(scratch: Scratch, shard_paths: Sequence[str]) -> Iterator[pl.DataFrame]:
    """The representatives' rows (DOCUMENT_SCHEMA) in keep order, a bucket at a time."""
    num_buckets = place(scratch.db, "representative_placement", REPRESENTATIVES_SQL, "rank", scratch.scale.unit_bytes)
    rows = placed_rows(scratch.db, "representative_placement", shard_paths, list(DOCUMENT_SCHEMA))
    for frame in bucket_sort(rows, scratch.sub("representative-buckets"), num_buckets):
        yield frame.select(list(DOCUMENT_SCHEMA)).cast(DOCUMENT_SCHEMA)


def representative_unit(task: GatherTask) -> tuple[int, int, int]:
    """One bucket's representatives in keep order: their ids and texts as a work unit, their whole
    rows as a part of the side file (the task's two files) -> (the first one's position,
    documents, UTF-8 bytes of text)."""
    unit_path, rows_path = task.files
    rows = gathered(task.spread_folder, task.key_value).sort("rank")
    rows.select(list(DOCUMENT_SCHEMA)).cast(DOCUMENT_SCHEMA).write_parquet(rows_path, compression="lz4")
    rows.select(list(UNIT_SCHEMA)).cast(UNIT_SCHEMA).write_parquet(unit_path, compression="lz4")
    return int(rows["rank"][0]), rows.height, int(rows["text"].str.len_bytes().fill_null(0).sum())


def representatives_in_parts(scratch: Scratch, shards: Sequence[Shard], pool: Pool) -> tuple[tuple[WorkUnit, ...], dict[str, str]]:
    """The work units, a bucket of about `unit_bytes` of the representatives' text each in keep
    order, with their digests as their tasks took them, and the side file's parts (named in
    REPRESENTATIVES_PARTS, with theirs): each source shard and then each bucket a task on `pool`."""
    db = scratch.db
    place(db, "representative_placement", REPRESENTATIVES_SQL, "rank", scratch.scale.unit_bytes)
    spread = scratch.finished("representative-spread")
    tasks = spread_tasks(db, "representative_placement", [s.path for s in shards], list(DOCUMENT_SCHEMA), "bucket",
                         scratch.sub("representative-placements"), spread.folder)
    map_units(spread_shard, tasks, pool, phase="representatives' rows", unit="source shards", markers=spread, known=source_digests(shards))
    made = scratch.finished("representative-units")
    digest = spread.digest()
    buckets = [b for (b,) in db.execute("SELECT DISTINCT bucket FROM representative_placement ORDER BY bucket").fetchall()]
    unit_tasks = [GatherTask(key_value=b, spread_folder=str(spread.folder), spread=digest,
                             files=(str(made.folder / f"unit-{i:05d}.parquet"), str(made.folder / f"representatives-{i:05d}.parquet")))
                  for i, b in enumerate(buckets)]
    found = map_units(representative_unit, unit_tasks, pool, phase="dedup units", unit="buckets", markers=made)
    written = made.written()
    parts = [{"path": t.files[1], "sha256": written[t.files[1]], "first": first, "num_docs": num_docs}
             for t, (first, num_docs, _) in zip(unit_tasks, found)]
    (scratch.folder / REPRESENTATIVES_PARTS).write_text(json.dumps(parts))
    return tuple(WorkUnit(index=i, path=t.files[0], first=first, num_docs=num_docs, num_bytes=num_bytes)
                 for i, (t, (first, num_docs, num_bytes)) in enumerate(zip(unit_tasks, found))), written


def representative_parts(scratch: Scratch) -> list[dict] | None:
    """The side file's parts in keep order ({path, sha256, first, num_docs}), where a pool made them; None
    where the step wrote the side file whole."""
    parts = scratch.folder / REPRESENTATIVES_PARTS
    return json.loads(parts.read_text()) if parts.exists() else None


def written_aside(frames: Iterable[pl.DataFrame], path: Path) -> Iterator[pl.DataFrame]:
    """The frames, passed on unchanged, also appended to one Parquet file (a row group each)."""
    writer = None
    try:
        for frame in frames:
            table = frame.to_arrow()
            writer = writer or pq.ParquetWriter(path, table.schema, compression="lz4")
            writer.write_table(table)
            yield frame
    finally:
        if writer is not None:
            writer.close()


def deduplicate_units(
    scratch: Scratch, shards: Sequence[Shard], config: DedupConfig, decisions_path: Path, store: Path | None = None, tiers: pl.DataFrame | None = None
) -> tuple[Shard, DedupCounts]:
    """Source shards, verified against their digests by the caller -> (the decisions file: one row per document in DEDUP_SCHEMA, keep order;
    counters); leaves the representatives' rows and removals in the scratch folder for
    `kept_frames`. `tiers` (doc_id, tier): the contaminated documents, last in the keep order.
    A corpus of at most `in_memory_mb` of text, with one worker, goes through `dedup_memory`."""
    with worker_pool(scratch.scale.num_workers, scratch.scale.engine) as pool:
        if in_memory(shards, scratch.scale):
            LOGGER.info("[dedup] in memory: %s MB of text in %s documents (in_memory_mb %d)",
                        f"{text_bytes(shards, scratch.scale.in_memory_mb * 2**20) / 2**20:,.1f}", f"{sum(s.num_rows for s in shards):,}",
                        scratch.scale.in_memory_mb)
            decisions, removals, num_representatives, counts = deduplicate_in_memory(
                shards, config, decisions_path, scratch.folder / REPRESENTATIVES_FILE, store=store, tiers=tiers)
            save_removals(scratch, removals, num_representatives)
            return decisions, counts
        # One pool for the phases: a worker's start (imports) is paid once.
        exact_counts = exact_copies(scratch, shards, tiers)
        if pool is None:
            frames = written_aside(representative_frames(scratch, [s.path for s in shards]), scratch.folder / REPRESENTATIVES_FILE)
            units, unit_digests = write_units(frames, scratch.sub("dedup-units"), scratch.scale.unit_bytes), {}
        else:
            units, unit_digests = representatives_in_parts(scratch, shards, pool)
        scratch.reconnect()
        markers = scratch.finished("dedup-arrays")
        folder = markers.folder
        partitions = num_partitions(sum(u.num_docs for u in units), config.bands, scratch.scale)
        band_files = [str(folder / f"bands-{u.index:05d}.parquet") for u in units]
        map_units(signature_unit, [SignatureTask(unit=u, folder=str(folder), config=config, num_partitions=partitions) for u in units], pool,
                  markers=markers, phase="dedup signatures", known=unit_digests)
        removals, families, near_counts = near_duplicates_out_of_core(
            scratch, pool, band_files, folder, [u.first for u in units], markers.digest(), partitions, exact_counts.num_distinct_texts, config)
    save_removals(scratch, removals, exact_counts.num_distinct_texts)
    scratch.reconnect()
    decisions = write_table_batches(record_batches(decision_frames(scratch, removals, families), DEDUP_SCHEMA), decisions_path, store=store)
    scratch.reconnect()
    return decisions, counts_of(exact_counts, near_counts)


def in_memory(shards: Sequence[Shard], scale: ScaleConfig) -> bool:
    """Whether `deduplicate_units` takes the shards in memory: one worker, at most `in_memory_mb`
    of text and `in_memory_documents` documents."""
    if scale.in_memory_mb == 0 or scale.num_workers != 1 or scale.engine != "local":
        return False
    limit = scale.in_memory_mb * 2**20
    return sum(s.num_rows for s in shards) <= scale.in_memory_documents and text_bytes(shards, limit) <= limit


def save_removals(scratch: Scratch, removals: Removals, num_representatives: int) -> None:
    """The positions of the near-duplicates among the representatives, and how many
    representatives there are (what the side file must hold): what `kept_frames` filters by."""
    np.savez(scratch.folder / REMOVED_FILE, removed=removals.removed, num_representatives=np.int64(num_representatives))


def load_removals(scratch: Scratch) -> tuple[np.ndarray, int]:
    with np.load(scratch.folder / REMOVED_FILE) as saved:
        return saved["removed"], int(saved["num_representatives"])


def decision_frames(scratch: Scratch, removals: Removals, families: Families) -> Iterator[pl.DataFrame]:
    """Every document's decision (DEDUP_SCHEMA), in keep order, a batch at a time: DuckDB orders
    the ids (a narrow sort, spilling past its cap), and `dedup.decide` joins each batch with the
    exact copies, near-duplicates and family members, the only per-document rows held whole
    (documents with a duplicate only)."""
    copies = scratch.db.execute("SELECT doc_id, exact_copy_of FROM copies").pl().cast(pl.String)
    near = near_ids(scratch.db, removals)
    family = family_ids(scratch.db, families)
    for batch in scratch.db.execute("SELECT doc_id, source_record_id FROM keys ORDER BY rank").fetch_record_batch(READ_BATCH_ROWS):
        yield decide(pl.from_arrow(batch).cast(pl.String), copies, near, family)


def kept_frames(scratch: Scratch) -> Iterator[pl.DataFrame]:
    """The documents that survive deduplication, in keep order, a batch at a time (as
    the reference `kept_documents` returns them whole): the representatives' side file, less the rows
    at the positions of the near-duplicates removed."""
    path, parts = scratch.folder / REPRESENTATIVES_FILE, representative_parts(scratch)
    paths = [str(path)] if path.exists() else [part["path"] for part in parts] if parts is not None else []
    removed, num_representatives = load_removals(scratch)
    first = 0
    for frame in parquet_frames(paths, list(DOCUMENT_SCHEMA)):
        kept = ~np.isin(np.arange(first, first + frame.height), removed, assume_unique=True)
        first += frame.height
        # Compacted: the shard writer holds up to a shard of these, not the batches they came from.
        yield compacted(frame.filter(pl.Series(kept))).cast(DOCUMENT_SCHEMA)
    assert first == num_representatives > removed.max(initial=-1), "the representatives' file is out of step with the removals"
