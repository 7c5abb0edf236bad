"""Text normalisation and word tokenisation shared by deduplication and decontamination.

Documents are stored NFC-normalised (the version is recorded with every source). Both dedup and
decontamination work on *words*: maximal runs of Unicode letters and digits with the marks and
joiners inside them (`[^\\W_]+` as polars' regex reads it; Python's `re` is given the same
classes), lower cased, so punctuation is stripped and whitespace collapsed by construction.
Decontamination also normalises digits (every run of digits becomes "0"), so that "Question 12"
and "question 7" agree, and folds fullwidth Latin letters (ＡＢＣ, as CJK text writes Latin) to
ASCII, one character for one, so that a copy in fullwidth forms is still a copy (the
`digits_normalized` words).

Tokens are hashed to uint64 by `kernels` (in C, or numpy without a compiler): a hash of the word's
UTF-8 bytes fixed in this project, so the same word hashes the same in every process and version.
Shapes below: N documents, T tokens in total; `offsets` has N + 1 entries (CSR layout), the
tokens of document i are `hashes[offsets[i]:offsets[i + 1]]`.

Decontamination also keeps the words' bytes end to end, without separators (`chars`), and where
two words of a text are separated by punctuation alone (`joins_between`): a copy that deletes
punctuation merges such words ("unique(l:" -> "uniquel"), which no word n-gram can see, but the
bytes from a word start on are the same (`window_hashes`).
"""

from __future__ import annotations

import functools
import re
import string
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from ito_assets.data import kernels
from ito_assets.data.kernels import gather_runs, hash_word_bytes, mix64, splice_words, word_runs  # noqa: F401 (mix64: the data plane's finaliser)

NORMALIZATION_FORM = "NFC"
# Recorded with every source: the same bytes normalise identically under the same Unicode version.
NORMALIZATION_VERSION = f"NFC/unicode-{unicodedata.unidata_version}"

WORD_PATTERN = r"[^\W_]+"
DIGITS_PATTERN = r"\d+"

# Odd multipliers for combining word hashes into n-gram hashes (from splitmix64 / xxhash primes).
NGRAM_MULTIPLIERS = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
     0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x94D049BB133111EB, 0xBF58476D1CE4E5B9],
    dtype=np.uint64,
)


def normalize(text: str) -> str:
    return unicodedata.normalize(NORMALIZATION_FORM, text)


