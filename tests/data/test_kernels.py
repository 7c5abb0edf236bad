"""The C kernels and their numpy versions: the same numbers, each against a plain Python oracle."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ito_assets.data import kernels
from ito_assets.data.kernels import EMPTY, WORD_PRIME, WORD_SEED

native = pytest.mark.skipif(not kernels.NATIVE, reason="the C kernels are not built here (no C compiler at install): numpy's run")
IMPLEMENTATIONS = [pytest.param(True, id="C", marks=native), pytest.param(False, id="numpy")]
MASK = (1 << 64) - 1
RUNS = np.zeros((4, 3), np.int64)  # room for the runs of a 4-byte text


def python_word_hash(word: bytes) -> int:
    """The word hash as kernels.py's docstring states it, in Python integers."""
    h = int(WORD_SEED)
    for low in range(0, len(word), 8):
        h = ((h ^ int.from_bytes(word[low : low + 8], "little")) * int(WORD_PRIME)) & MASK
        h ^= h >> 32
    h ^= len(word)
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & MASK
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & MASK
    return h ^ (h >> 31)


@pytest.fixture(params=IMPLEMENTATIONS)
def use_c(request, monkeypatch) -> bool:
    monkeypatch.setattr(kernels, "NATIVE", request.param)
    return request.param


def packed(words: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.zeros(len(words) + 1, dtype=np.int64)
    np.cumsum([len(w) for w in words], out=starts[1:])
    return np.frombuffer(b"".join(words), dtype=np.uint8), starts


def test_the_word_hash_is_fixed() -> None:
    """Pinned values: the hash is this project's, so a change to it shows here, not as other
    near-duplicates after an upgrade."""
    assert python_word_hash(b"") == 0xE9E0033E3BADAF36
    assert python_word_hash(b"abc") == 0xFF5736F40C2D7C0E


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 15, 16, 17, 64])
def test_words_at_and_past_a_block_hash_as_stated(use_c, length) -> None:
    """Words of 7, 8 and 9 bytes: the last block padded, whole, and one byte into the next."""
    words = [bytes(97 + i % 26 for i in range(length)), b"x" * length, "é".encode() * length]
    assert kernels.hash_word_bytes(*packed(words)).tolist() == [python_word_hash(w) for w in words]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=30))
def test_word_hashes_of_any_bytes_match_the_statement(words) -> None:
    expected = [python_word_hash(w) for w in words]
    assert kernels.numpy_hash_word_bytes(*packed(words)).tolist() == expected
    if kernels.NATIVE:
        assert kernels.hash_word_bytes(*packed(words)).tolist() == expected


# ASCII letters, digits and the bytes between words, and non-ASCII letters, marks and punctuation
# that sit inside a run of word bytes or alone.
RUN_TEXT = st.text(alphabet=st.sampled_from(list("aZ09 _-.\n(xyQ") + ["é", "’", "中", "\u0301", "K"]), max_size=40)


def stated_runs(texts: list[str]) -> tuple[list[int], list[int], list[list[int]]]:
    """word_runs as its docstring states it, by a bytes regex per text: (hashes, offsets, runs)."""
    hashes, offsets, runs, at = [], [0], [], 0
    for text in texts:
        raw = text.encode()
        for match in re.finditer(rb"[0-9A-Za-z\x80-\xff]+", raw):
            if match.group().isascii():
                hashes.append(python_word_hash(match.group().lower()))
            else:
                runs.append([at + match.start(), at + match.end(), len(hashes)])
                hashes.append(0)
        offsets.append(len(hashes))
        at += len(raw)
    return hashes, offsets, runs


@settings(max_examples=120, deadline=None)
@given(st.lists(RUN_TEXT, max_size=12))
def test_word_runs_are_the_stated_runs_within_each_text(texts) -> None:
    """Texts laid end to end with no separator: a run at the end of one text and one at the start
    of the next stay two runs; a run of ASCII is hashed lower cased, one with a non-ASCII byte left
    to the caller."""
    data, bounds = packed([t.encode() for t in texts])
    expected = stated_runs(texts)
    implementations = [kernels.numpy_word_runs] + ([] if not kernels.NATIVE else [kernels.word_runs])
    for implementation in implementations:
        hashes, offsets, runs = implementation(data, bounds)
        assert (hashes.tolist(), offsets.tolist(), runs.tolist()) == expected
        assert runs.shape == (len(expected[2]), 3)


