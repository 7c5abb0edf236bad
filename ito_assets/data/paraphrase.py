"""Paraphrase candidates: eval items restated in other words, which word n-grams cannot see.

The n-gram scan (`decontam`) finds verbatim and lightly edited copies of eval items. A paraphrase
(synonyms, reordered clauses, numbers written out) shares no long n-gram with its item, so this
optional step compares meanings instead: every eval item view (question, question + answer, the
texts `eval_index` indexes) and every sliding word window of every document are embedded with
WordLlama's static token embeddings (256 dimensions), L2-normalised, and each window is matched to
its nearest view by cosine similarity. Windows at or above the threshold are *candidates*: a report
for review, never a removal.

Embedding is per word: a word's vector is the sum of its tokens' rows (each distinct word of a
batch is tokenised once), a window's is the sum of its words' (prefix sums over the document), so
each word is looked up once however much the windows overlap. This is WordLlama's mean pooling
restricted to word tokens (punctuation and whitespace tokens are left out); the division by the
token count does not change a direction, so sums are normalised directly.

Work is done in batches of windows (a matrix product of batch x views), so memory is bounded by
the batch, never by the corpus. wordllama is imported only when an embedder is loaded, so neither
the code location nor the n-gram path needs it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np
import polars as pl

from ito_assets.data.config import ParaphraseConfig
from ito_assets.data.eval_index import QUESTION, QUESTION_ANSWER
from ito_assets.data.text import WORD_PATTERN
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import EvalSuite

CANDIDATE_SCHEMA = {
    "doc_id": pl.String,
    "eval_item_id": pl.String,
    "benchmark": pl.String,
    "view": pl.String,
    "char_start": pl.Int64,
    "char_end": pl.Int64,
    "similarity": pl.Float64,
    "excerpt": pl.String,
}
EXCERPT_CHARS = 200
EMBEDDING_DIM = 256  # WordLlama's default l2_supercat size, the one its wheel ships
_WORD = re.compile(WORD_PATTERN)


@dataclass(frozen=True)
class WordEmbedder:
    """Static embeddings by word: `tokenize` gives each word's token ids, `table` (vocab, dim)
    float32 their vectors; a word's vector is the sum of its tokens' rows."""

    table: np.ndarray
    tokenize: Callable[[list[str]], list[list[int]]]

    @property
    def dim(self) -> int:
        return self.table.shape[1]

    def word_vectors(self, words: list[str]) -> np.ndarray:
        """(len(words), dim) float32: a sparse (words x vocabulary) token-count matrix times the
        table, so no token row is copied; a word with no token is a zero row."""
        from scipy import sparse  # imported here, like training/verdict.py: the code location loads without it

        ids = self.tokenize(words)
        counts = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        tokens = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(counts.sum()))
        rows = np.repeat(np.arange(len(words)), counts)
        matrix = sparse.csr_matrix((np.ones(len(tokens), dtype=np.float32), (rows, tokens)), shape=(len(words), len(self.table)))
        matrix.sum_duplicates()
        return np.asarray(matrix @ self.table, dtype=np.float32)


@dataclass(frozen=True)
class ItemVectors:
    """One unit vector per eval item view: rows of `vectors` (V, dim) float32."""

    item_ids: tuple[str, ...]
    benchmarks: tuple[str, ...]
    views: tuple[str, ...]
    vectors: np.ndarray


def load_embedder() -> WordEmbedder:
    """WordLlama's 256-dimension model from the files inside its wheel; never a download.

    `WordLlama.load()` alone looks for the tokenizer in a folder the wheel does not have and then
    downloads it, so the package's own folder is given as the cache (it holds `weights/` and
    `tokenizers/`) and downloads are disabled. The weights (`l2_supercat_256.safetensors`, 32,000
    x 256) were trained by WordLlama's author from the token-embedding codebooks of Llama 2 70B
    and other models with the Llama 2 tokenizer; the package is MIT-licensed and its README names
    no other licence for them (the Llama 2 tokenizer and codebooks come under Meta's licence).
    """
    wordllama = _import_wordllama()
    try:
        model = wordllama.WordLlama.load(cache_dir=Path(wordllama.__file__).parent, dim=EMBEDDING_DIM, disable_download=True)
    except (FileNotFoundError, ValueError):
        raise ItoError(ErrorCode.CAPABILITY_MISSING,
                       "the installed wordllama does not ship its 256-dimension model files") from None
    tokenizer = model.tokenizer
    tokenizer.no_padding()  # WordLlama pads batches for its own pooling; words are summed here
    return WordEmbedder(table=model.embedding, tokenize=_cached(tokenizer))


def _import_wordllama():
    """wordllama's import calls logging.basicConfig(level=INFO), which would configure the host
    process's root logger (Dagster's, say); its handlers and level are put back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        import wordllama
    except ImportError:
        raise ItoError(ErrorCode.CAPABILITY_MISSING,
                       "paraphrase candidates need wordllama: install the `paraphrase` extra") from None
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return wordllama


