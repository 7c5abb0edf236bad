"""Near-duplicate removal: LSH banding -> candidate pairs -> verified Jaccard -> keep rule.

1. Banding: the P signature slots are cut into `bands` bands of `rows` slots; two documents that
   agree on every slot of some band are a candidate pair (Broder 1997; Leskovec et al., Mining of
   Massive Datasets, ch. 3.4).
2. Verification: a pair is a duplicate only when its Jaccard is >= threshold, computed exactly on
   the two shingle sets (default) or estimated from the signatures; pairs whose estimate is far
   below the threshold are discarded first.
3. Keep rule: documents are visited in keep order and one is removed only when it duplicates a
   document that is already KEPT. Removals are therefore always justified against a survivor, and
   nothing is chained transitively (a union-find over candidate pairs would remove documents that
   resemble no survivor). Each removed document is recorded with the kept document it duplicates,
   the similarity, and the cluster id (the kept document's id).
4. Families, for auditors: the connected components of the verified pairs. A cluster is a star
   around one kept document, so two near-duplicates of each other can sit in different clusters;
   a family holds every document linked to another by a chain of verified pairs. Families never
   change what is removed.

Indices here are positions in the keep order ("rank"), so "earlier" is simply "smaller".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import polars as pl
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from ito_assets.data import kernels
from ito_assets.data.config import DedupConfig
from ito_assets.data.kernels import EMPTY, distinct, pair_jaccard
from ito_assets.data.minhash import Shingles, estimated_jaccard
from ito_assets.data.text import NGRAM_MULTIPLIERS

HISTOGRAM_BINS = 20  # 0.05-wide bins of estimated Jaccard
DEFAULT_ANCHORS = DedupConfig().bucket_anchors


@dataclass(frozen=True)
class NearDedupCounts:
    num_input: int
    num_candidate_pairs: int
    num_pairs_verified: int
    num_pairs_above_threshold: int
    num_removed: int
    similarity_histogram: tuple[int, ...]  # candidate pairs per 0.05 bin of estimated Jaccard


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(N, bands) uint64: the hash of each band's `rows` slots (`kernels.band_keys`)."""
    return kernels.band_keys(signatures, bands, rows, NGRAM_MULTIPLIERS)


def band_rows(signatures: np.ndarray, bands: int, rows: int, first: int = 0) -> pl.DataFrame:
    """One (doc, band, key) row per band of every document with shingles; `doc` is the position
    in the keep order (`first` + the row). Documents without shingles never pair."""
    eligible = np.flatnonzero(signatures[:, 0] != EMPTY) if len(signatures) else np.zeros(0, dtype=np.int64)
    keys = band_keys(signatures[eligible], bands, rows)
    return pl.DataFrame(
        {
            "doc": np.repeat(eligible.astype(np.int64) + first, bands),
            "band": np.tile(np.arange(bands, dtype=np.int32), len(eligible)),
            "key": keys.reshape(-1),
        },
        schema={"doc": pl.Int64, "band": pl.Int32, "key": pl.UInt64},
    )