@pytest.mark.parametrize("length", [1, 7, 8, 9, 16, 17])
def test_word_runs_at_a_block_edge_and_a_text_end(use_c, length) -> None:
    """Runs of 7, 8 and 9 bytes, ending at a text's last byte or before a gap, one beginning or
    ending with a non-ASCII byte: the kernel reads 8 bytes at a time."""
    texts = ["Q" * length, "q" * length + " ", "é" + "x" * length, "x" * length + "é", " " * length + "Ab", ""]
    data, bounds = packed([t.encode() for t in texts])
    hashes, offsets, runs = kernels.word_runs(data, bounds)
    assert (hashes.tolist(), offsets.tolist(), runs.tolist()) == stated_runs(texts)


def test_word_runs_of_a_slice_of_the_bytes(use_c) -> None:
    """Bounds need not start at 0: the bytes before the first text are no text's, and a run's
    (start, end) are positions in `data`."""
    data = np.frombuffer("skip Me|One tw’o|".encode(), dtype=np.uint8)
    hashes, offsets, runs = kernels.word_runs(data, np.array([8, 12, 19]))
    assert hashes.tolist() == [python_word_hash(b"one"), 0] and offsets.tolist() == [0, 1, 2]
    assert runs.tolist() == [[12, 18, 1]] and bytes(data[12:18]).decode() == "tw’o"


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=60), st.data())
def test_gather_runs_puts_each_runs_bytes_end_to_end(data, draw) -> None:
    """Disjoint runs in ascending order, empty ones and ones that touch among them."""
    cuts = sorted(draw.draw(st.lists(st.integers(0, len(data)), max_size=8)))
    runs = np.array(list(zip(cuts[0::2], cuts[1::2])), dtype=np.int64).reshape(-1, 2)
    expected = b"".join(data[start:end] for start, end in runs.tolist())
    implementations = [kernels.numpy_gather_runs] + ([] if not kernels.NATIVE else [kernels.gather_runs])
    for implementation in implementations:
        assert bytes(implementation(np.frombuffer(data, dtype=np.uint8), runs)) == expected


def stated_splice(hashes: list[int], offsets: list[int], places: list[int], words: list[list[int]]) -> tuple[list[int], list[int]]:
    by_place = dict(zip(places, words))
    out, starts = [], []
    for i, h in enumerate(hashes):
        starts.append(len(out))
        out.extend(by_place.get(i, [h]))
    starts.append(len(out))
    return out, [starts[o] for o in offsets]


@settings(max_examples=120, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**64 - 1), max_size=5), max_size=8), st.data())
def test_splice_words_puts_each_runs_words_in_its_place(texts, data) -> None:
    """A run with no word, one, or several; places at a text's start and end; empty texts."""
    hashes = [h for text in texts for h in text]
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in texts])]).astype(np.int64)
    places = sorted(data.draw(st.sets(st.integers(0, max(len(hashes) - 1, 0)), max_size=len(hashes))))
    words = [data.draw(st.lists(st.integers(0, 2**64 - 1), max_size=3)) for _ in places]
    word_offsets = np.concatenate([[0], np.cumsum([len(w) for w in words])]).astype(np.int64)
    flat = np.array([w for run in words for w in run], dtype=np.uint64)
    expected = stated_splice(hashes, offsets.tolist(), places, words)
    implementations = [kernels.numpy_splice_words] + ([] if not kernels.NATIVE else [kernels.splice_words])
    for implementation in implementations:
        out, out_offsets = implementation(np.array(hashes, dtype=np.uint64), offsets, np.array(places, dtype=np.int64), flat, word_offsets)
        assert (out.tolist(), out_offsets.tolist()) == expected


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(-2**63, 2**63 - 1), max_size=12))
def test_row_digests_are_hashlibs_sha256_of_the_prefix_and_the_rows_digits(prefix, rows) -> None:
    """Prefixes of every length around the 64-byte block (the message's padding then takes one
    block or two), rows from int64's least to its greatest."""
    expected = [hashlib.sha256(prefix + b"%d" % row).digest() for row in rows]
    implementations = [kernels.numpy_row_digests] + ([] if not kernels.NATIVE else [kernels.row_digests])
    for implementation in implementations:
        digests = implementation(prefix, np.array(rows, dtype=np.int64))
        assert digests.shape == (len(rows), 32) and [bytes(d) for d in digests] == expected


