"""The data manifest: the smallest manifest the data stage needs, verified by the same machinery
as a training manifest, and never accepted where a training manifest is needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import CANARIES, valid_manifest, write_file, write_manifest
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest import discovery
from ito_assets.manifest.schema import DataManifest, Manifest
from ito_assets.manifest.verify import (
    check_expected_digest,
    require_provenance,
    summarize,
    verify_data_manifest,
    verify_manifest,
)
from ito_assets.settings import PROJECT_ROOT

MAX = 256 * 1024


def data_manifest() -> dict:
    training = valid_manifest()
    return {"schema_version": 1, "kind": "data", "name": "my-corpus", "data": training["data"]}


def _error(function, *args) -> ItoError:
    with pytest.raises(ItoError) as info:
        function(*args)
    return info.value


def test_a_data_manifest_verifies_with_the_data_stage_and_names_its_kind(tmp_path: Path) -> None:
    verified = verify_data_manifest(write_manifest(tmp_path / "d.json", data_manifest()))
    assert type(verified.manifest) is DataManifest and not verified.is_training
    require_provenance(verified.manifest)
    summary = summarize(verified)
    assert summary["kind"] == "data" and summary["num_data_references"] == 1
    assert not {"model", "budget", "stages"} & set(summary)


def test_a_training_manifest_is_what_the_data_stage_needs_too(tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "t.json", valid_manifest())
    for verify in (verify_manifest, verify_data_manifest):
        verified = verify(path)
        assert isinstance(verified.manifest, Manifest) and verified.is_training and verified.manifest.kind == "training"


def test_the_committed_manifests_keep_their_bytes_and_verify_as_training() -> None:
    for path in sorted((PROJECT_ROOT / "data" / "fixtures" / "manifests").glob("*.json")):
        assert "kind" not in json.loads(path.read_text())
        assert verify_data_manifest(str(path)).is_training


def test_a_data_manifest_is_refused_where_a_training_manifest_is_needed(tmp_path: Path) -> None:
    error = _error(verify_manifest, write_manifest(tmp_path / "d.json", data_manifest()))
    assert error.code is ErrorCode.MANIFEST_INVALID and "data manifest" in error.message


@pytest.mark.parametrize("change, location", [
    (lambda d: d.update(model={"size": "tiny", "num_parameters": 1, "revision": "r1"}), "model"),
    (lambda d: d.update(budget={"cap_cents": 1, "max_incremental_cents": 1}), "budget"),
    (lambda d: d.pop("data"), "data"),
    (lambda d: d.update(data=[]), "data"),
    (lambda d: d.update(kind="other"), "model"),  # not "data": judged as a training manifest
    (lambda d: d["data"][0].update(text_field="has space"), "data.0.text_field"),
    (lambda d: d["data"][0].update(id_field=""), "data.0.id_field"),
    (lambda d: d.update(data=[d["data"][0], d["data"][0]]), "data"),
])
def test_schema_errors_name_the_field_and_never_the_value(tmp_path: Path, change, location) -> None:
    document = data_manifest()
    change(document)
    error = _error(verify_data_manifest, write_manifest(tmp_path / "d.json", document))
    assert error.code is ErrorCode.MANIFEST_INVALID and location in error.message
    assert "has space" not in error.message


def test_the_secret_scan_runs_on_a_data_manifest(tmp_path: Path) -> None:
    document = data_manifest()
    document["data"][0]["uri"] = "file:///data/" + CANARIES["github"] + ".jsonl"
    error = _error(verify_data_manifest, write_manifest(tmp_path / "d.json", document))
    assert error.code is ErrorCode.MANIFEST_CONTAINS_SECRET and CANARIES["github"] not in error.message


def test_field_names_default_and_are_kept(tmp_path: Path) -> None:
    document = data_manifest()
    document["data"][0].update(text_field="body", id_field="uid")
    ref = verify_data_manifest(write_manifest(tmp_path / "d.json", document)).manifest.data[0]
    assert (ref.text_field, ref.id_field) == ("body", "uid")
    default = verify_data_manifest(write_manifest(tmp_path / "e.json", data_manifest())).manifest.data[0]
    assert (default.text_field, default.id_field) == ("text", None)


def test_a_tampered_data_manifest_is_refused(tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "d.json", data_manifest())
    verified = verify_data_manifest(path)
    key = verified.short_digest
    tampered = json.loads(Path(path).read_text())
    tampered["data"][0]["license"] = "MIT"  # still schema-valid: only the digest tells
    write_file(Path(path), json.dumps(tampered, indent=2))
    verdict = discovery.judge(path, key, max_bytes=MAX)
    assert not verdict.ok and verdict.error_code == "MANIFEST_CHANGED"
    again = verify_data_manifest(path)
    assert _error(check_expected_digest, again.digest, verified.digest).code is ErrorCode.MANIFEST_DIGEST_MISMATCH
    assert discovery.judge(str(path), again.short_digest, max_bytes=MAX).ok


def test_ito_manifest_verify_shows_a_data_manifest(tmp_path: Path) -> None:
    from ito_assets.api.cli import run

    document, status = run(["manifest", "verify", write_manifest(tmp_path / "d.json", data_manifest()), "--json"])
    assert status == 0 and document["data"]["summary"]["kind"] == "data"
    assert "data manifest ok: my-corpus" in document["_text"][0]