# Token ids of this many distinct words are kept (~20 MB): the tokenizer is the slowest step, and
# word frequencies are Zipfian, so most words of a batch were seen in an earlier one.
TOKEN_CACHE_WORDS = 131_072


def _cached(tokenizer) -> Callable[[list[str]], list[list[int]]]:
    cache: dict[str, list[int]] = {}

    def tokenize(words: list[str]) -> list[list[int]]:
        new = [w for w in words if w not in cache]
        if len(cache) + len(new) > TOKEN_CACHE_WORDS:
            cache.clear()
            new = words
        # A lone word is tokenised as it is inside a text after a space ("▁word").
        cache.update(zip(new, (e.ids for e in tokenizer.encode_batch(new, add_special_tokens=False))))
        return [cache[w] for w in words]

    return tokenize


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1; an all-zero row (no token) stays zero and matches nothing."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


def words_of(text: str) -> list[str]:
    """The words that are embedded: `text.WORD_PATTERN` matches, lower-cased as the n-gram path
    does, so a change of case changes nothing (the benchmark measured cased words too: recall
    and false positives within a few documents of lower case)."""
    return [w.lower() for w in _WORD.findall(text)]


def _codes(word_lists: list[list[str]]) -> tuple[list[str], list[np.ndarray]]:
    """The distinct words of a batch, sorted, and each list as indices into them. Sorted, a
    window's words are summed in the same order whatever else is in its batch."""
    vocabulary = sorted(set(chain.from_iterable(word_lists)))
    index = {w: i for i, w in enumerate(vocabulary)}
    return vocabulary, [np.fromiter(map(index.__getitem__, words), dtype=np.int64, count=len(words)) for words in word_lists]


def _window_sums(codes: list[np.ndarray], starts: list[np.ndarray], ends: list[np.ndarray], vectors: np.ndarray) -> np.ndarray:
    """(windows, dim): each window's word vectors summed, as one sparse product of a (windows x
    distinct words) count matrix with the word vectors, so no word vector is copied per window."""
    from scipy import sparse
    rows, cols = [], []
    for code, start, end in zip(codes, starts, ends):
        lengths = end - start
        block = np.cumsum(lengths) - lengths  # where each window's entries begin
        positions = np.arange(int(lengths.sum())) + np.repeat(start - block, lengths)
        rows.append(np.repeat(np.arange(len(start)), lengths))
        cols.append(code[positions])
    offsets = np.cumsum([0] + [len(s) for s in starts])
    row = np.concatenate([r + o for r, o in zip(rows, offsets)]) if rows else np.zeros(0, dtype=np.int64)
    col = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
    counts = sparse.csr_matrix((np.ones(len(row), dtype=np.float32), (row, col)), shape=(int(offsets[-1]), len(vectors)))
    counts.sum_duplicates()  # canonical: each row's words in index order
    return np.asarray(counts @ vectors, dtype=np.float32)


def text_vectors(texts: list[str], embedder: WordEmbedder) -> np.ndarray:
    """(len(texts), dim) unit vectors: each text's word vectors summed, then normalised."""
    vocabulary, codes = _codes([words_of(t) for t in texts])
    whole = [np.array([0]) for _ in texts], [np.array([len(c)]) for c in codes]
    return unit_rows(_window_sums(codes, *whole, embedder.word_vectors(vocabulary)))


def item_vectors(suite: EvalSuite, embedder: WordEmbedder) -> ItemVectors:
    """The question and question + answer views of every item, as `eval_index` writes them."""
    rows = [(item, kind, text) for item in suite.items
            for kind, text in ((QUESTION_ANSWER, f"{item.question}\n{item.answer}"), (QUESTION, item.question))]
    return ItemVectors(
        item_ids=tuple(item.id for item, _, _ in rows),
        benchmarks=tuple(item.benchmark for item, _, _ in rows),
        views=tuple(kind for _, kind, _ in rows),
        vectors=text_vectors([text for _, _, text in rows], embedder),
    )


def window_starts(num_words: int, config: ParaphraseConfig) -> np.ndarray:
    """First word of each window: every stride, and a last window that ends at the last word so
    no tail goes unseen. A text shorter than the window is one window."""
    if num_words == 0:
        return np.zeros(0, dtype=np.int64)
    last = max(0, num_words - config.window_words)
    starts = np.arange(0, last + 1, config.stride_words, dtype=np.int64)
    return starts if starts[-1] == last else np.append(starts, last)


