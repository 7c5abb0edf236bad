"""The pretraining run's byte-level BPE as a post-training text codec (`vocab.TextCodec`).

The tokenizer (`ito_assets.training.tokenizer`) has exactly one special token, `<|endoftext|>`,
which the token shards put after every document. Post-training gives it the three roles GPT-2
gives it (Radford et al. 2019): bos (a prompt starts where a document starts, after a separator),
eos (a response ends where a document ends, so stopping is something pretraining already taught)
and pad (pad positions are always masked out of every loss). No token is added: the embedding
table stays the one the checkpoint holds.

Prompt and response are encoded separately and joined, as generation produces them: the response
tokens are exactly what the policy samples after the prompt's tokens. With the byte-level
pre-tokenizer a prompt ending in punctuation ("max 371=") never merges with the answer's first
token anyway.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.training.tokenizer import end_of_text_id


@dataclass(frozen=True, kw_only=True)
class TokenizerRef:
    """Where the run's tokenizer is and the sha256 `training_tokens` recorded for it."""

    path: str
    sha256: str


@dataclass(frozen=True, kw_only=True)
class BpeCodec:
    tokenizer_json: str  # the file's text: the codec pickles into the generator process as itself
    _tokenizer: Tokenizer = field(init=False, repr=False, compare=False)
    bos_id: int = field(init=False)
    eos_id: int = field(init=False)
    pad_id: int = field(init=False)

    def __post_init__(self) -> None:
        tokenizer = Tokenizer.from_str(self.tokenizer_json)
        separator = end_of_text_id(tokenizer)
        object.__setattr__(self, "_tokenizer", tokenizer)
        for name in ("bos_id", "eos_id", "pad_id"):
            object.__setattr__(self, name, separator)

    def __reduce__(self):
        return _from_json, (self.tokenizer_json,)  # rebuilt from the text, not the Rust object

    @classmethod
    def load(cls, ref: TokenizerRef) -> "BpeCodec":
        """The tokenizer file, refused unless its bytes still hash to the recorded digest."""
        path = Path(ref.path)
        data = path.read_bytes() if path.is_file() else b""
        if not data or not hmac.compare_digest(hashlib.sha256(data).hexdigest(), ref.sha256):
            raise ItoError(ErrorCode.CHECKPOINT_DIGEST_MISMATCH, "the run's tokenizer is missing or changed")
        return cls(tokenizer_json=data.decode("utf-8"))

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """The end-of-text token is skipped (the caller cuts a completion at its eos first)."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)


def _from_json(tokenizer_json: str) -> BpeCodec:
    return BpeCodec(tokenizer_json=tokenizer_json)
