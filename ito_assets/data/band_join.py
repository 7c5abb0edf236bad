"""Near-duplicate removal out of core and in partitions: the same banding, verification and keep
rule as `near_dedup`, with nothing held in one process that grows with the corpus but the
verified pairs.

- The band rows (doc, band, key, unit) of every unit are Parquet files written by the workers,
  hash-partitioned by bucket key (`partition_of`): one row group per partition, so that every
  row of a bucket is in one partition and a partition's reader reads one row group of each file.
- Each partition is a task of its own (`partition_pairs`), on a worker of the step's pool or a
  Ray task: its DuckDB, under its own memory cap, finds the buckets with two or more members and
  joins them, and streams the distinct candidate pairs out in batches ordered by the units of
  their documents; each batch is verified there (signatures and shingle lists gathered from the
  units' memory-mapped arrays, `near_dedup.verify_pairs`) and only the pairs at or above the
  threshold are written. Verification is per pair, so batching cannot change a verdict.
- A pair sharing bands in several partitions is counted and verified once: by the partition of
  the first band that paired the two documents (`owned`), so the counters and the histogram add up
  to the one-partition figures exactly. With `bucket_anchors` set, a bucket pairs each member with
  its first members only, and which bands paired a pair depends on buckets in other partitions: a
  first phase writes every partition's buckets past their anchors (`anchor_bounds`), and every
  partition reads them all.
- The keep rule and the families run once, in the step's process, on the verified pairs of every
  partition (few: only pairs at or above the threshold; both sort their input, so the order the
  partitions come back in changes nothing).
"""

from __future__ import annotations

import math
import mmap
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow.parquet as pq

from ito_assets.data.config import DedupConfig, ScaleConfig
from ito_assets.data.kernels import distinct
from ito_assets.data.minhash import Shingles
from ito_assets.data.near_dedup import (HISTOGRAM_BINS, Families, NearDedupCounts, Removals, band_keys, families_of,
                                        histogram, keep_rule, verify_pairs)
from ito_assets.data.scratch import Scratch, sql_list
from ito_assets.data.units import Pool, map_units

# A partition is picked from the key's top 32 bits by a multiply-shift; a cap keeps the product
# (< 2^32 x 2^16) inside 64 bits and the row groups of a unit's file from getting absurdly small.
MAX_PARTITIONS = 65_536
BAND_SCHEMA = {"doc": pl.Int64, "band": pl.Int32, "key": pl.UInt64, "unit": pl.Int32, "part": pl.Int32}
PAIR_SCHEMA = {"a": pl.Int64, "b": pl.Int64, "similarity": pl.Float64}

# Pairs come out ordered by the units of their two documents, so that a verification batch
# gathers from few units (each gather maps a unit's files: across every unit, the mapping alone
# took 26 of the 34 s of near-duplicate removal at 128x the fixtures, benchmarks/data_scaling.py).
# A bucket's member pairs with those after it (only among the bucket's first `anchors` in keep
# order, where they are set: `near_dedup.candidate_pairs`); `band` is the first band of this
# partition that paired them.
CANDIDATES_SQL = """
WITH bands AS (SELECT doc, band, key, unit FROM read_parquet({files}) {where}),
shared AS (SELECT band, key FROM bands GROUP BY band, key HAVING count(*) > 1),
members AS (
    SELECT bands.*, row_number() OVER (PARTITION BY band, key ORDER BY doc) AS rank
    FROM bands SEMI JOIN shared USING (band, key)
),
pairs AS (
    SELECT l.doc AS a, r.doc AS b, min(l.band) AS band, min(l.unit) AS unit_a, min(r.unit) AS unit_b
    FROM members l JOIN members r ON l.band = r.band AND l.key = r.key AND l.doc < r.doc {anchored}
    GROUP BY l.doc, r.doc
)
SELECT a, b, band FROM pairs ORDER BY unit_a, unit_b
"""


def partition_of(keys: np.ndarray, num_partitions: int) -> np.ndarray:
    """The partition of each bucket key: keys are mixed 64-bit hashes (`band_keys`), so their
    top bits spread buckets evenly."""
    top = np.asarray(keys, dtype=np.uint64) >> np.uint64(32)
    return ((top * np.uint64(num_partitions)) >> np.uint64(32)).astype(np.int32)


