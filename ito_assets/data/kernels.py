"""The per-byte, per-shingle and per-pair loops of the data plane: word hashes, shingles, MinHash
signatures, band keys, sorted shingle sets and their exact Jaccard for deduplication, and the
SHA-256 of the documents' ids.

Each runs in C (`_kernels.c`, built at install where a C compiler is found) or, without it, in
numpy (hashlib for the ids); both give the same numbers (tests/data/test_kernels.py holds them
equal). numpy runs these loops as whole arrays per byte of text or per (permutation, shingle),
which cost more than the work: on the short corpus of benchmarks/dedup_speed.py (60,000
documents of 100-600 bytes, 3.05 M shingles, 2-core AMD EPYC, 2026-12-06) the ASCII texts' word
hashes took 0.055 s in C against 0.27-0.50 s in numpy, MinHash 0.04-0.06 s (48-79 M
shingles/s, AVX2) against 0.25-0.52 s. numba ran the same two loops as fast, but cost 0.5 s to
import and 0.7 s at its first call in every process (its cache loaded), more than it saved on a
step's work. On a 2-core Intel Xeon (2026-12-06, night) the word runs of all its texts, 7% of
them not ASCII, took 0.067 s in C against 0.64 s in numpy and 0.48 s for polars' regex alone.

The C kernels check their arguments with the GIL held and run their loops without it; every
position read from an array (offsets, runs, pairs) is checked again where the loop uses it, so
another thread writing an input meanwhile gets a ValueError, never a read past an array.

A word's hash: its lower-cased UTF-8 bytes folded 8 at a time, little-endian, the last block
padded with zeros (h = (h ^ block) * WORD_PRIME; h ^= h >> 32), from WORD_SEED, then
`mix64(h ^ length)`. Fixed here, not a library's hash, so it never changes with an upgrade.
"""

from __future__ import annotations

import hashlib

import numpy as np

try:
    from ito_assets.data import _kernels as _native
except ImportError:  # built without a C compiler: the numpy versions below
    _native = None

NATIVE = _native is not None
WORD_SEED = np.uint64(0x243F6A8885A308D3)
WORD_PRIME = np.uint64(0x9E3779B97F4A7C15)
EMPTY = np.uint32(0xFFFFFFFF)
# The numpy MinHash works on blocks of whole documents holding about this many shingles, so its
# (P, block) buffer stays in cache: 4,096 x 120 permutations x 4 bytes = ~2 MB, about an L2 cache
# (measured fastest between 2k and 8k on x86-64). A longer document is taken in block-wide slices.
BLOCK_SHINGLES = 4096


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (Steele et al. 2014): spreads every input bit over the output."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _word_positions(starts: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(starts, dtype=np.int64)


