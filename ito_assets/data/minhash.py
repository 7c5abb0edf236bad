"""MinHash signatures over word-shingle hashes.

A document's shingles are its word k-grams (k = shingle_size), each hashed to 32 bits (the top
half of the 64-bit n-gram hash of `text.ngram_hashes`). Permutation i maps a shingle x to
(a_i * x + b_i) mod 2^32 with a_i odd: a bijection of the 32-bit universe, so the minimum over a
document is a true min under a permutation, as in datasketch (which uses (a x + b) mod (2^61 - 1)
truncated to 32 bits). One multiply-add in uint32 per shingle and permutation is SIMD-friendly:
`kernels.minhash` runs it (benchmarks/dedup_speed.py measures it against datasketch and rensa's
R-MinHash on the same shingle hashes).

Shapes: S shingles in total, N documents, P = num_perm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ito_assets.data.kernels import distinct, minhash, shingle_hashes, signature_agreement, sorted_sets
from ito_assets.data.text import NGRAM_MULTIPLIERS, TokenHashes, word_hashes


@dataclass(frozen=True)
class Shingles:
    """Shingle hashes per document, CSR layout: hashes (S,) uint64, offsets (N + 1,) int64, in
    document order (a document may repeat a shingle; `as_sets` removes repeats where needed)."""

    hashes: np.ndarray
    offsets: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def as_sets(self, docs: np.ndarray) -> tuple["Shingles", np.ndarray]:
        """The shingle sets (sorted, unique) of `docs` only, and each original document's position
        in the result (-1 when not requested). Sorting only the documents that need exact
        verification keeps this off the hot path."""
        docs = distinct(docs)
        lengths = self.lengths[docs]
        starts = np.repeat(self.offsets[docs] - np.cumsum(lengths) + lengths, lengths)
        gathered = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=gathered[1:])
        values, offsets = sorted_sets(self.hashes[starts + np.arange(lengths.sum(), dtype=np.int64)], gathered)
        position = np.full(len(self.lengths), -1, dtype=np.int64)
        position[docs] = np.arange(len(docs))
        return Shingles(hashes=values, offsets=offsets), position


def shingle_lists(tokens: TokenHashes, k: int) -> Shingles:
    """Word k-gram hashes per document, in document order. A document shorter than k words has one
    shingle, all of its words (so short texts still compare); an empty document has none. The
    hashes are `text.ngram_hashes`' (tests/data/test_dedup_fast_paths.py holds them equal), computed
    by `kernels.shingle_hashes` without its per-token document lookups."""
    hashes, offsets = shingle_hashes(tokens.hashes, tokens.offsets, k, NGRAM_MULTIPLIERS)
    return Shingles(hashes=hashes, offsets=offsets)


@dataclass(frozen=True)
class MinHasher:
    """P permutations of the 32-bit shingle universe, drawn from a fixed seed."""

    num_perm: int
    seed: int = 1

    def _params(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        a = rng.integers(1, 2**32, size=self.num_perm, dtype=np.uint64).astype(np.uint32) | np.uint32(1)
        b = rng.integers(0, 2**32, size=self.num_perm, dtype=np.uint64).astype(np.uint32)
        return a, b

    def signatures(self, shingles: Shingles) -> np.ndarray:
        """(N, P) uint32 signatures; a document without shingles gets EMPTY in every slot."""
        a, b = self._params()
        return minhash((shingles.hashes >> np.uint64(32)).astype(np.uint32), shingles.offsets, a, b)

    def signatures_of_texts(self, texts: pl.Series, shingle_size: int) -> tuple[np.ndarray, Shingles]:
        shingles = shingle_lists(word_hashes(texts), shingle_size)
        return self.signatures(shingles), shingles


def estimated_jaccard(signatures: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Share of equal signature slots for each pair (a[i], b[i]): an unbiased Jaccard estimate."""
    return signature_agreement(signatures, a, b)
