"""Token shards for the training stages, from the clean shards' text.

A byte-level BPE (`ito_assets.training.tokenizer`) is trained on the training split and saved with
the run; documents are split into training and held-out sets by the data decision's seeded draw
(`ito_assets.training.heldout`; the held-out set is what the stage gates evaluate on, the same for
every stage of a run). The corpus is read in batches of rows, three times (to train the tokenizer,
then to encode each split), and the tokens are appended to their files: memory is bounded by a
batch, not by the corpus (`prepare_from_shards`). Written once per run folder: a rerun finds the
completion marker and reads the recorded digests instead of tokenizing again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from ito_assets.data.shards import ShardSet
from ito_assets.runtime.record.storage import write_atomic
from ito_assets.training.heldout import SPLIT_SEED, heldout_mask
from ito_assets.training.tokenizer import (TokenizerConfig, encode_documents, save_tokenizer, token_dtype,
                                           train_tokenizer, write_token_stream)

MARKER_NAME = "tokens.json"
# 5% of documents held out: the decision job's split (ito_assets.training.decision_config.DecisionConfig).
HELDOUT_FRACTION = 0.05


@dataclass(frozen=True, kw_only=True)
class TokenSet:
    folder: str
    tokenizer_path: str
    tokenizer_sha256: str
    vocab_size: int
    train_path: str
    train_sha256: str
    num_train_tokens: int
    heldout_path: str
    heldout_sha256: str
    num_heldout_tokens: int
    num_documents: int
    num_heldout_documents: int


# Documents per batch when reading a corpus: a few MB of text for documents of a few kB.
BATCH_DOCUMENTS = 1024

Batches = Callable[[], Iterator[list[str]]]  # a fresh pass over the corpus, in order, per call


def prepare(texts: Sequence[str], folder: Path, *, config: TokenizerConfig, seed: int = SPLIT_SEED) -> TokenSet:
    """The token set of texts already in memory (tests, benchmarks, small corpora)."""
    return _prepare(lambda: (list(texts[i : i + BATCH_DOCUMENTS]) for i in range(0, len(texts), BATCH_DOCUMENTS)),
                    len(texts), folder, config=config, seed=seed)


def prepare_from_shards(shards: ShardSet, folder: Path, *, config: TokenizerConfig, seed: int = SPLIT_SEED) -> TokenSet:
    """The token set of the clean shards' `text` column, read a batch of rows at a time."""
    return _prepare(lambda: shards.iter_column("text", BATCH_DOCUMENTS), shards.num_rows, folder,
                    config=config, seed=seed)


def _prepare(batches: Batches, num_documents: int, folder: Path, *, config: TokenizerConfig, seed: int) -> TokenSet:
    marker = folder / MARKER_NAME
    if marker.exists():
        return TokenSet(**json.loads(marker.read_text()))
    held = heldout_mask(num_documents, HELDOUT_FRACTION, seed)
    tokenizer = train_tokenizer((text for split, text in _split(batches, held) if not split), config)
    tokenizer_sha256 = save_tokenizer(tokenizer, folder / "tokenizer.json")
    dtype = token_dtype(tokenizer.get_vocab_size())
    train = write_token_stream((encode_documents(tokenizer, texts) for texts in _part(batches, held, False)),
                               folder / "train.npy", dtype)
    heldout = write_token_stream((encode_documents(tokenizer, texts) for texts in _part(batches, held, True)),
                                 folder / "heldout.npy", dtype)
    tokens = TokenSet(
        folder=str(folder), tokenizer_path=str(folder / "tokenizer.json"), tokenizer_sha256=tokenizer_sha256,
        vocab_size=tokenizer.get_vocab_size(), train_path=train.path, train_sha256=train.sha256,
        num_train_tokens=train.num_tokens, heldout_path=heldout.path, heldout_sha256=heldout.sha256,
        num_heldout_tokens=heldout.num_tokens, num_documents=num_documents, num_heldout_documents=int(held.sum()),
    )
    write_atomic(marker, json.dumps(asdict(tokens), sort_keys=True).encode())
    return tokens


def _split(batches: Batches, held: np.ndarray) -> Iterator[tuple[bool, str]]:
    """(held out?, text) for every document, checking that the corpus has the counted documents."""
    position = 0
    for texts in batches():
        for text in texts:
            if position >= len(held):
                raise ValueError("the corpus has more documents than it said")
            yield bool(held[position]), text
            position += 1
    if position != len(held):
        raise ValueError("the corpus has fewer documents than it said")


def _part(batches: Batches, held: np.ndarray, heldout: bool) -> Iterator[list[str]]:
    """One side of the split, in batches of at most BATCH_DOCUMENTS documents."""
    batch: list[str] = []
    for split, text in _split(batches, held):
        if split is heldout:
            batch.append(text)
            if len(batch) == BATCH_DOCUMENTS:
                yield batch
                batch = []
    if batch:
        yield batch