def window_spans(text: str, config: ParaphraseConfig) -> list[tuple[int, int]]:
    """Character spans of the windows of `text`: from the first word's start to the last's end."""
    spans = [m.span() for m in _WORD.finditer(text)]
    return [(spans[s][0], spans[min(s + config.window_words, len(spans)) - 1][1]) for s in window_starts(len(spans), config).tolist()]


@dataclass(frozen=True)
class _Piece:
    """Up to a batch of one document's windows and the words they cover (from word `first` on)."""

    doc_id: str
    text: str
    words: list[str]
    first: int
    starts: np.ndarray  # window start and end words, relative to `first`
    ends: np.ndarray


def _pieces(docs: Iterable[tuple[str, str]], config: ParaphraseConfig) -> Iterator[_Piece]:
    for doc_id, text in docs:
        words = words_of(text)
        starts = window_starts(len(words), config)
        for at in range(0, len(starts), config.batch_windows):
            part = starts[at : at + config.batch_windows]
            ends = np.minimum(part + config.window_words, len(words))
            first = int(part[0])
            yield _Piece(doc_id, text, words[first : int(ends[-1])], first, part - first, ends - first)


def _batches(pieces: Iterator[_Piece], size: int) -> Iterator[list[_Piece]]:
    batch: list[_Piece] = []
    held = 0
    for piece in pieces:
        if batch and held + len(piece.starts) > size:
            yield batch
            batch, held = [], 0
        batch.append(piece)
        held += len(piece.starts)
    if batch:
        yield batch


def _match_batch(batch: list[_Piece], items: ItemVectors, embedder: WordEmbedder, threshold: float) -> list[tuple]:
    """(piece, window, view, similarity) of every window at or above the threshold."""
    vocabulary, codes = _codes([piece.words for piece in batch])
    sums = _window_sums(codes, [p.starts for p in batch], [p.ends for p in batch], embedder.word_vectors(vocabulary))
    similarity = unit_rows(sums) @ items.vectors.T
    nearest = similarity.argmax(axis=1)
    best = similarity[np.arange(len(nearest)), nearest].astype(np.float64)
    ends = np.cumsum([len(piece.starts) for piece in batch])  # each piece's windows end here
    matches = []
    for k in np.flatnonzero(best >= threshold).tolist():
        p = int(np.searchsorted(ends, k, side="right"))
        matches.append((batch[p], k - (int(ends[p - 1]) if p else 0), int(nearest[k]), float(best[k])))
    return matches


def _rows(matches: list[tuple], items: ItemVectors) -> list[dict]:
    """Matched windows as candidate rows; word positions become character offsets here, for the
    few documents that matched (the scan itself never needs them)."""
    rows, spans, spans_of = [], [], None
    for piece, i, view, similarity in matches:
        if spans_of is not piece.text:
            spans, spans_of = [m.span() for m in _WORD.finditer(piece.text)], piece.text
        start = spans[piece.first + int(piece.starts[i])][0]
        end = spans[piece.first + int(piece.ends[i]) - 1][1]
        rows.append({
            "doc_id": piece.doc_id,
            "eval_item_id": items.item_ids[view],
            "benchmark": items.benchmarks[view],
            "view": items.views[view],
            "char_start": start,
            "char_end": end,
            "similarity": similarity,
            "excerpt": piece.text[start:end][:EXCERPT_CHARS],
        })
    return rows


def _best_of_overlaps(rows: list[dict]) -> list[dict]:
    """Overlapping windows of one document that match the same item are one place: keep the most
    similar window of each run (its own span and excerpt), so a reviewer reads each place once."""
    kept: list[dict] = []
    run_end = -1
    for row in sorted(rows, key=lambda r: (r["doc_id"], r["eval_item_id"], r["char_start"])):
        last = kept[-1] if kept else None
        if last and (last["doc_id"], last["eval_item_id"]) == (row["doc_id"], row["eval_item_id"]) and row["char_start"] < run_end:
            if row["similarity"] > last["similarity"]:
                kept[-1] = row
            run_end = max(run_end, row["char_end"])
        else:
            kept.append(row)
            run_end = row["char_end"]
    return sorted(kept, key=lambda r: (r["doc_id"], r["char_start"], r["eval_item_id"]))


def find_candidates(docs: Iterable[tuple[str, str]], items: ItemVectors, embedder: WordEmbedder, config: ParaphraseConfig) -> pl.DataFrame:
    """(doc_id, text) pairs -> possible paraphrases in CANDIDATE_SCHEMA, ordered by document and
    offset. A window counts when its cosine to its nearest view is >= config.threshold."""
    rows: list[dict] = []
    for batch in _batches(_pieces(docs, config), config.batch_windows):
        rows.extend(_rows(_match_batch(batch, items, embedder, config.threshold), items))
    kept = _best_of_overlaps(rows)
    return pl.DataFrame(kept, schema=CANDIDATE_SCHEMA) if kept else pl.DataFrame(schema=CANDIDATE_SCHEMA)