def hash_word_bytes(data: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """(T,) uint64: the hash of each word data[starts[i]:starts[i + 1]] (bytes as they are: the
    caller lower-cases them)."""
    data, starts = np.ascontiguousarray(data, dtype=np.uint8), _word_positions(starts)
    if not NATIVE:
        return numpy_hash_word_bytes(data, starts)
    out = np.empty(max(len(starts) - 1, 0), dtype=np.uint64)
    _native.hash_word_bytes(data, starts, out)
    return out


def word_runs(data: np.ndarray, bounds: np.ndarray, max_runs: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The runs of [0-9A-Za-z] and non-ASCII bytes inside each text laid end to end in `data` (text i
    is data[bounds[i]:bounds[i + 1]]) -> (hashes (T,) uint64, offsets (N + 1,) int64: text i's runs
    are hashes[offsets[i]:offsets[i + 1]]; runs (R, 3) int64). A run of ASCII alone is a word of
    `[^\\W_]+`: it is lower cased and hashed. A run with a non-ASCII byte may hold any number of
    words, which only Unicode's tables tell: its hash is 0, and `runs` gives its (start, end) in
    `data` and its place in `hashes`, for the caller to splice its words in (`splice_words`).
    `max_runs`: at least the runs with a non-ASCII byte (the caller may know fewer than the
    default, half the bytes: each holds a character of 2 bytes or more)."""
    data, bounds = np.ascontiguousarray(data, dtype=np.uint8), _word_positions(bounds)
    if not NATIVE:
        return numpy_word_runs(data, bounds)
    # A run and the byte after it: no more runs than half the bytes, one more per text.
    capacity = (len(data) + len(bounds)) // 2 + 1
    hashes = np.empty(capacity, dtype=np.uint64)  # pages never written are never touched
    offsets = np.empty(len(bounds), dtype=np.int64)
    runs = np.empty((capacity if max_runs is None else max_runs, 3), dtype=np.int64)
    words, num_runs = _native.word_runs(data, bounds, hashes, offsets, runs)
    return hashes[:words].copy(), offsets, runs[:num_runs].copy()


def gather_runs(data: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """The bytes data[start:end] of each run (R, 2) of (start, end), ascending and disjoint as
    `word_runs` gives them, end to end (uint8)."""
    data, runs = np.ascontiguousarray(data, dtype=np.uint8), np.ascontiguousarray(runs, dtype=np.int64).reshape(-1, 2)
    if not NATIVE:
        return numpy_gather_runs(data, runs)
    out = np.empty(int((runs[:, 1] - runs[:, 0]).sum()), dtype=np.uint8)
    _native.gather_runs(data, runs, out)
    return out


def splice_words(hashes: np.ndarray, offsets: np.ndarray, places: np.ndarray, words: np.ndarray, word_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each of `places` (ascending positions in `hashes`) replaced by its run's words,
    words[word_offsets[r]:word_offsets[r + 1]] (none, one or many) -> (hashes, the texts' offsets
    into them)."""
    hashes, offsets, places = np.ascontiguousarray(hashes, dtype=np.uint64), _word_positions(offsets), _word_positions(places)
    words, word_offsets = np.ascontiguousarray(words, dtype=np.uint64), _word_positions(word_offsets)
    if not NATIVE:
        return numpy_splice_words(hashes, offsets, places, words, word_offsets)
    out = np.empty(len(hashes) - len(places) + len(words), dtype=np.uint64)
    out_offsets = np.empty(len(offsets), dtype=np.int64)
    _native.splice_words(hashes, offsets, places, words, word_offsets, out, out_offsets)
    return out, out_offsets


def minhash(x: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, P) uint32: row d is the minimum over document d's shingles x[offsets[d]:offsets[d + 1]]
    of (a * x + b) mod 2^32 for each of the P permutations (a, b); EMPTY where it has none."""
    x, offsets = np.ascontiguousarray(x, dtype=np.uint32), _word_positions(offsets)
    a, b = np.ascontiguousarray(a, dtype=np.uint32), np.ascontiguousarray(b, dtype=np.uint32)
    if not NATIVE:
        return numpy_minhash(x, offsets, a, b)
    out = np.empty((len(offsets) - 1, len(a)), dtype=np.uint32)
    _native.minhash(x, offsets, a, b, out)
    return out


def shingle_hashes(tokens: np.ndarray, token_offsets: np.ndarray, k: int, multipliers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Word k-gram hashes of each document (its words tokens[token_offsets[d]:token_offsets[d + 1]]):
    for n words, n + n(n - 1)/2 + sum_j w[j] * multipliers[j % M] (mod 2^64), then `mix64`; a
    document of 1 to k - 1 words has one shingle, all of its words (n = its length), an empty one
    none -> (hashes (S,) uint64, offsets (N + 1,) int64)."""
    tokens, token_offsets = np.ascontiguousarray(tokens, dtype=np.uint64), _word_positions(token_offsets)
    multipliers = np.ascontiguousarray(multipliers, dtype=np.uint64)
    lengths = np.diff(token_offsets)
    if not len(token_offsets) or token_offsets[0] != 0 or token_offsets[-1] != len(tokens) or (lengths < 0).any() or k < 1:
        raise ValueError("token_offsets must run from 0 to T ascending, k at least 1")
    counts = np.where(lengths >= k, lengths - k + 1, np.minimum(lengths, 1))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    if not NATIVE:
        return numpy_shingle_hashes(tokens, token_offsets, k, multipliers, offsets), offsets
    out = np.empty(int(offsets[-1]), dtype=np.uint64)
    _native.shingle_hashes(tokens, token_offsets, k, multipliers, offsets, out)
    return out, offsets


def sorted_sets(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each segment values[offsets[i]:offsets[i + 1]] (offsets from 0) sorted, its repeats dropped
    -> (the sets end to end, their offsets)."""
    values, offsets = np.array(values, dtype=np.uint64), _word_positions(offsets)  # a copy: sorted in place
    if not NATIVE:
        return numpy_sorted_sets(values, offsets)
    kept = np.empty(len(offsets), dtype=np.int64)
    return values[: _native.sorted_sets(values, offsets, kept)], kept


def pair_jaccard(sets: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(K,) float64: the Jaccard of sets a[i] and b[i] (sorted and unique, as `sorted_sets` gives
    them: sets[offsets[j]:offsets[j + 1]]), 0 where both are empty."""
    sets, offsets = np.ascontiguousarray(sets, dtype=np.uint64), _word_positions(offsets)
    a, b = _word_positions(a), _word_positions(b)
    if not NATIVE:
        return numpy_pair_jaccard(sets, offsets, a, b)
    out = np.empty(len(a), dtype=np.float64)
    _native.pair_jaccard(sets, offsets, a, b, out)
    return out


def distinct(values: np.ndarray) -> np.ndarray:
    """`np.unique(values)` of integers (sorted, each value once) by a sort and a mask: numpy 2.4's np.unique
    took 0.72-0.81 s on 1 M int64 values against 0.010 s for np.sort, and deduplication calls it on
    every candidate pair (1.06 M on the man corpus of benchmarks/dedup_speed.py)."""
    ordered = np.sort(values, axis=None)
    keep = np.ones(len(ordered), dtype=bool)
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def signature_agreement(signatures: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(K,) float64: the share of equal slots of signatures[a[i]] and signatures[b[i]] ((N, P)
    uint32), as `(signatures[a] == signatures[b]).mean(axis=1)` gives it (the count over P, one
    division). 594,828 pairs of 120 slots: 0.234 s in numpy."""
    a, b = _word_positions(a), _word_positions(b)
    if not NATIVE or signatures.dtype != np.uint32 or signatures.ndim != 2 or signatures.shape[1] == 0:
        return numpy_signature_agreement(signatures, a, b)  # what MinHash gives is uint32: another dtype is compared as it is
    signatures = np.ascontiguousarray(signatures)
    out = np.empty(len(a), dtype=np.float64)
    _native.signature_agreement(signatures.reshape(-1), signatures.shape[1], a, b, out)
    return out


def row_digests(prefix: bytes, rows: np.ndarray) -> np.ndarray:
    """(N, 32) uint8: the SHA-256 of `prefix` followed by each row's decimal digits, as
    `hashlib.sha256(prefix + b"%d" % row).digest()`: the C kernel hashes the prefix once. On
    60,000 rows of a 65-byte prefix (the documents' ids of a source), CPU seconds, best of 7
    alternating: 0.021 s against 0.049 s for hashlib a row at a time (`sources.doc_ids`, the whole
    id column: 0.026 s against 0.053 s)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if not NATIVE:
        return numpy_row_digests(prefix, rows)
    out = np.empty((len(rows), 32), dtype=np.uint8)
    _native.row_digests(np.frombuffer(prefix, dtype=np.uint8), rows, out)
    return out


def band_keys(signatures: np.ndarray, bands: int, rows: int, multipliers: np.ndarray) -> np.ndarray:
    """(N, bands) uint64: the hash of each band's `rows` slots of each (N, bands * rows) signature:
    from the band's number j, acc = acc * 0x100000001B3 + slot[k] * multipliers[k % M] (mod 2^64),
    then `mix64`."""
    signatures = np.ascontiguousarray(signatures[:, : bands * rows], dtype=np.uint32)
    multipliers = np.ascontiguousarray(multipliers, dtype=np.uint64)
    if not NATIVE:
        return numpy_band_keys(signatures, bands, rows, multipliers)
    out = np.empty((len(signatures), bands), dtype=np.uint64)
    _native.band_keys(signatures, bands, rows, multipliers, out)
    return out


# The numpy versions: what runs without the C kernels, and what the tests hold them to.

def numpy_band_keys(signatures: np.ndarray, bands: int, rows: int, multipliers: np.ndarray) -> np.ndarray:
    n = signatures.shape[0]
    keys = np.zeros((n, bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(bands):
            block = signatures[:, j * rows : (j + 1) * rows].astype(np.uint64)
            acc = np.full(n, np.uint64(j), dtype=np.uint64)
            for k in range(rows):
                acc = acc * np.uint64(0x100000001B3) + block[:, k] * multipliers[k % len(multipliers)]
            keys[:, j] = mix64(acc)
    return keys


def numpy_sorted_sets(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.diff(offsets)
    local = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    values = values[: len(local)]
    order = np.lexsort((values, local))
    values, local = values[order], local[order]
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = (values[1:] != values[:-1]) | (local[1:] != local[:-1])
    kept = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.bincount(local[keep], minlength=len(lengths)), out=kept[1:])
    return values[keep], kept


def numpy_pair_jaccard(sets: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Both sets of each pair gathered, sorted by (pair, hash): a hash that occurs twice within a
    pair is in the intersection."""
    if len(a) == 0:
        return np.zeros(0, dtype=np.float64)
    lengths = np.diff(offsets)
    la, lb = lengths[a], lengths[b]

    def gather(docs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        starts = np.repeat(offsets[docs] - np.cumsum(sizes) + sizes, sizes)
        return sets[starts + np.arange(sizes.sum())]

    pair = np.concatenate([np.repeat(np.arange(len(a)), la), np.repeat(np.arange(len(a)), lb)])
    values = np.concatenate([gather(a, la), gather(b, lb)])
    order = np.lexsort((values, pair))
    pair, values = pair[order], values[order]
    twice = (values[1:] == values[:-1]) & (pair[1:] == pair[:-1])
    intersection = np.bincount(pair[1:][twice], minlength=len(a))
    union = la + lb - intersection
    return np.where(union > 0, intersection / np.maximum(union, 1), 0.0)


def numpy_shingle_hashes(tokens: np.ndarray, token_offsets: np.ndarray, k: int, multipliers: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    lengths = np.diff(token_offsets)
    grams = _gram_hashes(tokens, token_offsets, k, multipliers)
    short = np.flatnonzero((lengths > 0) & (lengths < k))
    if not len(short):
        return grams
    out = np.empty(int(offsets[-1]), dtype=np.uint64)
    whole = np.zeros(len(out), dtype=bool)
    whole[offsets[short]] = True
    out[~whole] = grams
    out[offsets[short]] = _whole_hashes(tokens, token_offsets, short, multipliers)
    return out


def _gram_hashes(tokens: np.ndarray, token_offsets: np.ndarray, n: int, multipliers: np.ndarray) -> np.ndarray:
    """The n-grams inside one document. The constant terms are summed once (addition mod 2^64
    commutes) and the windows that cross a document end are found from the N document ends."""
    width = len(tokens) - n + 1
    if width <= 0:
        return np.zeros(0, dtype=np.uint64)
    acc = np.full(width, np.uint64(n + n * (n - 1) // 2), dtype=np.uint64)
    term = np.empty(width, dtype=np.uint64)
    for k in range(n):
        np.multiply(tokens[k : k + width], multipliers[k % len(multipliers)], out=term)
        acc += term
    valid = np.ones(width, dtype=bool)
    begins, ends = token_offsets[:-1], token_offsets[1:]
    for back in range(1, n):  # a window starting `back` tokens before its document's end
        start = ends - back
        valid[start[(start >= begins) & (start < width)]] = False
    return mix64(acc[valid])


def _whole_hashes(tokens: np.ndarray, token_offsets: np.ndarray, docs: np.ndarray, multipliers: np.ndarray) -> np.ndarray:
    """The hash of all the words of each of `docs` (each shorter than k words); documents grouped by length."""
    lengths = np.diff(token_offsets)[docs]
    out = np.empty(len(docs), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for n in np.unique(lengths).tolist():
            group = np.flatnonzero(lengths == n)
            words = tokens[token_offsets[docs[group]][:, None] + np.arange(n)]
            acc = np.full(len(group), np.uint64(n + n * (n - 1) // 2), dtype=np.uint64)
            for k in range(n):
                acc += words[:, k] * multipliers[k % len(multipliers)]
            out[group] = mix64(acc)
    return out


def numpy_hash_word_bytes(data: np.ndarray, starts: np.ndarray) -> np.ndarray:
    lengths = np.diff(starts)
    h = np.full(len(lengths), WORD_SEED, dtype=np.uint64)
    padded = np.zeros(len(data) + 8, dtype=np.uint8)
    padded[: len(data)] = data
    # Element i is the 8 bytes from byte i on, little-endian (an unaligned, overlapping view).
    at_byte = np.ndarray(shape=(len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))
    active, k = np.flatnonzero(lengths > 0), 0
    with np.errstate(over="ignore"):
        while len(active):
            block = at_byte[starts[active] + 8 * k].astype(np.uint64)
            left = lengths[active] - 8 * k
            tail = left < 8
            block[tail] &= (np.uint64(1) << (np.uint64(8) * left[tail].astype(np.uint64))) - np.uint64(1)
            folded = (h[active] ^ block) * WORD_PRIME
            h[active] = folded ^ (folded >> np.uint64(32))
            k += 1
            active = active[left > 8]
    return mix64(h ^ lengths.astype(np.uint64))


def numpy_word_runs(data: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    base = int(bounds[0]) if len(bounds) else 0
    data = data[base : bounds[-1]] if len(bounds) else data[:0]
    bounds = bounds - base
    non_ascii = data >= np.uint8(0x80)
    letter = (((data | np.uint8(0x20)) - np.uint8(ord("a"))) < np.uint8(26)) & ~non_ascii  # uint8 arithmetic wraps below "a"
    word = letter | ((data - np.uint8(ord("0"))) < np.uint8(10)) | non_ascii
    inner = bounds[1:-1]
    inner = inner[(inner > 0) & (inner < len(word))]
    before = np.zeros(len(word), dtype=bool)
    before[1:] = word[:-1]
    before[inner] = False  # a run never goes on across a text's start
    after = np.zeros(len(word), dtype=bool)
    after[:-1] = word[1:]
    after[inner - 1] = False
    starts, ends = np.flatnonzero(word & ~before), np.flatnonzero(word & ~after) + 1
    packed = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(ends - starts, out=packed[1:])
    lowered = (data | (letter.astype(np.uint8) << np.uint8(5)))[word]
    hashes = numpy_hash_word_bytes(lowered, packed)
    seen = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum(non_ascii, out=seen[1:])
    places = np.flatnonzero(seen[ends] > seen[starts])
    hashes[places] = 0
    offsets = np.searchsorted(starts, bounds) if len(bounds) else np.zeros(0, dtype=np.int64)
    runs = np.stack([starts[places] + base, ends[places] + base, places], axis=1).astype(np.int64).reshape(-1, 3)
    return hashes, offsets.astype(np.int64), runs


def numpy_gather_runs(data: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """Through a mask of the runs' bytes (disjoint, ascending, as `word_runs` gives them): 2 bytes
    of work arrays a byte of data, where each byte's position would take 16."""
    outside = (runs[:, 0] < 0) | (runs[:, 1] < runs[:, 0]) | (runs[:, 1] > len(data))
    if outside.any() or (runs[1:, 0] < runs[:-1, 1]).any():
        raise ValueError("runs must be disjoint (start, end) pairs within data, ascending")
    runs = runs[runs[:, 1] > runs[:, 0]]  # an empty run has no bytes, and no edges
    edges = np.zeros(len(data) + 1, dtype=np.int8)
    edges[runs[:, 0]] = 1
    edges[runs[:, 1]] -= 1  # a run may end where the next starts
    return data[np.cumsum(edges[:-1], dtype=np.int8).view(bool)]


def numpy_splice_words(hashes: np.ndarray, offsets: np.ndarray, places: np.ndarray, words: np.ndarray, word_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(hashes) or len(word_offsets) != len(places) + 1 or (
            np.diff(places) < 1).any() or (len(places) and (places[0] < 0 or places[-1] >= len(hashes))) or (
            word_offsets[0] != 0 or word_offsets[-1] != len(words) or (np.diff(word_offsets) < 0).any()):
        raise ValueError("offsets must run from 0 to T, places ascend within hashes, word_offsets R+1 from 0 to Q ascending")
    counts = np.ones(len(hashes), dtype=np.int64)
    counts[places] = np.diff(word_offsets)
    starts = np.zeros(len(hashes) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    out = np.empty(int(starts[-1]), dtype=np.uint64)
    kept = np.ones(len(hashes), dtype=bool)
    kept[places] = False
    out[starts[:-1][kept]] = hashes[kept]
    sizes = np.diff(word_offsets)
    out[np.repeat(starts[places] - word_offsets[:-1], sizes) + np.arange(len(words), dtype=np.int64)] = words
    return out, starts[offsets]


def numpy_signature_agreement(signatures: np.ndarray, a: np.ndarray, b: np.ndarray, *, chunk: int = 65_536) -> np.ndarray:
    out = np.empty(len(a), dtype=np.float64)
    for s in range(0, len(a), chunk):
        out[s : s + chunk] = (signatures[a[s : s + chunk]] == signatures[b[s : s + chunk]]).mean(axis=1)
    return out


def numpy_row_digests(prefix: bytes, rows: np.ndarray) -> np.ndarray:
    digests = b"".join(hashlib.sha256(prefix + b"%d" % row).digest() for row in rows.tolist())
    return np.frombuffer(digests, dtype=np.uint8).reshape(len(rows), 32)


def numpy_minhash(x: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a[:, None], b[:, None]
    lengths = np.diff(offsets)
    out = np.full((len(a), len(lengths)), EMPTY, dtype=np.uint32)
    nonempty = np.flatnonzero(lengths > 0)
    starts = offsets[:-1]
    nonempty_starts = starts[nonempty]
    buffer = np.empty((len(a), BLOCK_SHINGLES), dtype=np.uint32)
    i = 0
    while i < len(nonempty):
        # A block of whole documents with about BLOCK_SHINGLES shingles (at least one document).
        first = nonempty_starts[i]
        j = max(int(np.searchsorted(nonempty_starts, first + BLOCK_SHINGLES, side="right")) - 1, i + 1)
        docs = nonempty[i:j]
        stop = offsets[docs[-1] + 1]
        if stop - first <= BLOCK_SHINGLES:
            block = buffer[:, : int(stop - first)]
            np.multiply(a, x[first:stop][None, :], out=block)
            np.add(block, b, out=block)
            out[:, docs] = np.minimum.reduceat(block, starts[docs] - first, axis=1)
        else:  # one document longer than a block: the minimum of its block-wide slices
            for low in range(int(first), int(stop), BLOCK_SHINGLES):
                high = min(int(stop), low + BLOCK_SHINGLES)
                block = buffer[:, : high - low]
                np.multiply(a, x[low:high][None, :], out=block)
                np.add(block, b, out=block)
                np.minimum(out[:, docs[0]], block.min(axis=1), out=out[:, docs[0]])
        i = j
    return out.T.copy()
