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


# The Digest value: `sha256:` + 64 lower-case hex digits, checked where text becomes one.

HEX = hashlib.sha256(b"x").hexdigest()


@pytest.mark.parametrize("text", [
    "sha256:" + "a" * 63, "sha256:" + "a" * 65, "sha256:" + "A" * 64, "sha256:" + "g" * 64, HEX,
    "SHA256:" + HEX, "sha256:" + HEX + "\n", " sha256:" + HEX, "sha256:", "", "sha256:" + "٣" * 64,
])
def test_a_digest_is_sha256_and_exactly_64_lower_case_hex_digits(text: str) -> None:
    with pytest.raises(ValueError):
        digests.Digest(text)
    with pytest.raises(ValueError):
        digests.Digest.parse(text)


def test_a_valid_digest_is_a_str_with_its_hex_and_short_key() -> None:
    digest = digests.Digest.parse("sha256:" + HEX)
    assert digest == "sha256:" + HEX and isinstance(digest, str)
    assert digest.hex == HEX and digest.short == HEX[:12] == digests.short_key(HEX) == digests.short_key(digest)
    assert type(digest.hex) is str and type(digest.short) is str
    assert digests.Digest.of_bytes(b"x") == digests.Digest.of_hex(HEX) == digest
    assert {digest: 1}["sha256:" + HEX] == 1  # hashes and compares as the plain text


@pytest.mark.parametrize("bad", [None, 7, b"sha256:" + HEX.encode()])
def test_only_text_names_a_digest(bad) -> None:
    with pytest.raises(ValueError):
        digests.Digest.parse(bad)


def test_the_parse_options_widen_only_what_they_name() -> None:
    upper = "sha256:" + HEX.upper()
    assert digests.Digest.parse(upper, any_case=True) == "sha256:" + HEX
    assert digests.Digest.parse(HEX, bare=True) == digests.Digest.parse("sha256:" + HEX, bare=True) == "sha256:" + HEX
    for text, options in [(upper, {}), (HEX, {}), (HEX.upper(), {"any_case": True}),
                          ("SHA256:" + HEX, {"any_case": True}), ("sha256:" + "A" * 63, {"any_case": True}),
                          (HEX[:-1], {"bare": True}), ("sha256:sha256:" + HEX, {"bare": True})]:
        with pytest.raises(ValueError):
            digests.Digest.parse(text, **options)
    for bad in (HEX[:-1], HEX + "0", HEX.upper(), "sha256:" + HEX):
        with pytest.raises(ValueError):
            digests.Digest.of_hex(bad)


def test_a_digest_survives_json_pickle_and_sqlite_as_its_text() -> None:
    import json
    import pickle
    import sqlite3

    digest = digests.Digest.of_hex(HEX)
    assert json.loads(json.dumps({"d": digest})) == {"d": "sha256:" + HEX}
    assert pickle.loads(pickle.dumps(digest)) == digest
    with sqlite3.connect(":memory:") as db:
        assert db.execute("SELECT ?", (digest,)).fetchone() == ("sha256:" + HEX,)


def test_the_places_that_read_or_take_apart_a_digest_use_the_one_type(tmp_path: Path) -> None:
    from ito_assets.control import intake
    from ito_assets.evals.suite import parse_suite
    from ito_assets.manifest import discovery, schema, secure_read

    assert intake.Digest is digests.Digest
    raw = secure_read.ManifestBytes(data=b"{}", sha256_hex=hashlib.sha256(b"{}").hexdigest())
    assert type(raw.digest) is digests.Digest and raw.digest == digests.Digest.of_bytes(b"{}")
    found = discovery.DiscoveredManifest(path="/m.json", sha256_hex=raw.sha256_hex)
    assert type(found.digest) is digests.Digest and found.key == raw.digest.short
    suite = parse_suite("s", b'{"id": "a", "benchmark": "b", "question": "q", "answer": "a"}\n')
    assert type(suite.digest) is digests.Digest
    assert schema.DIGEST_PATTERN == f"^{digests.DIGEST_REGEX}$" and schema.HEX64_PATTERN == f"^{digests.HEX64_REGEX}$"


def test_the_journal_names_a_digest_folder_by_its_hex_and_anything_else_by_a_hash(tmp_path: Path) -> None:
    from ito_assets.data import warehouse

    store = tmp_path / "warehouse.duckdb"
    assert warehouse._record_folder(store, "sha256:" + HEX).name == HEX
    assert warehouse._record_folder(store, HEX).name == HEX
    for other in ("sha256:" + HEX.upper(), "../x"):
        assert warehouse._record_folder(store, other).name == hashlib.sha256(other.encode()).hexdigest()