@pytest.mark.parametrize("length", [0, 1, 54, 55, 56, 63, 64, 65, 119, 120, 128])
def test_row_digests_at_the_padding_edges(use_c, length) -> None:
    """SHA-256 pads a message with 0x80 and its 8-byte length: a message of 55 bytes fits one
    block, one of 56 needs two."""
    rows = np.array([0, 7, 10**18, -1], dtype=np.int64)
    prefix = b"p" * length
    assert [bytes(d) for d in kernels.row_digests(prefix, rows)] == [hashlib.sha256(prefix + b"%d" % r).digest() for r in rows.tolist()]


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 9), st.integers(1, 6), st.data())
def test_signature_agreement_is_numpys_mean_of_the_equal_slots(num_perm, num_rows, data) -> None:
    """The same float64 as numpy's mean, so that the threshold's edge falls alike (a pair at
    exactly the threshold, 0.8 of 5 slots, among them)."""
    values = st.integers(0, 3).map(np.uint32)  # few values: many slots agree
    signatures = np.array(data.draw(st.lists(st.lists(values, min_size=num_perm, max_size=num_perm), min_size=num_rows, max_size=num_rows)),
                          dtype=np.uint32).reshape(num_rows, num_perm)
    a = np.array(data.draw(st.lists(st.integers(0, num_rows - 1), max_size=10)), dtype=np.int64)
    b = np.array(data.draw(st.lists(st.integers(0, num_rows - 1), min_size=len(a), max_size=len(a))), dtype=np.int64)
    expected = (signatures[a] == signatures[b]).mean(axis=1) if len(a) else np.zeros(0)
    implementations = [kernels.numpy_signature_agreement] + ([] if not kernels.NATIVE else [kernels.signature_agreement])
    for implementation in implementations:
        assert implementation(signatures, a, b).tolist() == expected.tolist()


def test_signature_agreement_at_the_threshold(use_c) -> None:
    signatures = np.array([[1, 2, 3, 4, 5], [1, 2, 3, 4, 0], [1, 2, 3, 0, 0]], dtype=np.uint32)
    agreement = kernels.signature_agreement(signatures, np.array([0, 0, 2]), np.array([1, 2, 2]))
    assert agreement.tolist() == [4 / 5, 3 / 5, 1.0] and agreement[0] >= 0.8


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), max_size=40))
def test_distinct_is_numpys_unique(values) -> None:
    array = np.array(values, dtype=np.int64)
    assert kernels.distinct(array).tolist() == np.unique(array).tolist()
    assert kernels.distinct(array).dtype == np.int64


