"""Tokenization with no hub download: a byte-level BPE trained on the run's own text, token shards
as memory maps, and a deterministic batch loader over them.

- Byte-level BPE (GPT-2, Radford et al. 2019) through Hugging Face `tokenizers`: every byte is in
  the initial alphabet, so any text encodes and decodes back exactly; the file is saved with the
  run (`tokenizer.json`) and its sha256 recorded.
- Token shards are `.npy` files (a header states dtype and length) opened with `np.load(mmap_mode)`:
  uint16 while the vocabulary fits in 16 bits, else uint32 (the nanoGPT / OLMo convention).
- Documents are joined with one end-of-text token between them (GPT-2's `<|endoftext|>`); the same
  string inside a document's text is encoded as text, never as that token.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ito_assets.digests import file_sha256

if TYPE_CHECKING:
    import torch

END_OF_TEXT = "<|endoftext|>"
_UINT16_LIMIT = 1 << 16
# Tokens copied per slice from the raw file into the .npy (64 MiB of uint32): bounded memory.
_COPY_TOKENS = 1 << 24


def _require(condition: bool, name: str, rule: str) -> None:
    if not condition:
        raise ValueError(f"{name} {rule}")


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    # 2,048: enough merges for the fixture corpora (~2 MB of English and Python) while keeping the
    # tiny model's embedding under a quarter of its parameters.
    vocab_size: int = 2048
    # 2: a pair seen once is not a merge (the `tokenizers` BpeTrainer default is 0; GPT-2-style
    # trainers commonly use 2 to keep typos out of the vocabulary).
    min_frequency: int = 2

    def __post_init__(self) -> None:
        # 256 bytes + the end-of-text token is the smallest byte-level vocabulary.
        _require(self.vocab_size >= 257, "vocab_size", "must be at least 257 (256 bytes + end of text)")
        _require(self.min_frequency >= 1, "min_frequency", "must be at least 1")


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig) -> Tokenizer:
    """A byte-level BPE trained on `texts`; deterministic for the same texts in the same order."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[END_OF_TEXT],
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return _literal(tokenizer)


def _literal(tokenizer: Tokenizer) -> Tokenizer:
    """Encode a document's text as text: web text quotes `<|endoftext|>` literally, and that string
    must not become the separator (a document split in two, or one joined to the next). Only the
    separator the shards put between documents is the token. `tokenizer.json` does not keep this
    switch, so every tokenizer this module hands out has it set."""
    tokenizer.encode_special_tokens = True
    return tokenizer


def end_of_text_id(tokenizer: Tokenizer) -> int:
    token_id = tokenizer.token_to_id(END_OF_TEXT)
    if token_id is None:
        raise ValueError("tokenizer has no end-of-text token")
    return token_id


def save_tokenizer(tokenizer: Tokenizer, path: Path) -> str:
    """Write `tokenizer.json` atomically; returns the sha256 hex of the file's bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = tokenizer.to_str().encode()
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
    return hashlib.sha256(data).hexdigest()


def load_tokenizer(path: Path) -> Tokenizer:
    return _literal(Tokenizer.from_file(str(path)))


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= _UINT16_LIMIT else np.dtype(np.uint32)


def encode_documents(tokenizer: Tokenizer, texts: Iterable[str]) -> np.ndarray:
    """Token ids of the documents, each followed by end-of-text, as one array of `token_dtype`."""
    eot = end_of_text_id(tokenizer)
    dtype = token_dtype(tokenizer.get_vocab_size())
    pieces = [np.asarray(e.ids + [eot], dtype=dtype) for e in tokenizer.encode_batch(list(texts))]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)


@dataclass(frozen=True, kw_only=True)
class TokenShard:
    path: str
    dtype: str
    num_tokens: int
    sha256: str


def write_token_shard(tokens: np.ndarray, path: Path) -> TokenShard:
    """Write `tokens` as an .npy memory map (written to a temporary name, then renamed)."""
    return write_token_stream([tokens], path, tokens.dtype)


def write_token_stream(chunks: Iterable[np.ndarray], path: Path, dtype: np.dtype) -> TokenShard:
    """Write the chunks, in order, as one .npy memory map without holding them all: appended to a
    raw file, then copied under an .npy header once the length is known (a temporary name, then
    renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw, temporary = path.with_name(f".{path.stem}.raw.tmp"), path.with_name(f".{path.stem}.tmp.npy")
    count = 0
    try:
        with raw.open("wb") as sink:
            for chunk in chunks:
                sink.write(np.ascontiguousarray(chunk, dtype=dtype).tobytes())
                count += len(chunk)
        mapped = np.lib.format.open_memmap(temporary, mode="w+", dtype=dtype, shape=(count,))
        if count:
            source = np.memmap(raw, dtype=dtype, mode="r", shape=(count,))
            for start in range(0, count, _COPY_TOKENS):
                mapped[start : start + _COPY_TOKENS] = source[start : start + _COPY_TOKENS]
            del source
        mapped.flush()
        del mapped
        os.replace(temporary, path)
    finally:
        raw.unlink(missing_ok=True)
        temporary.unlink(missing_ok=True)
    return TokenShard(path=str(path), dtype=np.dtype(dtype).name, num_tokens=count,
                      sha256=file_sha256(path))


def open_token_shard(path: Path) -> np.ndarray:
    """The shard as a read-only memory map: nothing is read until a window is sliced."""
    return np.load(path, mmap_mode="r")


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    batch_size: int
    sequence_length: int
    seed: int

    def __post_init__(self) -> None:
        _require(self.batch_size >= 1, "batch_size", "must be positive")
        _require(self.sequence_length >= 1, "sequence_length", "must be positive")


def num_windows(num_tokens: int, sequence_length: int) -> int:
    """Non-overlapping (x, y) windows: y is x shifted by one, so a window needs T + 1 tokens."""
    return max(0, (num_tokens - 1) // sequence_length)


def iterate_batches(tokens: np.ndarray, config: LoaderConfig) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (x, y) batches of shape (B, T), int64: each epoch visits every window once in an
    order drawn from `seed` (numpy's PCG64), so the same seed gives the same batches anywhere."""
    # Imported here, not at the top: the tokenizer's config and shards are read where torch is not
    # (the data decision's parameters, the code location).
    import torch

    windows = num_windows(len(tokens), config.sequence_length)
    _require(windows >= config.batch_size, "tokens", "must hold at least batch_size windows of sequence_length + 1")
    rng = np.random.default_rng(config.seed)
    t = config.sequence_length
    while True:
        order = rng.permutation(windows)
        for first in range(0, windows - config.batch_size + 1, config.batch_size):
            starts = order[first : first + config.batch_size] * t
            rows = np.stack([np.asarray(tokens[s : s + t + 1], dtype=np.int64) for s in starts])  # (B, T+1)
            batch = torch.from_numpy(rows)
            yield batch[:, :-1], batch[:, 1:]
