"""Token shards for the training stages, from the clean shards' text.

A byte-level BPE (`ito_assets.training.tokenizer`) is trained on the training split and saved with
the run; documents are split into training and held-out sets by the data decision's seeded draw
(`ito_assets.training.heldout`; the held-out set is what the stage gates evaluate on, the same for
every stage of a run). Written once per run folder:
a rerun finds the completion marker and reads the recorded digests instead of tokenizing again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from ito_assets.runtime.record.storage import write_atomic
from ito_assets.training.heldout import split_heldout
from ito_assets.training.tokenizer import (TokenizerConfig, encode_documents, save_tokenizer, train_tokenizer,
                                           write_token_shard)

MARKER_NAME = "tokens.json"
# 5% of documents held out: the decision job's split (ito_assets.training.decision.DecisionConfig).
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


def prepare(texts: Sequence[str], folder: Path, *, config: TokenizerConfig, seed: int = 0) -> TokenSet:
    marker = folder / MARKER_NAME
    if marker.exists():
        return TokenSet(**json.loads(marker.read_text()))
    train_texts, heldout_texts = split_heldout(texts, HELDOUT_FRACTION, seed)
    tokenizer = train_tokenizer(train_texts, config)
    tokenizer_sha256 = save_tokenizer(tokenizer, folder / "tokenizer.json")
    train = write_token_shard(encode_documents(tokenizer, train_texts), folder / "train.npy")
    heldout = write_token_shard(encode_documents(tokenizer, heldout_texts), folder / "heldout.npy")
    tokens = TokenSet(
        folder=str(folder), tokenizer_path=str(folder / "tokenizer.json"), tokenizer_sha256=tokenizer_sha256,
        vocab_size=tokenizer.get_vocab_size(), train_path=train.path, train_sha256=train.sha256,
        num_train_tokens=train.num_tokens, heldout_path=heldout.path, heldout_sha256=heldout.sha256,
        num_heldout_tokens=heldout.num_tokens, num_documents=len(texts), num_heldout_documents=len(heldout_texts),
    )
    write_atomic(marker, json.dumps(asdict(tokens), sort_keys=True).encode())
    return tokens
