"""Near-duplicate removal out of core: the same banding, verification and keep rule as
`near_dedup`, with nothing held in memory that grows with the corpus but the verified pairs.

- The band rows (doc, band, key, unit) of every unit are Parquet files written by the workers;
  DuckDB finds the buckets with two or more members and joins them, under the scratch database's
  memory cap (spilling past it), and streams the distinct candidate pairs out in batches ordered
  by the units of their documents.
- Each batch is verified on its own: signatures and shingle lists of the batch's documents are
  gathered from the units' memory-mapped arrays, and `near_dedup.verify_pairs` runs on them.
  Verification is per pair, so batching cannot change a verdict; the histogram adds up.
- The keep rule and the families run once on the verified pairs (few: only pairs at or above the
  threshold).
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterator, Sequence
from pathlib import Path

import duckdb
import numpy as np

from ito_assets.data.config import DedupConfig
from ito_assets.data.minhash import Shingles
from ito_assets.data.near_dedup import HISTOGRAM_BINS, Families, NearDedupCounts, Removals, families_of, histogram, keep_rule, verify_pairs
from ito_assets.data.scratch import sql_list

# Pairs come out ordered by the units of their two documents, so that a verification batch
# gathers from few units (each gather maps a unit's files: across every unit, the mapping alone
# took 26 of the 34 s of near-duplicate removal at 128x the fixtures, benchmarks/data_scaling.py).
CANDIDATES_SQL = """
WITH bands AS (SELECT doc, band, key, unit FROM read_parquet({files})),
shared AS (SELECT band, key FROM bands GROUP BY band, key HAVING count(*) > 1),
members AS (SELECT bands.* FROM bands SEMI JOIN shared USING (band, key)),
pairs AS (
    SELECT DISTINCT l.doc AS a, r.doc AS b, l.unit AS unit_a, r.unit AS unit_b
    FROM members l JOIN members r ON l.band = r.band AND l.key = r.key AND l.doc < r.doc
)
SELECT a, b FROM pairs ORDER BY unit_a, unit_b
"""


def candidate_batches(db: duckdb.DuckDBPyConnection, band_files: Sequence[str], batch_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Distinct pairs (a < b) sharing a band, as arrays of at most `batch_rows` pairs, ordered by
    the units of a and b. Band files have columns doc, band, key and unit."""
    if not band_files:
        return
    reader = db.execute(CANDIDATES_SQL.format(files=sql_list(band_files))).fetch_record_batch(batch_rows)
    for batch in reader:
        if batch.num_rows:
            yield batch.column("a").to_numpy().astype(np.int64), batch.column("b").to_numpy().astype(np.int64)


class UnitArrays:
    """Signatures and shingle lists of every unit, gathered by keep-order position.

    The arrays are memory-mapped afresh for each gather and unmapped after it: a mapping kept
    open for the whole step keeps every page it ever touched resident, so the step's RSS would
    grow to the size of all units' arrays (~1.5x the corpus text, measured in
    benchmarks/data_scaling.py); per gather it is bounded by one batch's documents. A batch maps
    two files per unit it touches, so each file's .npy header is read once, here: `np.load` per
    gather re-parsed it and took 3x as long as the mapping itself. The offsets (8 bytes per
    document) stay in memory."""

    def __init__(self, folder: Path, firsts: Sequence[int]) -> None:
        self.firsts = np.asarray(firsts, dtype=np.int64)
        self.offsets_of = [np.load(folder / f"offsets-{u:05d}.npy") for u in range(len(firsts))]
        self.files = {name: [str(folder / f"{name}-{u:05d}.npy") for u in range(len(firsts))] for name in ("signatures", "shingles")}
        self.layouts = {name: [_npy_layout(Path(path)) for path in paths] for name, paths in self.files.items()}

    def _mapped(self, name: str, unit: int) -> np.ndarray:
        offset, shape, dtype = self.layouts[name][unit]
        if 0 in shape:  # nothing to map (a unit of documents without shingles)
            return np.zeros(shape, dtype=dtype)
        # `mmap` itself, not np.memmap: np.memmap resolves the path on every call, ~70 us of its ~90.
        with open(self.files[name][unit], "rb") as handle:
            mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        # The array holds the mapping; it is unmapped when the last view of it goes.
        return np.frombuffer(mapping, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)

    def _by_unit(self, docs: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """(unit, local positions) for sorted `docs`, in order."""
        units = np.searchsorted(self.firsts, docs, side="right") - 1
        for u in np.unique(units).tolist():
            yield u, docs[units == u] - self.firsts[u]

    def gather(self, docs: np.ndarray) -> tuple[np.ndarray, Shingles]:
        """Signatures (len(docs), P) and shingle lists of sorted, distinct `docs`, in that order."""
        signatures, lengths, hashes = [], [], []
        for u, local in self._by_unit(docs):
            offsets = self.offsets_of[u]
            # Fancy indexing copies out of the mapping; the mapping goes when the name does.
            signatures.append(self._mapped("signatures", u)[local])
            lengths.append(offsets[local + 1] - offsets[local])
            starts = np.repeat(offsets[local], lengths[-1])
            within = np.arange(int(lengths[-1].sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths[-1]) - lengths[-1], lengths[-1])
            hashes.append(self._mapped("shingles", u)[starts + within])
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
        return np.concatenate(signatures), Shingles(hashes=np.concatenate(hashes), offsets=offsets)


def _npy_layout(path: Path) -> tuple[int, tuple[int, ...], np.dtype]:
    """(data offset, shape, dtype) of a C-ordered .npy file, from its header."""
    with path.open("rb") as handle:
        read_header = np.lib.format.read_array_header_1_0 if np.lib.format.read_magic(handle) == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(handle)
        assert not fortran_order, "unit arrays are written C-ordered by np.save"
        return handle.tell(), shape, dtype


def near_duplicates_out_of_core(
    db: duckdb.DuckDBPyConnection, band_files: Sequence[str], arrays: UnitArrays, num_input: int, config: DedupConfig, batch_rows: int
) -> tuple[Removals, Families, NearDedupCounts]:
    """Removals and families by keep-order position, and counters, as `near_dedup.near_duplicates`
    returns them."""
    kept_a, kept_b, kept_similarity = [], [], []
    num_candidates = num_verified = 0
    bins = np.zeros(HISTOGRAM_BINS, dtype=np.int64)
    for a, b in candidate_batches(db, band_files, batch_rows):
        docs = np.unique(np.concatenate([a, b]))
        signatures, shingles = arrays.gather(docs)
        va, vb, similarity, estimate, verified = verify_pairs(signatures, shingles, np.searchsorted(docs, a), np.searchsorted(docs, b), config)
        kept_a.append(docs[va])
        kept_b.append(docs[vb])
        kept_similarity.append(similarity)
        num_candidates += len(a)
        num_verified += verified
        bins += np.asarray(histogram(estimate), dtype=np.int64)
    a, b, similarity = (np.concatenate(x) if x else np.zeros(0, dtype=t) for x, t in ((kept_a, np.int64), (kept_b, np.int64), (kept_similarity, np.float64)))
    removed = keep_rule(a, b, similarity)
    counts = NearDedupCounts(
        num_input=num_input,
        num_candidate_pairs=num_candidates,
        num_pairs_verified=num_verified,
        num_pairs_above_threshold=len(a),
        num_removed=len(removed),
        similarity_histogram=tuple(int(c) for c in bins),
    )
    return removed, families_of(a, b), counts
