"""Discovery of reviewed manifests in a folder (what the sensor registers) and the verdict on one
manifest (what the asset and its checks show): every file is accounted for, by key or by code."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from helpers import valid_manifest, write_file, write_manifest
from ito_assets.manifest import discovery

MAX = 1 << 20
MISSING_MESSAGE = "the manifest file does not exist"


def sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_every_json_file_directly_in_the_folder_is_found_or_rejected_by_code(tmp_path: Path) -> None:
    good = write_manifest(tmp_path / "b-good.json", valid_manifest())
    write_file(tmp_path / "a-loose.json", "{}", mode=0o666)                    # unsafe permissions
    write_file(tmp_path / "notes.txt", "not a manifest")                       # other suffixes ignored
    write_file(tmp_path / "0-readme.md", "listed first, skipped, and the walk goes on")
    (tmp_path / "c-folder.json").mkdir()                                        # not a regular file
    (tmp_path / "nested").mkdir()
    write_manifest(tmp_path / "nested" / "deep.json", valid_manifest())        # not directly inside
    os.symlink(good, tmp_path / "d-link.json")
    found, rejected = discovery.discover(tmp_path, max_bytes=MAX)
    assert found == [discovery.DiscoveredManifest(good, sha(good))]
    assert [(r.file_name, r.code) for r in rejected] == [
        ("a-loose.json", "MANIFEST_UNSAFE_PERMISSIONS"), ("c-folder.json", "MANIFEST_NOT_REGULAR"),
        ("d-link.json", "MANIFEST_SYMLINK")]
    assert found[0].key == sha(good)[:12] and found[0].digest == "sha256:" + sha(good)


def test_a_missing_folder_has_nothing_to_discover(tmp_path: Path) -> None:
    assert discovery.discover(tmp_path / "absent", max_bytes=MAX) == ([], [])
    write_file(tmp_path / "plain-file", "x")
    assert discovery.discover(tmp_path / "plain-file", max_bytes=MAX) == ([], [])


def test_the_size_bound_is_applied_to_each_file(tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "m.json", valid_manifest())
    size = Path(path).stat().st_size
    assert len(discovery.discover(tmp_path, max_bytes=size)[0]) == 1
    assert [r.code for r in discovery.discover(tmp_path, max_bytes=size - 1)[1]] == ["MANIFEST_TOO_LARGE"]


def test_files_are_listed_in_name_order(tmp_path: Path) -> None:
    paths = []
    for name in ("c.json", "a.json", "b.json"):
        document = valid_manifest()
        document["name"] = name.removesuffix(".json")
        paths.append(write_manifest(tmp_path / name, document))
    found, _ = discovery.discover(tmp_path, max_bytes=MAX)
    assert [Path(m.path).name for m in found] == ["a.json", "b.json", "c.json"]
    assert discovery.locate(tmp_path, sha(paths[2])[:12], max_bytes=MAX) == paths[2]
    assert discovery.locate(tmp_path, "0" * 12, max_bytes=MAX) is None


def test_a_verdict_carries_the_verified_manifest_or_the_code_that_refused_it(tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "m.json", valid_manifest())
    key = sha(path)[:12]
    verdict = discovery.judge(path, key, max_bytes=MAX)
    assert verdict.ok and verdict.error_code is None and verdict.error_message is None
    assert (verdict.key, verdict.path, verdict.digest, verdict.size_bytes) == (
        key, path, "sha256:" + sha(path), Path(path).stat().st_size)
    assert verdict.verified.raw.data == Path(path).read_bytes()
    assert verdict.summary()["name"] == valid_manifest()["name"]


def test_a_verdict_applies_the_size_bound(tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "m.json", valid_manifest())
    size = Path(path).stat().st_size
    assert discovery.judge(path, sha(path)[:12], max_bytes=size).ok
    assert discovery.judge(path, sha(path)[:12], max_bytes=size - 1).error_code == "MANIFEST_TOO_LARGE"


def test_a_manifest_changed_since_registration_is_refused_with_its_new_digest(tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "m.json", valid_manifest())
    key = sha(path)[:12]
    document = valid_manifest()
    document["name"] = "edited-after-review"
    write_manifest(Path(path), document)
    verdict = discovery.judge(path, key, max_bytes=MAX)
    assert (verdict.ok, verdict.error_code, verdict.digest) == (False, "MANIFEST_CHANGED", "sha256:" + sha(path))
    assert verdict.error_message == "the manifest changed since it was registered"
    assert verdict.summary() is None and verdict.verified is None


def test_an_unreadable_or_invalid_manifest_is_a_verdict_not_an_exception(tmp_path: Path) -> None:
    gone = str(tmp_path / "gone.json")
    missing = discovery.judge(gone, "0" * 12, max_bytes=MAX)
    assert (missing.ok, missing.key, missing.path, missing.digest, missing.size_bytes) == (
        False, "0" * 12, gone, None, None)
    assert missing.error_message == MISSING_MESSAGE
    assert missing.error_code == "MANIFEST_NOT_FOUND"
    bad = write_file(tmp_path / "bad.json", json.dumps({"name": "x"}))
    verdict = discovery.judge(bad, sha(bad)[:12], max_bytes=MAX)
    assert (verdict.ok, verdict.error_code, verdict.size_bytes) == (False, "MANIFEST_INVALID", Path(bad).stat().st_size)
    assert verdict.error_message.startswith("the manifest does not match the schema")
