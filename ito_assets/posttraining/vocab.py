"""The text codec of post-training: a Protocol, and the character vocabulary of the tiny CPU runs.

A policy that comes from a pretraining checkpoint must be post-trained with that checkpoint's own
tokenizer; anything with `encode`, `decode`, `vocab_size`, `bos_id`, `eos_id` and `pad_id` fits:
the run's byte-level BPE (`bpe.BpeCodec`) is what the Dagster stages use. The character
vocabulary is what the unit tests of the losses and loops use: every task here is printable
ASCII, and one token per character makes a 2-layer model learn them in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence


class TextCodec(Protocol):
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


# The 95 printable ASCII characters plus newline: arithmetic, exact-match answers and small code.
PRINTABLE = "".join(chr(c) for c in range(32, 127)) + "\n"
_SPECIALS = ("<pad>", "<bos>", "<eos>")


@dataclass(frozen=True, kw_only=True)
class CharVocab:
    """Ids 0-2 are pad, bos, eos; then one id per character of `alphabet`."""

    alphabet: str = PRINTABLE
    pad_id: int = field(default=0, init=False)
    bos_id: int = field(default=1, init=False)
    eos_id: int = field(default=2, init=False)
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.alphabet or len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError("alphabet must be a non-empty string of distinct characters")
        object.__setattr__(self, "_index", {c: i + len(_SPECIALS) for i, c in enumerate(self.alphabet)})

    @property
    def vocab_size(self) -> int:
        return len(_SPECIALS) + len(self.alphabet)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._index[c] for c in text]
        except KeyError:
            raise ValueError("text has a character outside the vocabulary") from None

    def decode(self, ids: Sequence[int]) -> str:
        """Special ids are skipped (the caller cuts a completion at its eos first)."""
        offset = len(_SPECIALS)
        return "".join(self.alphabet[i - offset] for i in ids if offset <= i < self.vocab_size)
