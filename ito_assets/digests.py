"""The sha256 of a file on disk, as 64 lower-case hex digits: the one way shards, sources,
checkpoint markers and post-training checkpoints are hashed, so their digests agree byte for byte.

`hashlib.file_digest` reads the file in buffered blocks (or hands the descriptor to OpenSSL), so
memory stays flat whatever the file's size.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()