# Another thread moves a position past its array while the kernel runs without the GIL: it was
# checked before the loop, so the kernel checks it again as it uses it (the library before that
# crashed on each within 300 calls: SIGSEGV). Each setup: the call, the array the thread writes,
# where, and the value that is good there.
_RACE = """
import sys, threading
import numpy as np
from ito_assets.data import _kernels as K
n = 200_000
kernel, bad = sys.argv[1], 1 << 40
ones, steps = np.arange(n + 1, dtype=np.int64), np.arange(n, dtype=np.int64)
if kernel == "gather_runs":
    data, out = np.zeros(n, np.uint8), np.empty(n, np.uint8)
    runs = np.stack([np.arange(n), np.arange(n) + 1], axis=1).astype(np.int64)
    call, target, index, good = (lambda: K.gather_runs(data, runs, out)), runs, (n - 1, 1), n
elif kernel == "splice_words":
    hashes, offsets, places = np.zeros(n, np.uint64), np.array([0, n]), np.arange(0, n, 2, dtype=np.int64)
    words, word_offsets = np.zeros(len(places), np.uint64), np.arange(len(places) + 1, dtype=np.int64)
    out, out_offsets = np.empty(n, np.uint64), np.empty(2, np.int64)
    call = lambda: K.splice_words(hashes, offsets, places, words, word_offsets, out, out_offsets)
    target, index, good = places, len(places) - 1, n - 2
elif kernel == "hash_word_bytes":
    data, hashes = np.zeros(n, np.uint8), np.empty(n, np.uint64)
    call, target, index, good = (lambda: K.hash_word_bytes(data, ones, hashes)), ones, n - 1, n - 1
elif kernel == "minhash":
    x, perms, out = np.zeros(n, np.uint32), np.ones(2, np.uint32), np.empty(2 * n, np.uint32)
    call, target, index, good = (lambda: K.minhash(x, ones, perms, perms, out)), ones, n, n
elif kernel == "shingle_hashes":
    tokens, starts, multipliers, out = np.zeros(n, np.uint64), ones.copy(), np.ones(1, np.uint64), np.empty(n, np.uint64)
    call, target, index, good = (lambda: K.shingle_hashes(tokens, starts, 1, multipliers, ones, out)), starts, n - 1, n - 1
    bad = -bad  # past the end, the document would have no words to read
elif kernel == "sorted_sets":
    values, kept = np.zeros(n, np.uint64), np.empty(n + 1, np.int64)
    call, target, index, good = (lambda: K.sorted_sets(values, ones, kept)), ones, n, n
else:
    sets, out = np.arange(n, dtype=np.uint64), np.empty(n, np.float64)
    first = steps.copy()
    call, target, index, good = (lambda: K.pair_jaccard(sets, ones, first, steps, out)), first, n - 1, n - 1
stop = False
def flip():
    while not stop:
        target[index] = bad
        target[index] = good
thread = threading.Thread(target=flip)
thread.start()
for _ in range(300):
    try:
        call()
    except ValueError as error:
        assert "changed while the kernel ran" in str(error) or "within" in str(error) or "ascend" in str(error) or "shingles" in str(error), error
stop = True
thread.join()
"""


@native
@pytest.mark.parametrize("kernel", ["gather_runs", "splice_words", "hash_word_bytes", "minhash", "shingle_hashes",
                                    "sorted_sets", "pair_jaccard"])
