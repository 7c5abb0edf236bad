"""The partition key is 48 bits of a manifest's digest: a run is judged against the full digest it
was asked for, and two manifests sharing a key are told apart. A file still being written (recent,
not yet whole JSON) is left for a later look. Ages are measured against a given time, never slept."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from helpers import valid_manifest, write_manifest
from ito_assets.manifest import discovery

MAX = 1 << 20
T = 1_800_000_000.0  # the file's modification time in the settle tests
SETTLE = discovery.SETTLE_SECONDS


def sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _other_with_key(digest_hex: str) -> str:
    """A digest that shares `digest_hex`'s partition key (its first 12 hex digits) and nothing more."""
    rest = "".join("0" if c != "0" else "1" for c in digest_hex[12:])
    return "sha256:" + digest_hex[:12] + rest


def test_a_verdict_checks_the_full_digest_the_run_was_asked_for(tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "m.json", valid_manifest())
    key, digest = sha(path)[:12], "sha256:" + sha(path)
    assert discovery.judge(path, key, max_bytes=MAX, digest=digest).ok
    assert discovery.judge(path, key, max_bytes=MAX).ok  # a run with no digest tag: the key alone, as before
    other = _other_with_key(sha(path))
    verdict = discovery.judge(path, key, max_bytes=MAX, digest=other)
    assert (verdict.ok, verdict.error_code, verdict.digest) == (False, "MANIFEST_DIGEST_MISMATCH", digest)
    assert verdict.error_message == (f"the manifest under partition key {key} is {digest}, not {other}, the one this run "
                                     "was asked for: another manifest shares the key or replaced the file")


def test_locate_finds_the_manifest_by_its_full_digest_in_either_folder(tmp_path: Path) -> None:
    inbox, prepared = tmp_path / "inbox", tmp_path / "prepared"
    inbox.mkdir()
    prepared.mkdir()
    first = write_manifest(inbox / "a.json", valid_manifest())
    document = valid_manifest()
    document["name"] = "second"
    second = write_manifest(prepared / "b.json", document)
    folders = (inbox, prepared)
    assert discovery.locate(folders, sha(second)[:12], max_bytes=MAX, digest="sha256:" + sha(second)) == second
    # Not there by its digest: the file under the key, for the verdict to refuse by code.
    assert discovery.locate(folders, sha(first)[:12], max_bytes=MAX, digest=_other_with_key(sha(first))) == first
    assert discovery.locate(folders, "0" * 12, max_bytes=MAX, digest="sha256:" + "0" * 64) is None


def test_two_manifests_sharing_a_key_are_found_colliding_and_one_file_twice_is_not() -> None:
    a, b = "abcdef012345" + "1" * 52, "abcdef012345" + "2" * 52
    found = [discovery.DiscoveredManifest("/in/a.json", a), discovery.DiscoveredManifest("/in/a-copy.json", a),
             discovery.DiscoveredManifest("/in/b.json", b), discovery.DiscoveredManifest("/in/c.json", "f" * 64)]
    assert discovery.colliding(found) == {"abcdef012345": [found[0], found[2]]}
    assert discovery.colliding(found[:2] + found[3:]) == {}


def _half_written(path: Path) -> None:
    text = json.dumps(valid_manifest(), indent=2)
    path.write_text(text[: len(text) // 2])
    path.chmod(0o644)
    os.utime(path, (T, T))


@pytest.mark.parametrize(("age", "waits"), [
    (0.0, True), (SETTLE - 0.001, True), (SETTLE, False), (SETTLE + 1, False),
    (-1.0, True),  # a little ahead of this clock: written now on a network mount
    (-SETTLE - 1, False),  # far ahead: another machine's clock, not a write in progress
])
def test_a_file_not_yet_whole_json_waits_while_it_is_recent(tmp_path: Path, age: float, waits: bool) -> None:
    path = tmp_path / "m.json"
    _half_written(path)
    inbox = discovery.scan(tmp_path, max_bytes=MAX, now=T + age)
    assert inbox.waiting == (["m.json"] if waits else [])
    assert [Path(m.path).name for m in inbox.found] == ([] if waits else ["m.json"])  # its verdict refuses it then


def test_a_whole_manifest_just_written_is_found_at_once(tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "m.json", valid_manifest())
    os.utime(path, (T, T))
    inbox = discovery.scan(tmp_path, max_bytes=MAX, now=T)
    assert inbox.waiting == [] and [m.path for m in inbox.found] == [path]


def test_discover_finds_a_file_still_being_written_for_its_verdict(tmp_path: Path, monkeypatch) -> None:
    """What a run finds again for its partition: a file cut short is judged (and refused by code),
    not missed; only registering a new manifest waits for it."""
    _half_written(tmp_path / "m.json")
    monkeypatch.setattr(discovery, "_clock", lambda: T + 1)
    assert discovery.scan(tmp_path, max_bytes=MAX).waiting == ["m.json"]
    found, rejected = discovery.discover(tmp_path, max_bytes=MAX)
    assert [Path(m.path).name for m in found] == ["m.json"] and rejected == []