def num_partitions(num_docs: int, bands: int, scale: ScaleConfig) -> int:
    """Partitions of the band join: one per `scale.partition_rows` band rows, and at least one per
    worker, so that the step's workers share the join."""
    rows = num_docs * bands
    return min(MAX_PARTITIONS, max(1, scale.num_workers, -(-rows // scale.partition_rows)))


def write_band_rows(bands: pl.DataFrame, path: str, num_partitions: int) -> int:
    """A unit's band rows (doc, band, key, unit) -> its Parquet file, with their partition, one row
    group per partition in partition order (DuckDB skips the other row groups by their
    statistics); -> the number of rows."""
    parts = partition_of(bands["key"].to_numpy(), num_partitions)
    order = np.argsort(parts, kind="stable")
    table = bands.with_columns(pl.Series("part", parts)).cast(BAND_SCHEMA)[order].to_arrow()
    bounds = np.searchsorted(parts[order], np.arange(num_partitions + 1))
    with pq.ParquetWriter(path, table.schema) as writer:
        if not table.num_rows:
            writer.write_table(table)
        for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            if end > start:
                writer.write_table(table.slice(start, end - start), row_group_size=end - start)
    return table.num_rows


def candidate_batches(db: duckdb.DuckDBPyConnection, band_files: Sequence[str], batch_rows: int, partition: int | None = None,
                      anchors: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Distinct pairs (a < b) that a band paired (of `partition` only, when given), with the first
    such band, as arrays of at most `batch_rows` pairs, ordered by the units of a and b. Band files
    have columns doc, band, key and unit (and part, the partition)."""
    if not band_files:
        return
    where = "" if partition is None else f"WHERE part = {int(partition)}"
    anchored = f"AND l.rank <= {int(anchors)}" if anchors else ""
    sql = CANDIDATES_SQL.format(files=sql_list(band_files), where=where, anchored=anchored)
    for batch in db.execute(sql).to_arrow_reader(batch_rows):
        if batch.num_rows:
            yield tuple(batch.column(name).to_numpy().astype(np.int64) for name in ("a", "b", "band"))


# A bucket of more than `anchors` members: its (anchors + 1)-th member in keep order, the first
# that pairs with none after it. A partition's buckets only; every partition reads them all.
BOUNDS_SQL = """
WITH bands AS (SELECT doc, band, key FROM read_parquet({files}) {where}),
big AS (SELECT band, key FROM bands GROUP BY band, key HAVING count(*) > {anchors}),
ranked AS (
    SELECT band, key, doc, row_number() OVER (PARTITION BY band, key ORDER BY doc) AS rank
    FROM bands SEMI JOIN big USING (band, key)
)
SELECT band, key, doc AS bound FROM ranked WHERE rank = {anchors} + 1
"""
BOUND_SCHEMA = {"band": pl.Int32, "key": pl.UInt64, "bound": pl.Int64}


class AnchorBounds:
    """Every bucket past its anchors, by band: sorted keys and each one's bound (BOUNDS_SQL)."""

    def __init__(self, frame: pl.DataFrame, bands: int) -> None:
        self._by_band = []
        for band in range(bands):
            rows = frame.filter(pl.col("band") == band).sort("key")
            self._by_band.append((rows["key"].to_numpy(), rows["bound"].to_numpy()))

    @classmethod
    def read(cls, paths: Sequence[str], bands: int) -> "AnchorBounds":
        frames = [pl.read_parquet(path) for path in paths]
        return cls(pl.concat(frames) if frames else pl.DataFrame(schema=BOUND_SCHEMA), bands)

    def pairs(self, band: int, keys: np.ndarray, earlier: np.ndarray) -> np.ndarray:
        """Whether the bucket of each key in `band` pairs its member `earlier` with those after it."""
        sorted_keys, bounds = self._by_band[band]
        if not len(sorted_keys):
            return np.ones(len(keys), dtype=bool)
        at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
        return (sorted_keys[at] != keys) | (earlier < bounds[at])


def owned(signatures: np.ndarray, a: np.ndarray, b: np.ndarray, band: np.ndarray, config: DedupConfig,
          earlier: np.ndarray | None = None, bounds: AnchorBounds | None = None) -> np.ndarray:
    """Which candidate pairs (rows a, b of `signatures`, paired first by `band` in this partition)
    this partition settles: those whose first band that paired them is `band`. A pair reaches
    every partition holding a band that paired it; exactly one owns it. Without
    anchors every shared band pairs it; with them (`bounds`, `earlier`: the keep-order positions
    of the pairs' first documents), a band pairs it where its bucket has the first document among
    its anchors."""
    keys = band_keys(signatures, config.bands, config.rows)
    paired = keys[a] == keys[b]
    if bounds is not None:
        for j in range(config.bands):
            paired[:, j] &= bounds.pairs(j, keys[a, j], earlier)
    return paired.argmax(axis=1) == band


class UnitArrays:
    """Signatures and shingle lists of every unit, gathered by keep-order position.

    The arrays are memory-mapped afresh for each gather and unmapped after it: a mapping kept
    open for the whole step keeps every page it ever touched resident, so the step's RSS would
    grow to the size of all units' arrays (~1.5x the corpus text, measured in
    benchmarks/data_scaling.py); per gather it is bounded by one batch's documents. A batch maps
    the files of each unit it touches, so each file's .npy header is read once, when first
    needed: `np.load` per gather re-parsed it and took 3x as long as the mapping itself. A unit's
    offsets (8 bytes per document) stay in memory once read; a partition reads those of the
    units its pairs touch only."""

    def __init__(self, folder: Path, firsts: Sequence[int]) -> None:
        self.firsts = np.asarray(firsts, dtype=np.int64)
        self.folder = str(folder)
        self._offsets: dict[int, np.ndarray] = {}
        self._layouts: dict[tuple[str, int], tuple[int, tuple[int, ...], np.dtype]] = {}

    def _path(self, name: str, unit: int) -> str:
        # A string, not a Path: a gather opens thousands of files, and pathlib's joins cost more
        # than the opening (profiled).
        return f"{self.folder}/{name}-{unit:05d}.npy"

    def _offsets_of(self, unit: int) -> np.ndarray:
        if unit not in self._offsets:
            self._offsets[unit] = np.load(self._path("offsets", unit))
        return self._offsets[unit]

    def _mapped(self, name: str, unit: int) -> np.ndarray:
        if (name, unit) not in self._layouts:
            self._layouts[name, unit] = _npy_layout(Path(self._path(name, unit)))
        offset, shape, dtype = self._layouts[name, unit]
        if 0 in shape:  # nothing to map (a unit of documents without shingles)
            return np.zeros(shape, dtype=dtype)
        # `mmap` itself, not np.memmap: np.memmap resolves the path on every call, ~70 us of its ~90.
        with open(self._path(name, unit), "rb") as handle:
            mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        # The array holds the mapping; it is unmapped when the last view of it goes.
        return np.frombuffer(mapping, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)

    def _by_unit(self, docs: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """(unit, local positions) for sorted `docs`, in order."""
        units = np.searchsorted(self.firsts, docs, side="right") - 1
        for u in np.unique(units).tolist():
            yield u, docs[units == u] - self.firsts[u]

    def signatures(self, docs: np.ndarray) -> np.ndarray:
        """Signatures (len(docs), P) of sorted, distinct `docs`, in that order."""
        # Fancy indexing copies out of the mapping; the mapping goes when the name does.
        parts = [self._mapped("signatures", u)[local] for u, local in self._by_unit(docs)]
        return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.uint32)

    def shingles(self, docs: np.ndarray) -> Shingles:
        """Shingle lists of sorted, distinct `docs`, in that order."""
        lengths, hashes = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.uint64)]
        for u, local in self._by_unit(docs):
            offsets = self._offsets_of(u)
            lengths.append(offsets[local + 1] - offsets[local])
            starts = np.repeat(offsets[local], lengths[-1])
            within = np.arange(int(lengths[-1].sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths[-1]) - lengths[-1], lengths[-1])
            hashes.append(self._mapped("shingles", u)[starts + within])
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
        return Shingles(hashes=np.concatenate(hashes), offsets=offsets)


@dataclass(frozen=True)
class LazyShingles:
    """The shingle lists of a batch's documents (`docs`, sorted keep-order positions), read from
    the unit arrays only for the documents verification asks for: `as_sets`, the one method
    `verify_pairs` calls, as `Shingles.as_sets` answers it. A candidate pair whose signatures
    rule it out, or that another partition owns, never has its shingles read."""

    arrays: UnitArrays
    docs: np.ndarray

    def as_sets(self, positions: np.ndarray) -> tuple[Shingles, np.ndarray]:
        wanted = distinct(positions)
        sets, within = self.arrays.shingles(self.docs[wanted]).as_sets(np.arange(len(wanted)))
        position = np.full(len(self.docs), -1, dtype=np.int64)
        position[wanted] = within
        return sets, position


def _npy_layout(path: Path) -> tuple[int, tuple[int, ...], np.dtype]:
    """(data offset, shape, dtype) of a C-ordered .npy file, from its header."""
    with path.open("rb") as handle:
        read_header = np.lib.format.read_array_header_1_0 if np.lib.format.read_magic(handle) == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(handle)
        assert not fortran_order, "unit arrays are written C-ordered by np.save"
        return handle.tell(), shape, dtype


@dataclass(frozen=True)
class PairTask:
    """One partition of the band join. The band files and unit arrays it reads are vouched for by
    `arrays_digest` (the digests the signature phase's workers took of them), not hashed again by
    every partition."""

    partition: int
    num_partitions: int
    band_files: tuple[str, ...]
    arrays_folder: str
    firsts: tuple[int, ...]
    config: DedupConfig
    batch_rows: int
    arrays_digest: str
    pairs_path: str
    # How the work is done, not what it finds: neither is in the key.
    memory_limit_mb: int
    spill: str
    # The buckets past their anchors, every partition's (none without anchors): made of the band
    # files and the configuration, which the key holds.
    bounds_files: tuple[str, ...] = ()

    def key(self) -> dict:
        return {"partition": self.partition, "num_partitions": self.num_partitions, "firsts": list(self.firsts),
                "config": asdict(self.config), "batch_rows": self.batch_rows, "arrays": self.arrays_digest}

    def inputs(self) -> tuple[str, ...]:
        return ()

    def outputs(self) -> tuple[str, ...]:
        return (self.pairs_path,)


def partition_pairs(task: PairTask) -> tuple[int, int, tuple[int, ...]]:
    """One partition's verified pairs (PAIR_SCHEMA) -> its Parquet file; -> (candidate pairs,
    pairs sent to exact verification, the candidates' histogram of estimated Jaccard)."""
    arrays = UnitArrays(Path(task.arrays_folder), task.firsts)
    kept: list[pl.DataFrame] = []
    num_candidates = num_verified = 0
    bins = np.zeros(HISTOGRAM_BINS, dtype=np.int64)
    db = duckdb.connect()  # in memory: one thread under its own cap, spilling past it
    try:
        _configure(db, task)
        where = None if task.num_partitions == 1 else task.partition
        bounds = AnchorBounds.read(task.bounds_files, task.config.bands) if task.config.bucket_anchors else None
        for a, b, band in candidate_batches(db, task.band_files, task.batch_rows, where, task.config.bucket_anchors):
            docs = distinct(np.concatenate([a, b]))
            signatures = arrays.signatures(docs)
            ia, ib = np.searchsorted(docs, a), np.searchsorted(docs, b)
            mine = owned(signatures, ia, ib, band, task.config, a, bounds)
            va, vb, similarity, estimate, verified = verify_pairs(signatures, LazyShingles(arrays, docs), ia[mine], ib[mine], task.config)
            kept.append(pl.DataFrame({"a": docs[va], "b": docs[vb], "similarity": similarity}, schema=PAIR_SCHEMA))
            num_candidates += int(mine.sum())
            num_verified += verified
            bins += np.asarray(histogram(estimate), dtype=np.int64)
    finally:
        db.close()
        shutil.rmtree(task.spill, ignore_errors=True)
    (pl.concat(kept) if kept else pl.DataFrame(schema=PAIR_SCHEMA)).write_parquet(task.pairs_path)
    return num_candidates, num_verified, tuple(int(c) for c in bins)


@dataclass(frozen=True)
class BoundTask:
    """One partition's buckets past their anchors (BOUNDS_SQL) -> `bounds_path`."""

    partition: int
    num_partitions: int
    band_files: tuple[str, ...]
    anchors: int
    arrays_digest: str
    bounds_path: str
    memory_limit_mb: int
    spill: str

    def key(self) -> dict:
        return {"partition": self.partition, "num_partitions": self.num_partitions, "anchors": self.anchors,
                "arrays": self.arrays_digest}

    def inputs(self) -> tuple[str, ...]:
        return ()

    def outputs(self) -> tuple[str, ...]:
        return (self.bounds_path,)


def anchor_bounds(task: BoundTask) -> int:
    """One partition's buckets past their anchors -> its Parquet file; -> how many."""
    db = duckdb.connect()
    try:
        _configure(db, task)
        where = "" if task.num_partitions == 1 else f"WHERE part = {int(task.partition)}"
        sql = BOUNDS_SQL.format(files=sql_list(task.band_files), where=where, anchors=int(task.anchors))
        frame = db.execute(sql).pl() if task.band_files else pl.DataFrame(schema=BOUND_SCHEMA)
    finally:
        db.close()
        shutil.rmtree(task.spill, ignore_errors=True)
    frame.cast(BOUND_SCHEMA).write_parquet(task.bounds_path)
    return frame.height


def _configure(db: duckdb.DuckDBPyConnection, task: PairTask | BoundTask) -> None:
    db.execute(f"SET memory_limit = '{int(task.memory_limit_mb)}MB'")
    db.execute("SET threads = 1")
    db.execute(f"SET temp_directory = '{task.spill.replace(chr(39), chr(39) * 2)}'")
    db.execute("SET preserve_insertion_order = false")


def near_duplicates_out_of_core(
    scratch: Scratch, pool: Pool | None, band_files: Sequence[str], arrays_folder: Path, firsts: Sequence[int], arrays_digest: str,
    partitions: int, num_input: int, config: DedupConfig,
) -> tuple[Removals, Families, NearDedupCounts]:
    """Removals and families by keep-order position, and counters, as `near_dedup.near_duplicates`
    returns them, from band files written in `partitions` partitions (`write_band_rows`); the
    partitions run on `pool` (units.worker_pool's)."""
    markers = scratch.finished("dedup-pairs")
    spill = scratch.sub("pairs-spill")
    bounds_files = _anchor_bounds(scratch, pool, band_files, arrays_digest, partitions, config) if config.bucket_anchors else ()
    tasks = [
        PairTask(partition=p, num_partitions=partitions, band_files=tuple(band_files), arrays_folder=str(arrays_folder), firsts=tuple(int(f) for f in firsts),
                 config=config, batch_rows=scratch.scale.pair_batch, arrays_digest=arrays_digest, pairs_path=str(markers.folder / f"pairs-{p:05d}.parquet"),
                 memory_limit_mb=scratch.scale.partition_memory_mb, spill=str(spill / f"{p:05d}"), bounds_files=bounds_files)
        for p in range(partitions)
    ]
    results = map_units(partition_pairs, tasks, pool, phase="dedup band join", unit="partitions", markers=markers)
    pairs = pl.concat([pl.read_parquet(task.pairs_path) for task in tasks]) if tasks else pl.DataFrame(schema=PAIR_SCHEMA)
    a, b, similarity = (pairs[c].to_numpy() for c in ("a", "b", "similarity"))
    removed = keep_rule(a, b, similarity)
    counts = NearDedupCounts(
        num_input=num_input,
        num_candidate_pairs=sum(r[0] for r in results),
        num_pairs_verified=sum(r[1] for r in results),
        num_pairs_above_threshold=len(a),
        num_removed=len(removed),
        similarity_histogram=tuple(int(sum(r[2][i] for r in results)) for i in range(HISTOGRAM_BINS)),
    )
    return removed, families_of(a, b), counts


def _anchor_bounds(scratch: Scratch, pool: Pool | None, band_files: Sequence[str], arrays_digest: str, partitions: int,
                   config: DedupConfig) -> tuple[str, ...]:
    """Every partition's buckets past their anchors, a task a partition, before any pairs: a
    partition owns a pair by the first band that paired it, which may be another partition's."""
    markers = scratch.finished("dedup-bounds")
    spill = scratch.sub("bounds-spill")
    tasks = [BoundTask(partition=p, num_partitions=partitions, band_files=tuple(band_files), anchors=config.bucket_anchors,
                       arrays_digest=arrays_digest, bounds_path=str(markers.folder / f"bounds-{p:05d}.parquet"),
                       memory_limit_mb=scratch.scale.partition_memory_mb, spill=str(spill / f"{p:05d}"))
             for p in range(partitions)]
    map_units(anchor_bounds, tasks, pool, phase="dedup bucket anchors", unit="partitions", markers=markers)
    return tuple(task.bounds_path for task in tasks)