def test_a_position_another_thread_moves_mid_call_is_refused_not_read(kernel) -> None:
    done = subprocess.run([sys.executable, "-c", _RACE, kernel], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


def test_signature_agreement_compares_other_dtypes_as_they_are(use_c) -> None:
    """A wider dtype is not cut to 32 bits: 1 and 1 + 2**32 differ."""
    signatures = np.array([[1, 5], [1 + 2**32, 5]], dtype=np.int64)
    assert kernels.signature_agreement(signatures, np.array([0]), np.array([1])).tolist() == [0.5]


def test_numpy_splice_words_refuses_word_offsets_that_do_not_cover_the_words() -> None:
    with pytest.raises(ValueError, match="word_offsets"):
        kernels.numpy_splice_words(np.arange(3, dtype=np.uint64), np.array([0, 3]), np.array([1]), np.array([9], dtype=np.uint64), np.array([1, 2]))


def brute_minhash(x: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    expected = np.full((len(offsets) - 1, len(a)), EMPTY, dtype=np.uint32)
    for doc, (start, end) in enumerate(zip(offsets[:-1], offsets[1:])):
        for shingle in x[start:end].tolist():
            expected[doc] = np.minimum(expected[doc], ((a.astype(np.uint64) * shingle + b) % 2**32).astype(np.uint32))
    return expected


@pytest.mark.parametrize("lengths", [[], [0], [8], [9], [3, 8, 2], [3, 9, 2], [0, 25, 0, 1, 16, 17], [40, 40]])
def test_signatures_are_the_minimum_over_each_whole_document(use_c, monkeypatch, lengths) -> None:
    """numpy's blocks of 8 shingles: a document of 8 fits one block, of 9 or more is taken in
    block-wide slices; either way (and in C) each slot is the minimum of (a x + b) mod 2^32 over
    the document's shingles, EMPTY for a document without any."""
    monkeypatch.setattr(kernels, "BLOCK_SHINGLES", 8)
    rng = np.random.default_rng(len(lengths))
    x = rng.integers(0, 2**32, size=sum(lengths), dtype=np.uint64).astype(np.uint32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    a = rng.integers(0, 2**32, size=16, dtype=np.uint64).astype(np.uint32) | np.uint32(1)
    b = rng.integers(0, 2**32, size=16, dtype=np.uint64).astype(np.uint32)
    x[:2] = [0, 2**32 - 1] if len(x) >= 2 else x[:2]  # the ends of the universe
    assert np.array_equal(kernels.minhash(x, offsets, a, b), brute_minhash(x, offsets, a, b))


def python_shingles(words: list[int], k: int, multipliers: list[int]) -> list[int]:
    """A document's shingle hashes as kernels.shingle_hashes states them, in Python integers."""
    def gram(ws: list[int]) -> int:
        n = len(ws)
        acc = (n + n * (n - 1) // 2 + sum(w * multipliers[j % len(multipliers)] for j, w in enumerate(ws))) & MASK
        acc ^= acc >> 30
        acc = (acc * 0xBF58476D1CE4E5B9) & MASK
        acc ^= acc >> 27
        acc = (acc * 0x94D049BB133111EB) & MASK
        return acc ^ (acc >> 31)

    if len(words) < k:
        return [gram(words)] if words else []
    return [gram(words[s : s + k]) for s in range(len(words) - k + 1)]


def test_shingle_offsets_must_cover_the_tokens_in_both_versions(use_c) -> None:
    """Tokens before the first document or after the last are no document's: both versions
    refuse them (numpy's used to hash windows there)."""
    from ito_assets.data.text import NGRAM_MULTIPLIERS

    for offsets in ([2, 6, 10], [0, 2, 7], [0, 5, 3, 10], []):
        with pytest.raises(ValueError, match="from 0 to T"):
            kernels.shingle_hashes(np.arange(10, dtype=np.uint64), np.array(offsets, dtype=np.int64), 3, NGRAM_MULTIPLIERS)


@pytest.mark.parametrize("k", [1, 2, 5, 9])
def test_shingles_are_the_k_grams_inside_each_document(use_c, k) -> None:
    """Documents of 0, 1, k - 1, k and k + 1 words and longer, side by side: no k-gram runs across
    a document's end, and a document shorter than k is one shingle of all its words."""
    from ito_assets.data.text import NGRAM_MULTIPLIERS

    rng = np.random.default_rng(k)
    lengths = [0, 1, max(k - 1, 0), k, k + 1, 0, 3 * k + 2, 1]
    tokens = rng.integers(0, 2**64, size=sum(lengths), dtype=np.uint64)
    token_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    hashes, offsets = kernels.shingle_hashes(tokens, token_offsets, k, NGRAM_MULTIPLIERS)
    multipliers = NGRAM_MULTIPLIERS.tolist()
    expected = [python_shingles(tokens[a:b].tolist(), k, multipliers) for a, b in zip(token_offsets[:-1], token_offsets[1:])]
    assert [hashes[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**64 - 1) | st.sampled_from([0, 5, 2**64 - 1]), max_size=70), max_size=12))
def test_sets_are_sorted_without_repeats_and_their_jaccard_exact(segments) -> None:
    """Segments short (insertion sort) and past 32 (qsort), with repeats and the ends of the range;
    every pair's Jaccard, a set with itself and with an empty one too."""
    values = np.array([v for segment in segments for v in segment], dtype=np.uint64)
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in segments])]).astype(np.int64)
    expected = [sorted(set(x)) for x in segments]
    pairs = [(i, j) for i in range(len(segments)) for j in range(len(segments))]
    a, b = np.array([i for i, _ in pairs], dtype=np.int64), np.array([j for _, j in pairs], dtype=np.int64)
    jaccard = [len(set(segments[i]) & set(segments[j])) / len(set(segments[i]) | set(segments[j])) if segments[i] or segments[j] else 0.0
               for i, j in pairs]
    for native_run in [False] + ([True] if kernels.NATIVE else []):
        sets, kept = (kernels.sorted_sets if native_run else kernels.numpy_sorted_sets)(values.copy(), offsets)
        assert [sets[x:y].tolist() for x, y in zip(kept[:-1], kept[1:])] == expected
        found = (kernels.pair_jaccard if native_run else kernels.numpy_pair_jaccard)(sets, kept, a, b)
        assert found.tolist() == jaccard