def candidate_pairs(signatures: np.ndarray, bands: int, rows: int, anchors: int = DEFAULT_ANCHORS) -> tuple[np.ndarray, np.ndarray]:
    """Distinct pairs (a < b) of documents that some band pairs, ordered by (b, a), in memory
    (`band_join` is the out-of-core equivalent): each band's keys sorted, and each member of a run
    of equal keys paired with the members after it (with `anchors`, only where it is among the
    run's first `anchors` in keep order: DedupConfig.bucket_anchors), a pair once however many bands
    pair it. Most keys are unique: each band first sorts
    its keys' high bits with the document's position in the low ones (a sort of values, 3x an
    argsort's speed), and only the documents whose high bits repeat are grouped on their whole
    key. On 55,000 documents of 20 bands (benchmarks/dedup_speed.py's short corpus), band keys
    included: 0.043 s, against 0.065 s with an argsort of every band and 0.42-0.52 s for a polars
    self-join of band rows (measured before the pairs were merged a band at a time)."""
    eligible = np.flatnonzero(signatures[:, 0] != EMPTY) if len(signatures) else np.zeros(0, dtype=np.int64)
    keys = band_keys(signatures[eligible], bands, rows)
    low = np.uint64((1 << max(len(eligible) - 1, 1).bit_length()) - 1)
    position = np.arange(len(eligible), dtype=np.uint64)
    pairs = np.zeros(0, dtype=np.int64)  # later * N + earlier, distinct and sorted
    for band in range(bands):
        packed = np.sort((keys[:, band] & ~low) | position)
        high = packed & ~low
        repeat = high[1:] == high[:-1]
        if not repeat.any():
            continue
        shared = np.zeros(len(packed), dtype=bool)
        shared[1:] |= repeat
        shared[:-1] |= repeat
        members = (packed[shared] & low).astype(np.int64)
        # `members` are in keep order within equal high bits (the positions are the low bits of
        # `packed`), and a stable sort keeps that order within a run: its anchors come first.
        order = members[np.argsort(keys[members, band], kind="stable")]
        key = keys[order, band]
        edges = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1], [True]]))
        # Each sorted position pairs with the positions after it up to its run's end (if it is
        # among its run's first `anchors`, where they are set).
        sizes = np.diff(edges)
        partners = np.repeat(edges[1:], sizes) - np.arange(len(key)) - 1
        if anchors:
            partners[np.arange(len(key)) - np.repeat(edges[:-1], sizes) >= anchors] = 0
        first = np.flatnonzero(partners)
        partners = partners[first]
        first = np.repeat(first, partners)
        second = first + 1 + np.arange(len(first)) - np.repeat(np.cumsum(partners) - partners, partners)
        x, y = np.minimum(order[first], order[second]), np.maximum(order[first], order[second])
        # Merged a band at a time: a cluster pairs again in most bands (16,000 licences peaked at
        # 1.5 GB with every band's pairs held until the end).
        pairs = _merged(pairs, distinct(eligible[y].astype(np.int64) * len(signatures) + eligible[x]))
    return pairs % max(len(signatures), 1), pairs // max(len(signatures), 1)


