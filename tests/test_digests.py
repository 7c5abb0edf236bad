"""One file digest: every module that hashes a file on disk gets the same 64 hex digits as
hashlib.sha256 over the whole of its bytes, whatever the file's size."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ito_assets import digests
from ito_assets.data import shards, sources
from ito_assets.manifest.schema import DataReference
from ito_assets.posttraining import checkpoint
from ito_assets.runtime.checkpoint import markers

# Around the 1 MiB blocks the former hand-written loops read, and around 64 KiB.
SIZES = [0, 1, (1 << 16) - 1, 1 << 16, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 2 * (1 << 20) + 3]


@pytest.mark.parametrize("size", SIZES)
def test_file_sha256_hashes_every_byte_across_block_boundaries(tmp_path: Path, size: int) -> None:
    data = bytes((i * 31 + 7) % 256 for i in range(size))
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert digests.file_sha256(path) == digests.file_sha256(str(path)) == hashlib.sha256(data).hexdigest()


def test_every_file_hashing_module_uses_the_one_digest() -> None:
    assert shards.file_sha256 is markers.file_sha256 is checkpoint.file_sha256 is sources.file_sha256
    assert shards.file_sha256 is digests.file_sha256


def test_a_source_digest_and_its_verified_snapshot_agree_with_the_bytes(tmp_path: Path) -> None:
    data = b'{"text": "a"}\n' * 100_000  # 1.4 MB: more than one block
    (tmp_path / "a.jsonl").write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    ref = DataReference(uri="dataroot://a.jsonl", sha256=expected, license="CC0-1.0", format="jsonl")
    assert sources.source_digest(ref, tmp_path) == expected
    sources.snapshot(ref, tmp_path, tmp_path / "copy" / "a.jsonl")
    assert (tmp_path / "copy" / "a.jsonl").read_bytes() == data
