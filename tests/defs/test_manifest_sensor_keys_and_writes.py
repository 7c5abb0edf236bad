"""The reviewed-manifest sensor and the training_manifest asset around the partition key (48 bits
of the digest): two manifests sharing a key are both refused and logged, never one dropped in
silence; a run is refused by code when the file under its key is not the digest it was asked for.
A file still being written waits, logged, and keeps what the sensor remembers."""

from __future__ import annotations

import json

import dagster as dg

from helpers import ManifestSensorTicks
from ito_assets.control.run_tags import MANIFEST_DIGEST
from ito_assets.defs.manifest.assets import training_manifest
from ito_assets.defs.resources import ItoSettingsResource
from ito_assets.manifest import discovery
from ito_assets.manifest.secure_read import read_manifest_bytes

Ticks = ManifestSensorTicks  # every log line of each tick


def _added(result: dg.SensorResult) -> list[str]:
    return [k for r in result.dynamic_partitions_requests for k in r.partition_keys]


def test_two_manifests_sharing_a_key_are_both_refused_and_logged_once(installation, instance, caplog, monkeypatch):
    inbox = installation.manifests_dir
    other = read_manifest_bytes(installation.manifest("other")).sha256_hex
    clash = [discovery.DiscoveredManifest(str(inbox / "a.json"), "abcdef012345" + "1" * 52),
             discovery.DiscoveredManifest(str(inbox / "b.json"), "abcdef012345" + "2" * 52)]
    scan = discovery.scan

    def with_clash(folder, **kwargs):
        found = scan(folder, **kwargs)
        return discovery.Inbox(found.found + clash, found.rejected, found.waiting)

    monkeypatch.setattr(discovery, "scan", with_clash)
    ticks = Ticks(installation, instance, caplog)
    result, logs = ticks.tick()
    assert [r.partition_key for r in result.run_requests] == [other[:12]] and _added(result) == [other[:12]]
    assert logs == [f"manifest file '{name}' was not registered: MANIFEST_DIGEST_MISMATCH (another manifest shares its "
                    "partition key abcdef012345)" for name in ("a.json", "b.json")]
    result, logs = ticks.tick()
    assert "abcdef012345" not in {r.partition_key for r in result.run_requests} and logs == []


def test_one_manifest_alone_under_its_key_is_registered(installation, instance, caplog):
    """The boundary: one file, and one manifest under two names, are no collision."""
    path = installation.manifest("alone")
    (installation.manifests_dir / "alone-copy.json").write_bytes(open(path, "rb").read())
    (installation.manifests_dir / "alone-copy.json").chmod(0o644)
    result, logs = Ticks(installation, instance, caplog).tick()
    key = read_manifest_bytes(path).sha256_hex[:12]
    assert [r.partition_key for r in result.run_requests] == [key] and not any("not registered" in line for line in logs)


def test_a_file_still_being_written_waits_logged_and_keeps_the_marks(installation, instance, caplog, monkeypatch):
    path = installation.manifest("m1")
    whole = open(path, "rb").read()
    ticks = Ticks(installation, instance, caplog)
    (first,) = ticks.tick()[0].run_requests
    modified = installation.manifests_dir.joinpath("m1.json").stat().st_mtime
    monkeypatch.setattr(discovery, "_clock", lambda: modified + 1)  # every file "just written"
    with open(path, "wb") as out:  # an editor saving it again, half-way through
        out.write(whole[: len(whole) // 2])
    result, logs = ticks.tick()
    assert result.run_requests == [] and _added(result) == []
    assert logs == ["manifest file 'm1.json' is still being written (modified under 5 s ago, not yet whole JSON); "
                    "it waits for the next tick"]
    assert first.run_key[7:19] in json.loads(result.cursor)["requested"]  # not forgotten while it waits
    with open(path, "wb") as out:
        out.write(whole)
    result, logs = ticks.tick()
    assert result.run_requests == [] and logs == []  # the same manifest: asked for once, not again


def test_the_asset_refuses_a_file_that_is_not_the_digest_the_run_was_asked_for(installation, instance):
    path = installation.manifest("reviewed")
    raw = read_manifest_bytes(path)
    key, digest = raw.sha256_hex[:12], str(raw.digest)
    instance.add_dynamic_partitions("manifests", [key])
    resources = {"ito": ItoSettingsResource.from_settings(installation.settings)}
    swapped = "sha256:" + key + "0" * 52  # what the sensor saw under this key, before the file was swapped
    for tag, code in ((digest, None), (swapped, "MANIFEST_DIGEST_MISMATCH")):
        result = dg.materialize([training_manifest], partition_key=key, instance=instance, resources=resources,
                                tags={MANIFEST_DIGEST: tag})
        verdict = result.output_for_node("training_manifest")
        assert (verdict.ok, verdict.error_code, verdict.digest) == (code is None, code, digest)