def python_mix64(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


@pytest.mark.parametrize(("bands", "rows", "slots"), [(3, 4, 12), (2, 3, 8), (1, 1, 1), (20, 6, 120)])
def test_band_keys_hash_each_bands_slots_as_stated(use_c, bands, rows, slots) -> None:
    """Slots past bands x rows are no band's; the ends of the slot range included."""
    from ito_assets.data.text import NGRAM_MULTIPLIERS

    rng = np.random.default_rng(slots)
    signatures = rng.integers(0, 2**32, size=(7, slots), dtype=np.uint64).astype(np.uint32)
    signatures[0, :] = 0xFFFFFFFF
    signatures[1, :] = 0
    multipliers = NGRAM_MULTIPLIERS.tolist()
    expected = []
    for row in signatures.tolist():
        keys = []
        for j in range(bands):
            acc = j
            for k in range(rows):
                acc = (acc * 0x100000001B3 + row[j * rows + k] * multipliers[k % len(multipliers)]) & MASK
            keys.append(python_mix64(acc))
        expected.append(keys)
    assert kernels.band_keys(signatures, bands, rows, NGRAM_MULTIPLIERS).tolist() == expected
    assert kernels.band_keys(signatures[:0], bands, rows, NGRAM_MULTIPLIERS).shape == (0, bands)


@native
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda k: k.word_runs(np.zeros(4, np.uint8), np.array([0, 5]), np.zeros(4, np.uint64), np.zeros(2, np.int64), RUNS), "within data"),
        (lambda k: k.word_runs(np.zeros(4, np.uint8), np.array([3, 1, 4]), np.zeros(4, np.uint64), np.zeros(3, np.int64), RUNS), "ascending"),
        (lambda k: k.word_runs(np.zeros(4, np.uint8), np.array([0, 4]), np.zeros(4, np.uint64), np.zeros(3, np.int64), RUNS), "offsets N\\+1"),
        (lambda k: k.word_runs(np.frombuffer(b"a b c", np.uint8), np.array([0, 5]), np.zeros(2, np.uint64), np.zeros(2, np.int64), RUNS),
         "fewer items"),
        (lambda k: k.word_runs(np.frombuffer("a é c".encode(), np.uint8), np.array([0, 6]), np.zeros(4, np.uint64), np.zeros(2, np.int64),
                               np.zeros((0, 3), np.int64)), "fewer items"),
        (lambda k: k.word_runs(np.zeros(4, np.uint8), np.array([0, 4]), np.zeros(4, np.uint64).tobytes(), np.zeros(2, np.int64), RUNS),
         "writable"),
        (lambda k: k.gather_runs(np.zeros(4, np.uint8), np.array([[0, 5]]), np.zeros(5, np.uint8)), "within data"),
        (lambda k: k.gather_runs(np.zeros(4, np.uint8), np.array([[3, 1]]), np.zeros(0, np.uint8)), "within data"),
        (lambda k: k.gather_runs(np.zeros(4, np.uint8), np.array([[-1, 1]]), np.zeros(2, np.uint8)), "within data"),
        (lambda k: k.gather_runs(np.zeros(4, np.uint8), np.array([[0, 2]]), np.zeros(3, np.uint8)), "as long as"),
        (lambda k: k.gather_runs(np.zeros(4, np.uint8), np.array([[0, 2], [0, 4]]), np.zeros(2, np.uint8)), "as long as"),
        (lambda k: k.gather_runs(np.zeros(4, np.uint8), np.array([0, 2, 3]), np.zeros(2, np.uint8)), "pairs"),
        (lambda k: k.gather_runs(np.zeros(4, np.uint8), np.array([[2, 3], [0, 1]]), np.zeros(2, np.uint8)), "ascending, disjoint"),
        (lambda k: k.gather_runs(np.zeros(4, np.uint8), np.array([[0, 3], [2, 4]]), np.zeros(5, np.uint8)), "ascending, disjoint"),
        (lambda k: k.splice_words(np.zeros(3, np.uint64), np.array([0, 2]), np.zeros(0, np.int64), np.zeros(0, np.uint64), np.array([0]),
                                  np.zeros(3, np.uint64), np.zeros(2, np.int64)), "from 0 to T"),
        (lambda k: k.splice_words(np.zeros(3, np.uint64), np.array([0, 3]), np.array([2, 1]), np.zeros(0, np.uint64), np.array([0, 0, 0]),
                                  np.zeros(1, np.uint64), np.zeros(2, np.int64)), "places ascend"),
        (lambda k: k.splice_words(np.zeros(3, np.uint64), np.array([0, 3]), np.array([3]), np.zeros(0, np.uint64), np.array([0, 0]),
                                  np.zeros(2, np.uint64), np.zeros(2, np.int64)), "places ascend"),
        (lambda k: k.splice_words(np.zeros(3, np.uint64), np.array([0, 3]), np.array([1]), np.zeros(2, np.uint64), np.array([0, 3]),
                                  np.zeros(4, np.uint64), np.zeros(2, np.int64)), "from 0 to Q"),
        (lambda k: k.splice_words(np.zeros(3, np.uint64), np.array([0, 3]), np.array([1]), np.zeros(2, np.uint64), np.array([0, 2]),
                                  np.zeros(3, np.uint64), np.zeros(2, np.int64)), "T-R\\+Q"),
        (lambda k: k.signature_agreement(np.zeros(6, np.uint32), 3, np.array([2]), np.array([0]), np.zeros(1)), "K rows"),
        (lambda k: k.signature_agreement(np.zeros(6, np.uint32), 3, np.array([-1]), np.array([0]), np.zeros(1)), "K rows"),
        (lambda k: k.signature_agreement(np.zeros(6, np.uint32), 4, np.array([0]), np.array([0]), np.zeros(1)), "N rows of P"),
        (lambda k: k.signature_agreement(np.zeros(6, np.uint32), 0, np.array([0]), np.array([0]), np.zeros(1)), "N rows of P"),
        (lambda k: k.signature_agreement(np.zeros(6, np.uint32), 3, np.array([0]), np.array([0]), np.zeros(2)), "out K"),
        (lambda k: k.row_digests(np.zeros(4, np.uint8), np.array([0, 9]), np.zeros(63, np.uint8)), "32 bytes a row"),
        (lambda k: k.row_digests(np.zeros(4, np.uint8), np.array([0, 9]), np.zeros(65, np.uint8)), "32 bytes a row"),
        (lambda k: k.hash_word_bytes(np.zeros(4, np.uint8), np.array([0, 9]), np.zeros(1, np.uint64)), "within data"),
        (lambda k: k.hash_word_bytes(np.zeros(4, np.uint8), np.array([2, 1]), np.zeros(1, np.uint64)), "ascending"),
        (lambda k: k.hash_word_bytes(np.zeros(4, np.uint8), np.array([0, 1]), np.zeros(2, np.uint64)), "T long"),
        (lambda k: k.shingle_hashes(np.zeros(4, np.uint64), np.array([0, 5]), 2, np.ones(1, np.uint64), np.array([0, 4]), np.zeros(4, np.uint64)),
         "from 0 to T"),
        (lambda k: k.shingle_hashes(np.zeros(4, np.uint64), np.array([0, 4]), 2, np.ones(1, np.uint64), np.array([0, 2]), np.zeros(2, np.uint64)),
         "each document's shingles"),
        (lambda k: k.shingle_hashes(np.zeros(4, np.uint64), np.array([0, 4]), 2, np.ones(1, np.uint64), np.array([0, 3]), np.zeros(4, np.uint64)),
         "S long"),
        (lambda k: k.shingle_hashes(np.zeros(4, np.uint64), np.array([0, 4]), 0, np.ones(1, np.uint64), np.array([0, 4]), np.zeros(4, np.uint64)),
         "token_offsets"),
        (lambda k: k.sorted_sets(np.zeros(3, np.uint64), np.array([0, 4]), np.zeros(2, np.int64)), "within values"),
        (lambda k: k.sorted_sets(np.zeros(3, np.uint64), np.array([1, 3]), np.zeros(2, np.int64)), "from 0"),
        (lambda k: k.sorted_sets(np.zeros(3, np.uint64), np.array([0, 2, 1]), np.zeros(3, np.int64)), "ascending"),
        (lambda k: k.sorted_sets(np.zeros(3, np.uint64), np.array([0, 3]), np.zeros(3, np.int64)), "kept M\\+1"),
        (lambda k: k.pair_jaccard(np.zeros(3, np.uint64), np.array([0, 3]), np.array([1]), np.array([0]), np.zeros(1)), "K sets"),
        (lambda k: k.pair_jaccard(np.zeros(3, np.uint64), np.array([0, 3]), np.array([-1]), np.array([0]), np.zeros(1)), "K sets"),
        (lambda k: k.pair_jaccard(np.zeros(3, np.uint64), np.array([0, 4]), np.array([0]), np.array([0]), np.zeros(1)), "within sets"),
        (lambda k: k.pair_jaccard(np.zeros(3, np.uint64), np.array([0, 3]), np.array([0]), np.array([0]), np.zeros(2)), "out K"),
        (lambda k: k.band_keys(np.zeros(10, np.uint32), 2, 3, np.ones(1, np.uint64), np.zeros(2, np.uint64)), "N rows"),
        (lambda k: k.band_keys(np.zeros(12, np.uint32), 2, 3, np.ones(1, np.uint64), np.zeros(3, np.uint64)), "N\\*bands"),
        (lambda k: k.band_keys(np.zeros(12, np.uint32), 0, 3, np.ones(1, np.uint64), np.zeros(0, np.uint64)), "N rows"),
        # Sizes whose products wrap past 2^63: refused, not read out of bounds.
        (lambda k: k.band_keys(np.zeros(1, np.uint32), 274177, 67280421310721, np.ones(1, np.uint64), np.zeros(274177, np.uint64)), "N rows"),
        (lambda k: k.shingle_hashes(np.zeros(1, np.uint64), np.array([1, -2**63, -1, 1]), 1, np.ones(1, np.uint64), np.zeros(4, np.int64),
                                    np.zeros(0, np.uint64)), "from 0 to T"),
        (lambda k: k.shingle_hashes(np.zeros(4, np.uint64), np.array([0, 2]), 2, np.ones(1, np.uint64), np.array([0, 1]), np.zeros(1, np.uint64)),
         "from 0 to T"),
        # An output sharing memory with an input would change what was checked.
        (lambda k: (lambda offs: k.pair_jaccard(np.array([1], np.uint64), offs, np.zeros(2, np.int64), np.zeros(2, np.int64), offs[1:].view(np.float64)))(
            np.array([0, 1, 1], np.int64)), "shares memory"),
        (lambda k: (lambda buf: k.word_runs(buf[:8].view(np.uint8), np.array([0, 8]), buf[1:3], np.zeros(2, np.int64), RUNS))(
            np.zeros(4, np.uint64)), "shares memory"),
        (lambda k: (lambda buf: k.splice_words(buf[:2], np.array([0, 2]), np.zeros(0, np.int64), np.zeros(0, np.uint64), np.array([0]),
                                               buf[1:3], np.zeros(2, np.int64)))(np.zeros(4, np.uint64)), "shares memory"),
        (lambda k: k.minhash(np.zeros(3, np.uint32), np.array([0, 4]), np.ones(2, np.uint32), np.ones(2, np.uint32), np.zeros(2, np.uint32)),
         "within x"),
        (lambda k: k.minhash(np.zeros(3, np.uint32), np.array([2, 1]), np.ones(2, np.uint32), np.ones(2, np.uint32), np.zeros(2, np.uint32)),
         "ascending"),
        (lambda k: k.minhash(np.zeros(3, np.uint32), np.array([0, 3]), np.ones(2, np.uint32), np.ones(3, np.uint32), np.zeros(2, np.uint32)),
         "P long"),
        (lambda k: k.minhash(np.zeros(3, np.uint32), np.array([0, 3]), np.ones(2, np.uint32), np.ones(2, np.uint32), np.zeros(3, np.uint32)),
         "N\\*P"),
        (lambda k: k.minhash(np.zeros(3, np.uint8), np.array([0, 3]), np.ones(2, np.uint32), np.ones(2, np.uint32), np.zeros(2, np.uint32)),
         "4-byte items"),
    ],
)
def test_the_c_kernels_refuse_arrays_that_do_not_fit(call, message) -> None:
    """Out-of-range positions and short outputs are refused before any byte is read or written."""
    with pytest.raises((ValueError, TypeError, BufferError), match=message):
        call(kernels._native)