def _merged(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The distinct values of two sorted, distinct arrays, sorted. A stable sort merges the two
    runs in linear time (a sort of all the pairs again at every band took 0.63 s for 800,000
    pairs, 0.13 s so)."""
    merged = np.sort(np.concatenate([first, second]), kind="stable")
    return merged[np.concatenate([[True], merged[1:] != merged[:-1]])] if len(merged) else merged


def exact_jaccard(shingles: Shingles, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact Jaccard of the shingle sets of each pair (sets as `Shingles.as_sets` gives them)."""
    return pair_jaccard(shingles.hashes, shingles.offsets, a, b)


class ShingleSets(Protocol):
    """What verification reads of the documents' shingles: `Shingles`, or the band join's
    `LazyShingles`, which reads only the documents asked for."""

    def as_sets(self, docs: np.ndarray) -> tuple[Shingles, np.ndarray]: ...


def verify_pairs(
    signatures: np.ndarray, shingles: ShingleSets, a: np.ndarray, b: np.ndarray, config: DedupConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """-> (a, b, similarity) of pairs at or above the threshold, the estimates of all candidate
    pairs (for the histogram), and the number of pairs that went to exact verification."""
    estimate = estimated_jaccard(signatures, a, b)
    if config.verify == "signature":
        ok = estimate >= config.threshold
        return a[ok], b[ok], estimate[ok], estimate, 0
    worth = estimate >= config.threshold - config.prefilter_margin
    va, vb = a[worth], b[worth]
    sets, position = shingles.as_sets(np.concatenate([va, vb]))
    similarity = exact_jaccard(sets, position[va], position[vb])
    ok = similarity >= config.threshold
    return va[ok], vb[ok], similarity[ok], estimate, int(worth.sum())


@dataclass(frozen=True)
class Removals:
    """Near-duplicates by keep-order position among the representatives, in removal order:
    `removed[i]` duplicates the kept `kept[i]` with Jaccard `similarity[i]`. Arrays, not a dict:
    a dict entry with its tuple and boxed numbers cost ~250 bytes per removed document."""

    removed: np.ndarray
    kept: np.ndarray
    similarity: np.ndarray

    def __len__(self) -> int:
        return len(self.removed)

    def as_dict(self) -> dict[int, tuple[int, float]]:
        return {int(r): (int(k), float(s)) for r, k, s in zip(self.removed, self.kept, self.similarity)}


def keep_rule(a: np.ndarray, b: np.ndarray, similarity: np.ndarray) -> Removals:
    """Removed rank -> (kept rank it duplicates, similarity), visiting documents in keep order.

    Edges are sorted by their later document, so every edge into an earlier document is settled
    before it serves as a target; among kept targets the most similar wins (ties: the earliest)."""
    order = np.lexsort((a, -similarity, b))
    size = int(max(a.max(initial=-1), b.max(initial=-1))) + 1
    is_removed = np.zeros(size, dtype=bool)
    chosen = np.zeros(len(order), dtype=bool)
    for i in order.tolist():
        later, earlier = int(b[i]), int(a[i])
        if is_removed[later] or is_removed[earlier]:
            continue
        is_removed[later] = chosen[i] = True
    picked = order[chosen[order]]  # edges in the order they were chosen: by later document
    return Removals(removed=b[picked].astype(np.int64), kept=a[picked].astype(np.int64), similarity=similarity[picked].astype(np.float64))


@dataclass(frozen=True)
class Families:
    """Documents in a family of two or more, by keep-order position: `member[i]` belongs to the
    family whose first document in keep order is `root[i]` (a root is its own member)."""

    member: np.ndarray
    root: np.ndarray

    def __len__(self) -> int:
        return len(self.member)


def families_of(a: np.ndarray, b: np.ndarray) -> Families:
    """The connected components of the verified pairs (a, b), each named by its smallest position."""
    ends = np.concatenate([a, b])
    nodes = distinct(ends)
    inverse = np.searchsorted(nodes, ends)
    if not len(nodes):
        return Families(member=np.zeros(0, dtype=np.int64), root=np.zeros(0, dtype=np.int64))
    edges = coo_matrix((np.ones(len(a), dtype=np.int8), (inverse[: len(a)], inverse[len(a) :])), shape=(len(nodes), len(nodes)))
    _, labels = connected_components(edges, directed=False)
    first = np.full(labels.max() + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, labels, nodes)  # nodes are sorted, but a label's first node need not come first
    return Families(member=nodes.astype(np.int64), root=first[labels])


def histogram(values: np.ndarray) -> tuple[int, ...]:
    counts, _ = np.histogram(values, bins=HISTOGRAM_BINS, range=(0.0, 1.0))
    return tuple(int(c) for c in counts)


def near_duplicates(signatures: np.ndarray, shingles: Shingles, config: DedupConfig) -> tuple[Removals, Families, NearDedupCounts]:
    """Signatures and shingle sets of documents in keep order -> removals by rank, families, counters."""
    a, b = candidate_pairs(signatures, config.bands, config.rows, config.bucket_anchors)
    va, vb, similarity, estimate, num_verified = verify_pairs(signatures, shingles, a, b, config)
    removed = keep_rule(va, vb, similarity)
    counts = NearDedupCounts(
        num_input=len(signatures),
        num_candidate_pairs=len(a),
        num_pairs_verified=num_verified,
        num_pairs_above_threshold=len(va),
        num_removed=len(removed),
        similarity_histogram=histogram(estimate),
    )
    return removed, families_of(va, vb), counts