@dataclass(frozen=True)
class TokenHashes:
    """Word hashes of N documents in CSR layout: hashes (T,) uint64, offsets (N + 1,) int64.
    Decontamination's tokens (digits normalised) also hold `chars`, the words' UTF-8 bytes end to
    end (uint8), and `char_offsets` (T + 1,) int64, where each word starts in them."""

    hashes: np.ndarray
    offsets: np.ndarray
    chars: np.ndarray | None = None
    char_offsets: np.ndarray | None = None

    @property
    def num_docs(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def doc_index(self) -> np.ndarray:
        """(T,) the document of every token."""
        return np.repeat(np.arange(self.num_docs, dtype=np.int64), self.lengths)


# Fullwidth Latin small letters (U+FF41-FF5A; the capitals are lower-cased to them first) and
# their ASCII letters. Folding costs 0.08 s per 53 MB of manual pages, against 0.52 s to cut them
# into words (polars' replace_many).
_FULLWIDTH_LETTERS = [chr(code) for code in range(0xFF41, 0xFF5B)]
_ASCII_LETTERS = [chr(ord(letter) - 0xFEE0) for letter in _FULLWIDTH_LETTERS]
_FOLD_FULLWIDTH = str.maketrans(dict(zip(_FULLWIDTH_LETTERS, _ASCII_LETTERS)))


def fold_fullwidth(word: str) -> str:
    """`word` with its fullwidth Latin letters as ASCII: decontamination's raw words (digits kept)
    compared as its normalised ones are cut."""
    return word.translate(_FOLD_FULLWIDTH)


# Unicode's default-ignorable code points (DerivedCoreProperties.txt, Default_Ignorable_Code_Point):
# drawn as nothing, so "contami\u00adnation" (a soft hyphen) reads as one word. Decontamination's
# cut leaves them out: one between two word characters no longer splits the word, and none is part
# of a word's text (the zero-width joiners too, which `\w` holds: a copy without them is the same).
_IGNORABLE_RANGES = ((0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
                     (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
                     (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
                     (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))
IGNORABLE_PATTERN = "[" + "".join(f"\\x{{{low:X}}}-\\x{{{high:X}}}" for low, high in _IGNORABLE_RANGES) + "]"
# HTML character references (`&nbsp;`, `&#160;`, `&amp;`, `&lt;`), as text scraped from web pages
# keeps them: each is read as a separator, the place of the space or punctuation it mostly stands
# for, so that "question&nbsp;text" is the words of "question text". One that stands for a letter
# (`caf&eacute;`) splits its word there. Matched after lower-casing, so case does not matter.
ENTITY_PATTERN = r"&(?:[a-z][a-z0-9]{1,31}|#[0-9]{1,7}|#x[0-9a-f]{1,6});"
# Recorded in the eval index's digest: units scanned under another cut are not taken as done.
DECONTAM_CUT_VERSION = "entities-as-separators/ignorables-left-out/fullwidth-folded"


def _word_lists(texts: pl.Series, *, digits_normalized: bool) -> pl.Series:
    lowered = texts.str.to_lowercase()
    if digits_normalized:
        lowered = _without_ignorables(lowered.str.replace_all(ENTITY_PATTERN, " "))
        lowered = lowered.str.replace_many(_FULLWIDTH_LETTERS, _ASCII_LETTERS).str.replace_all(DIGITS_PATTERN, "0")
    return lowered.str.extract_all(WORD_PATTERN)


def _without_ignorables(texts: pl.Series) -> pl.Series:
    """`texts` (a column of the caller's own) without their default-ignorable characters. Only the
    texts beyond ASCII are searched: ASCII holds none, and the class costs 0.18 s per 50 MB of
    manual pages, where telling those texts apart costs 0.003 s."""
    beyond = np.flatnonzero((texts.str.len_bytes() != texts.str.len_chars()).fill_null(False).to_numpy())
    if len(beyond) == 0:
        return texts
    return texts.scatter(beyond, texts.gather(beyond).str.replace_all(IGNORABLE_PATTERN, ""))


def hash_words(words: pl.Series) -> np.ndarray:
    """(T,) uint64: each word's hash (`kernels`' word hash of its UTF-8 bytes)."""
    array = words.fill_null("").rechunk().to_arrow(compat_level=pl.CompatLevel.oldest())  # large_string: one buffer
    starts = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset : array.offset + len(array) + 1]
    data = array.buffers()[2]
    return hash_word_bytes(np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8), starts)


def token_hashes(texts: pl.Series, *, digits_normalized: bool) -> TokenHashes:
    """Vectorised tokenisation of a text column (polars, in Rust)."""
    lists = _word_lists(texts, digits_normalized=digits_normalized)
    lengths = lists.list.len().fill_null(0).to_numpy().astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = lists.explode().drop_nulls()
    hashes = hash_words(flat) if len(flat) else np.zeros(0, dtype=np.uint64)
    if not digits_normalized:
        return TokenHashes(hashes=hashes, offsets=offsets)
    return TokenHashes(hashes, offsets, *_word_bytes(flat))  # decontamination's: join windows need the bytes


def word_hashes(texts: pl.Series) -> TokenHashes:
    """`token_hashes(texts, digits_normalized=False)`, the same hashes, for deduplication, with
    polars' regex only where Unicode is needed: `kernels.word_runs` cuts the texts' UTF-8 bytes
    into runs of [0-9A-Za-z] and non-ASCII bytes. A run of ASCII alone is one word (what
    `[^\\W_]+` matches in ASCII) and is hashed there; the runs holding a non-ASCII byte, cut at
    ASCII bytes that no word holds, are lower cased and matched by polars, which know Unicode's
    letters and cases, and their words spliced in. A text with a capital sigma goes whole: whether
    it lower-cases to σ or ς depends on the letters around it, across a run's end."""
    texts = texts.fill_null("")  # a null has no words, as in `token_hashes`
    sigma = texts.str.contains("Σ", literal=True).to_numpy()
    if not sigma.any():
        return _run_word_hashes(texts)
    parts = [(np.flatnonzero(~sigma), _run_word_hashes(texts.filter(pl.Series(~sigma)))),
             (np.flatnonzero(sigma), token_hashes(texts.filter(pl.Series(sigma)), digits_normalized=False))]
    return _interleaved(parts, len(texts))


def _run_word_hashes(texts: pl.Series) -> TokenHashes:
    """`word_hashes` of texts without a capital sigma, found on the concatenated bytes (Arrow's
    buffer). The bytes are taken in pieces of about WORD_PIECE_BYTES cut between runs, so that
    numpy's version (~17 bytes of work arrays a byte of text) stays bounded however long one
    document is; the C kernel holds no such arrays and takes them whole."""
    array = texts.to_arrow(compat_level=pl.CompatLevel.oldest())  # large_string: one buffer
    bounds = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset : array.offset + len(array) + 1]
    if len(array) == 0 or bounds[-1] == bounds[0]:
        return TokenHashes(np.zeros(0, dtype=np.uint64), np.zeros(len(array) + 1, dtype=np.int64))
    data = np.frombuffer(array.buffers()[2], dtype=np.uint8)[bounds[0] : bounds[-1]]
    bounds = bounds - bounds[0]
    hashes, runs, offsets, words_before = [], [], np.empty(len(bounds), dtype=np.int64), 0
    # A run with a non-ASCII byte holds a character of 2 bytes or more: no more such runs than
    # the bytes beyond the characters (a tight bound on `word_runs`' table of them).
    non_ascii = int((texts.str.len_bytes() - texts.str.len_chars()).sum() or 0)
    for low, high in _pieces_between_words(data) if not kernels.NATIVE else [(0, len(data))]:
        # The documents that start in this piece (the last piece: the end too).
        here = (bounds >= low) & ((bounds < high) | (high == len(data)))
        piece_hashes, piece_offsets, piece_runs = word_runs(data[low:high], np.concatenate([[0], bounds[here] - low, [high - low]]), non_ascii)
        offsets[here] = words_before + piece_offsets[1:-1]
        runs.append(piece_runs + np.array([low, low, words_before], dtype=np.int64))
        words_before += len(piece_hashes)
        hashes.append(piece_hashes)
    runs = np.concatenate(runs)
    if not len(runs):
        return TokenHashes(hashes=np.concatenate(hashes), offsets=offsets)
    words = token_hashes(_run_texts(data, runs[:, :2]), digits_normalized=False)
    spliced, offsets = splice_words(np.concatenate(hashes), offsets, runs[:, 2], words.hashes, words.offsets)
    return TokenHashes(hashes=spliced, offsets=offsets)


def _run_texts(data: np.ndarray, runs: np.ndarray) -> pl.Series:
    """The texts data[start:end] of runs (R, 2) (UTF-8: each starts and ends at an ASCII byte's edge)."""
    value_offsets = np.zeros(len(runs) + 1, dtype=np.int64)
    np.cumsum(runs[:, 1] - runs[:, 0], out=value_offsets[1:])
    gathered = gather_runs(data, runs)
    array = pa.LargeStringArray.from_buffers(len(runs), pa.py_buffer(value_offsets), pa.py_buffer(gathered))
    return pl.Series(pl.from_arrow(array))


# Bytes of text a piece of `_run_word_hashes` holds: 4 MiB.
WORD_PIECE_BYTES = 1 << 22


def _word_bytes_mask(data: np.ndarray) -> np.ndarray:
    """Which bytes a run of `kernels.word_runs` holds: [0-9A-Za-z] and the non-ASCII ones."""
    letter = ((data | np.uint8(0x20)) - np.uint8(ord("a"))) < np.uint8(26)  # uint8 arithmetic wraps below "a"
    return letter | ((data - np.uint8(ord("0"))) < np.uint8(10)) | (data >= np.uint8(0x80))


def _pieces_between_words(data: np.ndarray) -> list[tuple[int, int]]:
    """[low, high) pieces of about WORD_PIECE_BYTES covering `data`, each cut at a byte that is no
    word's (a word never spans two pieces; one longer than a piece keeps its piece going)."""
    pieces, low = [], 0
    while len(data) - low > WORD_PIECE_BYTES:
        cut = low + WORD_PIECE_BYTES
        while cut < len(data):
            gaps = np.flatnonzero(~_word_bytes_mask(data[cut : cut + 65_536]))
            if len(gaps):
                cut += int(gaps[0])
                break
            cut += 65_536
        if cut >= len(data):
            break
        pieces.append((low, cut))
        low = cut
    pieces.append((low, len(data)))
    return pieces


def _interleaved(parts: list[tuple[np.ndarray, TokenHashes]], num_docs: int) -> TokenHashes:
    """Token hashes of disjoint subsets of the documents (their positions, their tokens) merged
    back into document order."""
    lengths = np.zeros(num_docs, dtype=np.int64)
    for docs, tokens in parts:
        lengths[docs] = tokens.lengths
    offsets = np.zeros(num_docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    hashes = np.empty(int(offsets[-1]), dtype=np.uint64)
    for docs, tokens in parts:
        shift = np.repeat(offsets[docs] - tokens.offsets[:-1], tokens.lengths)
        hashes[shift + np.arange(len(tokens.hashes), dtype=np.int64)] = tokens.hashes
    return TokenHashes(hashes=hashes, offsets=offsets)


# What `words_with_spans` reads a text as: each character of a word "a", or "d" for a digit;
# every other character stays itself (none of them is "a", "d" or "i", which are word
# characters). Decontamination's cut marks the default-ignorable characters "i", absorbed inside
# a word (a word starts and ends with a word character; possessive: linear time), and an HTML
# character reference as spaces of its length, so spans stay those of the original text.
_KIND_RUNS = re.compile("[ad]+")
_DECONTAM_RUNS = re.compile("[ad]++(?:i++[ad]++)*+")
_DIGIT_OR_NOT = re.compile("d+|a+")
_ENTITY = re.compile(ENTITY_PATTERN, re.IGNORECASE | re.ASCII)  # as the lower-cased text reads it
_ASCII_KINDS = str.maketrans({**dict.fromkeys(string.ascii_letters, "a"), **dict.fromkeys(string.digits, "d")})


@functools.cache
def _character_kinds() -> dict[int, str]:
    """`str.translate`'s table of every word character and digit, as polars' regex (Rust's) reads
    WORD_PATTERN and DIGITS_PATTERN. Python's `re` disagrees with it on 12,909 code points under
    polars 2.1 and Python 3.11: Rust's `\\w` holds combining marks and the zero-width joiners, so
    Devanagari's vowel signs and Hebrew's points stay inside their word, where Python's `\\w` cuts
    "नमस्ते" into three; and their Unicode versions differ. An eval item cut one way and a document
    the other share no seed, and a verbatim copy goes unseen. Read from polars itself, once per
    process (0.1-0.3 s, 60 MB at most); a table, not a class of 1,000 ranges for `re`, which took
    10x as long to cut a text (0.19 s against 0.012 s for 200,000 dashes)."""
    codes = np.concatenate([np.arange(0xD800), np.arange(0xE000, sys.maxunicode + 1)])
    characters = _one_string_each(codes)
    word = characters.str.contains(rf"^(?:{WORD_PATTERN[:-1]})$").to_numpy()
    digit = word & characters.str.contains(rf"^(?:{DIGITS_PATTERN[:-1]})$").to_numpy()
    return {**dict.fromkeys(codes[word].tolist(), "a"), **dict.fromkeys(codes[digit].tolist(), "d")}


@functools.cache
def _decontam_kinds() -> dict[int, str]:
    """`_character_kinds`, the default-ignorable characters "i"."""
    ignorable = {code: "i" for low, high in _IGNORABLE_RANGES for code in range(low, high + 1)}
    return {**_character_kinds(), **ignorable}


def _one_string_each(codes: np.ndarray) -> pl.Series:
    """A string column of one character per code point (not a surrogate), built from its UTF-8
    bytes (5 MB; a list of 1.1 million Python strings grew the process by 150 MB)."""
    data = codes.astype("<u4").tobytes().decode("utf-32-le").encode()
    widths = 1 + (codes >= 0x80) + (codes >= 0x800) + (codes >= 0x10000)
    offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
    array = pa.LargeStringArray.from_buffers(len(codes), pa.py_buffer(offsets), pa.py_buffer(data))
    return pl.Series(pl.from_arrow(array))


def _lower(text: str) -> str:
    """`text` lower-cased by polars' case tables, as the vectorised path does (Python's differ on
    a few dozen code points, its Unicode being older)."""
    return text.lower() if text.isascii() else pl.Series([text], dtype=pl.String).str.to_lowercase().item()


def words_with_spans(text: str, *, digits_normalized: bool) -> tuple[list[str], list[tuple[int, int]]]:
    """Words of one text with their character spans in `text` (the authoritative slow path, used
    only for documents that matched, to report offsets, and for eval items), cut as the
    vectorised path cuts them: the whole text lower-cased first (a final sigma is read in its
    context), then its words. `digits_normalized`: decontamination's cut and words."""
    if digits_normalized:
        words, _, spans = decontam_words(text)
        return words, spans
    lowered, marks, runs, spans = _cut(text, _ASCII_KINDS if text.isascii() else _character_kinds(), _KIND_RUNS, entities=False)
    return [lowered[start:end] for start, end in runs], spans


def decontam_words(text: str) -> tuple[list[str], list[str], list[tuple[int, int]]]:
    """Decontamination's cut of one text: (its words, digits normalised; the same words with their
    digits kept, which break ties between template siblings; their character spans in `text`).
    Fullwidth Latin letters are folded to ASCII, default-ignorable characters left out of the
    words, HTML character references read as separators (`_word_lists` does the same)."""
    if text.isascii():
        lowered, marks, runs, spans = _cut(text, _ASCII_KINDS, _KIND_RUNS, entities=True)
    else:
        lowered, marks, runs, spans = _cut(text, _decontam_kinds(), _DECONTAM_RUNS, entities=True)
        lowered = lowered.translate(_FOLD_FULLWIDTH)  # one letter for one: the runs hold
    if "i" in marks:
        pairs = [_visible(lowered[start:end], marks[start:end]) for start, end in runs]
    else:
        pairs = [(lowered[start:end], marks[start:end]) for start, end in runs]
    return [_normalized(word, kinds) for word, kinds in pairs], [word for word, _ in pairs], spans


def _cut(text: str, kinds: dict[int, str], pattern: re.Pattern, *, entities: bool) -> tuple[str, str, list[tuple[int, int]], list[tuple[int, int]]]:
    """(the text lower-cased, its marks, its words' runs there, their spans in `text`)."""
    lowered = _lower(text)
    marks = _marked(lowered, kinds, entities)
    runs = [match.span() for match in pattern.finditer(marks)]
    # Lower-casing may lengthen a text (U+0130 becomes two characters): the spans are then those of
    # the original's words, one for one (lower-casing keeps a word a word).
    spans = runs if len(lowered) == len(text) else [match.span() for match in pattern.finditer(_marked(text, kinds, entities))]
    if len(spans) != len(runs):  # never seen: each word of the original lower-cased alone
        lowered, runs = _each_lowered(text, spans)
        marks = _marked(lowered, kinds, entities)
    return lowered, marks, runs, spans


def _marked(text: str, kinds: dict[int, str], entities: bool) -> str:
    """`text` as its kinds of characters; with `entities`, each HTML character reference spaces."""
    if entities and "&" in text:
        text = _ENTITY.sub(lambda match: " " * len(match.group()), text)
    return text.translate(kinds)


def _visible(word: str, kinds: str) -> tuple[str, str]:
    """A word and its marks without its default-ignorable characters."""
    return "".join(c for c, k in zip(word, kinds) if k != "i"), kinds.replace("i", "")


def _each_lowered(text: str, spans: list[tuple[int, int]]) -> tuple[str, list[tuple[int, int]]]:
    """The words of `text` at `spans`, each lower-cased alone, joined by spaces, and their runs there."""
    words = [_lower(text[start:end]) for start, end in spans]
    starts = np.cumsum([0] + [len(word) + 1 for word in words]).tolist()
    return " ".join(words), [(start, start + len(word)) for start, word in zip(starts, words)]


def _normalized(word: str, kinds: str) -> str:
    """`word` (its marks `kinds`) with each run of digits "0"."""
    if "d" not in kinds:
        return word
    return "".join(word[run.start() : run.end()] if kinds[run.start()] == "a" else "0" for run in _DIGIT_OR_NOT.finditer(kinds))


def words_of(text: str, *, digits_normalized: bool) -> list[str]:
    return words_with_spans(text, digits_normalized=digits_normalized)[0]


def joins_between(text: str, spans: Sequence[tuple[int, int]]) -> list[bool]:
    """For each two neighbouring words of `text` (their spans there, as `words_with_spans` gives
    them), whether punctuation alone separates them (no whitespace): where a copy that deletes
    punctuation merges words."""
    return [not any(c.isspace() for c in text[end:start]) for (_, end), (start, _) in zip(spans, spans[1:])]


def word_tokens(documents: Sequence[Sequence[str]]) -> TokenHashes:
    """The decontamination tokens of tokenised texts (lists of words), as `token_hashes` gives them."""
    lengths = np.array([len(words) for words in documents], dtype=np.int64)
    offsets = np.zeros(len(documents) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = pl.Series([w for words in documents for w in words], dtype=pl.String)
    hashes = hash_words(flat) if len(flat) else np.zeros(0, dtype=np.uint64)
    return TokenHashes(hashes, offsets, *_word_bytes(flat))


def _word_bytes(words: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """(the words' UTF-8 bytes end to end (uint8), each word's start in them (T + 1,) int64)."""
    lengths = words.str.len_bytes().fill_null(0).to_numpy().astype(np.int64)
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    data = words.str.join("").cast(pl.Binary).item()
    return np.frombuffer(data, dtype=np.uint8), starts


def window_hashes(tokens: TokenHashes, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of the `width` bytes that follow every word start, words joined without separators,
    for windows inside one document: (hashes (G,) uint64, starts (G,) int64 token index).

    The bytes are read as little-endian uint64 blocks (the last one masked) and combined like
    `ngram_hashes`' words, the width mixed in. No finaliser: windows are only compared for
    equality, and a bijection would not change which of them collide."""
    begins = tokens.char_offsets[:-1]
    starts = np.flatnonzero(begins + width <= np.repeat(tokens.char_offsets[tokens.offsets[1:]], tokens.lengths))
    blocks = -(-width // 8)
    padded = np.zeros(len(tokens.chars) + 8 * blocks + 8, dtype=np.uint8)
    padded[: len(tokens.chars)] = tokens.chars
    # Element i is the 8 bytes from byte i on (an unaligned, overlapping view: one gather a block).
    at_byte = np.ndarray(shape=(len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))
    first = begins[starts]
    acc = np.full(len(starts), np.uint64(width) << np.uint64(32), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(blocks):
            block = at_byte[first + 8 * k].astype(np.uint64, copy=False)
            if width - 8 * k < 8:
                block &= np.uint64((1 << (8 * (width - 8 * k))) - 1)
            block *= NGRAM_MULTIPLIERS[k % len(NGRAM_MULTIPLIERS)]
            acc += block
    return acc, starts


def window_words(tokens: TokenHashes, starts: np.ndarray, width: int) -> np.ndarray:
    """Words the `width`-byte window at each token of `starts` touches, the last one perhaps in part."""
    ends = tokens.char_offsets[starts] + width
    return np.searchsorted(tokens.char_offsets, ends - 1, side="right") - starts


def window_full_words(tokens: TokenHashes, starts: np.ndarray, width: int) -> np.ndarray:
    """Words wholly inside the `width`-byte window at each token of `starts`."""
    ends = tokens.char_offsets[starts] + width
    return np.searchsorted(tokens.char_offsets, ends, side="right") - 1 - starts


def ngram_hashes(tokens: TokenHashes, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of every word n-gram that lies inside one document.

    Returns (hashes (G,) uint64, starts (G,) int64): `starts` indexes the first token in the flat
    token array. Combination: sum_k w[s + k] * MIX[k] (mod 2^64), then the splitmix64 finaliser,
    so that n-grams of different sizes do not collide systematically.
    """
    hashes, total = tokens.hashes, len(tokens.hashes)
    if total < n:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    width = total - n + 1
    acc = np.full(width, np.uint64(n), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            acc += hashes[k : k + width] * NGRAM_MULTIPLIERS[k % len(NGRAM_MULTIPLIERS)] + np.uint64(k)
        acc = mix64(acc)
    starts = np.arange(width, dtype=np.int64)
    # An n-gram is valid when its last token belongs to the same document as its first.
    doc_end = np.repeat(tokens.offsets[1:], tokens.lengths)[:width]
    valid = starts + n <= doc_end
    return acc[valid], starts[valid]
