"""Content failures of a manifest, each with its stable code and no echo of the input."""

from __future__ import annotations

import json

import pytest

from helpers import CANARIES, valid_manifest, write_file, write_manifest
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.verify import (
    check_expected_digest,
    eval_suite_mismatches,
    require_provenance,
    verify_manifest,
)


def _code(tmp_path, document) -> ErrorCode:
    path = write_manifest(tmp_path / "m.json", document)
    with pytest.raises(ItoError) as info:
        verify_manifest(path)
    return info.value.code


def test_valid_manifest_verifies(manifest_path):
    verified = verify_manifest(manifest_path)
    assert verified.digest.startswith("sha256:") and len(verified.digest) == 71
    assert verified.manifest.budget.cap_cents == 100000


def _set(doc, path, value):
    target = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return doc


INVALID = {
    "int-as-string": (("model", "num_parameters"), "8"),
    "int-as-float": (("model", "num_parameters"), 8.0),
    "int-as-bool": (("model", "num_parameters"), True),
    "zero-budget": (("budget", "cap_cents"), 0),
    "negative-budget": (("budget", "cap_cents"), -5),
    "negative-increment": (("budget", "max_incremental_cents"), -1),
    "money-as-float": (("budget", "cap_cents"), 100000.0),
    "increment-over-cap": (("budget", "max_incremental_cents"), 100001),
    "unknown-top-field": (("surprise",), 1),
    "unknown-nested-field": (("model", "surprise"), 1),
    "unknown-provenance-field": (("data", 0, "decontamination", "surprise"), "x"),
    "bad-sha256": (("data", 0, "sha256"), "XYZ"),
    "upper-sha256": (("data", 0, "sha256"), "A" * 64),
    "bad-uri-scheme": (("data", 0, "uri"), "http://example.invalid/x.jsonl"),
    "stages-out-of-order": (("training_target", "stages"), [
        {"name": "mid_training", "num_tokens": 100, "sequence_length": 128},
        {"name": "pretraining", "num_tokens": 200, "sequence_length": 128}]),
    "stage-tokens-dont-add-up": (("training_target", "num_tokens"), 301),
    "recipe-out-of-order": (("post_training",), [{"kind": "dpo"}, {"kind": "sft"}]),
    "recipe-repeated": (("post_training",), [{"kind": "sft"}, {"kind": "sft"}]),
    "recipe-unknown-kind": (("post_training",), [{"kind": "ppo"}]),
    "schema-version": (("schema_version",), 2),
    "no-data": (("data",), []),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_schema_failures(tmp_path, case):
    path, value = INVALID[case]
    assert _code(tmp_path, _set(valid_manifest(), path, value)) is ErrorCode.MANIFEST_INVALID


@pytest.mark.parametrize(
    "raw",
    ['{"schema_version": 1, "schema_version": 1}', '{"budget": {"cap_cents": 1, "cap_cents": 2}}',
     '{"x": NaN}', '\ufeff{}', '{} trailing'],
    ids=["dup-top", "dup-nested", "nan", "bom", "trailing"],
)
def test_json_failures(tmp_path, raw):
    path = write_file(tmp_path / "m.json", raw)
    with pytest.raises(ItoError) as info:
        verify_manifest(path)
    assert info.value.code is ErrorCode.MANIFEST_INVALID


SECRET_FIELDS = [
    ("name",), ("model", "revision"), ("data", 0, "uri"), ("data", 0, "license"),
    ("checkpoint_policy", "storage_uri"), ("data", 0, "decontamination", "eval_suite_id"),
]


@pytest.mark.parametrize("field", SECRET_FIELDS, ids=lambda f: ".".join(map(str, f)))
@pytest.mark.parametrize("canary", sorted(CANARIES))
def test_canary_in_each_field(tmp_path, field, canary):
    document = _set(valid_manifest(), field, CANARIES[canary])
    path = write_manifest(tmp_path / "m.json", document)
    with pytest.raises(ItoError) as info:
        verify_manifest(path)
    assert info.value.code is ErrorCode.MANIFEST_CONTAINS_SECRET
    assert CANARIES[canary] not in info.value.message
    assert CANARIES[canary] not in str(info.value)


def test_canary_in_unknown_field_is_a_secret_not_a_schema_error(tmp_path):
    document = valid_manifest()
    document["hf_token"] = CANARIES["hugging_face"]
    assert _code(tmp_path, document) is ErrorCode.MANIFEST_CONTAINS_SECRET


def test_schema_errors_never_echo_values(tmp_path):
    document = _set(valid_manifest(), ("name",), "not a valid name: CANARY-VALUE-42")
    path = write_manifest(tmp_path / "m.json", document)
    with pytest.raises(ItoError) as info:
        verify_manifest(path)
    assert info.value.code is ErrorCode.MANIFEST_INVALID
    assert "CANARY-VALUE-42" not in str(info.value)


def test_missing_provenance_has_its_own_code(tmp_path):
    document = valid_manifest()
    del document["data"][0]["decontamination"]
    verified = verify_manifest(write_manifest(tmp_path / "m.json", document))
    with pytest.raises(ItoError) as info:
        require_provenance(verified.manifest)
    assert info.value.code is ErrorCode.PROVENANCE_MISSING


def test_eval_suite_mismatch(manifest_path):
    manifest = verify_manifest(manifest_path).manifest
    assert eval_suite_mismatches(manifest, "ito-fixture-evals-v1", "sha256:" + "a" * 64) == []
    assert eval_suite_mismatches(manifest, "ito-fixture-evals-v1", "sha256:" + "b" * 64) == ["data[0]"]
    assert eval_suite_mismatches(manifest, "another-suite", "sha256:" + "a" * 64) == ["data[0]"]


def test_expected_digest(manifest_path):
    digest = verify_manifest(manifest_path).digest
    check_expected_digest(digest, digest)
    check_expected_digest(digest, "sha256:" + digest[7:].upper())
    last = digest[-1]
    off_by_one = digest[:-1] + ("0" if last != "0" else "1")
    with pytest.raises(ItoError) as info:
        check_expected_digest(digest, off_by_one)
    assert info.value.code is ErrorCode.MANIFEST_DIGEST_MISMATCH
    with pytest.raises(ItoError) as info:
        check_expected_digest(digest, digest[7:])
    assert info.value.code is ErrorCode.USAGE_ERROR


def test_one_byte_changes_the_digest(tmp_path):
    text = json.dumps(valid_manifest(), indent=2)
    a = verify_manifest(write_file(tmp_path / "a.json", text)).digest
    b = verify_manifest(write_file(tmp_path / "b.json", text + "\n")).digest
    assert a != b
