"""Digests as every layer passes them: the sha256 of a file on disk, and the `Digest` value.

`file_sha256` is the one way shards, sources, checkpoint markers' `.metadata` and post-training
checkpoints are hashed, so their digests agree byte for byte (a training checkpoint's shard files
get a faster digest, named in their marker: `runtime/checkpoint/file_digest.py`). `hashlib.file_digest` reads the file in buffered
blocks (or hands the descriptor to OpenSSL), so memory stays flat whatever the file's size.

`Digest` is a manifest's or an eval suite's digest, `sha256:` + 64 lower-case hex digits, checked
once where text from outside becomes one and then trusted everywhere it travels.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

PREFIX = "sha256:"
HEX64_REGEX = "[0-9a-f]{64}"
DIGEST_REGEX = PREFIX + HEX64_REGEX
# 48 bits: collisions need ~16M manifests by the birthday bound.
SHORT_HEX_DIGITS = 12

_DIGEST = re.compile(DIGEST_REGEX)
_HEX64 = re.compile(HEX64_REGEX)
_HEX64_ANY_CASE = re.compile("[0-9a-fA-F]{64}")


def file_sha256(path: str | Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


class Digest(str):
    """`sha256:` + 64 lower-case hex digits. A str, so JSON, SQL parameters, Parquet columns and
    Dagster metadata take it unchanged; constructing one checks it (ValueError), so a `Digest` in
    hand needs no further check. Callers map the ValueError to their own error code and message."""

    __slots__ = ()

    def __new__(cls, text: str) -> Digest:
        if not isinstance(text, str) or _DIGEST.fullmatch(text) is None:
            raise ValueError("a digest is sha256: followed by 64 lower-case hex digits")
        return super().__new__(cls, text)

    @classmethod
    def parse(cls, text: object, *, any_case: bool = False, bare: bool = False) -> Digest:
        """The digest `text` names. any_case: the hex digits may be upper case (folded to lower
        case; the prefix may not); bare: 64 hex digits without the prefix name it too."""
        if not isinstance(text, str):
            raise ValueError("a digest is text")
        hex_digits = text[len(PREFIX):] if text.startswith(PREFIX) else text if bare else ""
        if any_case and _HEX64_ANY_CASE.fullmatch(hex_digits):
            hex_digits = hex_digits.lower()
        return cls(PREFIX + hex_digits)

    @classmethod
    def of_hex(cls, hex_digits: str) -> Digest:
        """From `hashlib`'s `hexdigest()` (or `file_sha256`): 64 lower-case hex digits."""
        if not isinstance(hex_digits, str) or _HEX64.fullmatch(hex_digits) is None:
            raise ValueError("a sha256 is 64 lower-case hex digits")
        return cls(PREFIX + hex_digits)

    @classmethod
    def of_bytes(cls, data: bytes) -> Digest:
        return cls(PREFIX + hashlib.sha256(data).hexdigest())

    @property
    def hex(self) -> str:
        return str(self[len(PREFIX):])

    @property
    def short(self) -> str:
        """The key of partitions and file names."""
        return short_key(self)


def short_key(digest: str) -> str:
    """The partition key of `sha256:HEX` or bare HEX, unchecked: for naming what a damaged record
    refers to, where refusing the text would hide the damage it is reporting."""
    return digest.removeprefix(PREFIX)[:SHORT_HEX_DIGITS]
