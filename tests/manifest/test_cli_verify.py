"""`ito manifest verify` through the installed console script, as a caller runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import CANARIES, valid_manifest, write_manifest

ITO = str(Path(sys.executable).with_name("ito"))


def _ito(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([ITO, *args], capture_output=True, text=True, timeout=60, env=env)


def test_json_envelope_for_a_valid_manifest(manifest_path):
    result = _ito("manifest", "verify", manifest_path, "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["ok"] is True and document["live_api_contacted"] is False
    data = document["data"]
    assert data["digest"].startswith("sha256:") and len(data["digest"]) == 71
    assert data["digest"][7:] == data["digest"][7:].lower()
    assert data["size_bytes"] == os.path.getsize(manifest_path)
    assert data["summary"]["model"]["size"] == "tiny"
    assert data["summary"]["budget"]["cap_cents"] == 100000


def test_readable_text_without_json(manifest_path):
    result = _ito("manifest", "verify", manifest_path)
    assert result.returncode == 0
    assert "manifest ok: unit-test" in result.stdout and "digest: sha256:" in result.stdout


def test_expect_digest_upper_case_and_mismatch(manifest_path):
    digest = json.loads(_ito("manifest", "verify", manifest_path, "--json").stdout)["data"]["digest"]
    upper = "sha256:" + digest[7:].upper()
    assert _ito("manifest", "verify", manifest_path, "--expect-digest", upper, "--json").returncode == 0
    wrong = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    result = _ito("manifest", "verify", manifest_path, "--expect-digest", wrong, "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"]["code"] == "MANIFEST_DIGEST_MISMATCH"


@pytest.mark.parametrize(
    "args, code, status",
    [
        (["manifest", "verify", "relative.json", "--json"], "MANIFEST_PATH_NOT_CANONICAL", 1),
        (["manifest", "verify", "/nonexistent/x.json", "--json"], "MANIFEST_NOT_FOUND", 1),
        (["manifest", "verify", "--json"], "USAGE_ERROR", 2),
        (["manifest", "verify", "/x.json", "--bogus", CANARIES["github"], "--json"], "USAGE_ERROR", 2),
    ],
)
def test_failures_are_one_json_document(args, code, status):
    result = _ito(*args)
    assert result.returncode == status
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["error"]["code"] == code
    assert set(document) == {"ok", "live_api_contacted", "notice", "error"}
    assert CANARIES["github"] not in result.stdout + result.stderr


def test_missing_provenance_fails_verify(tmp_path):
    document = valid_manifest()
    del document["data"][0]["decontamination"]
    result = _ito("manifest", "verify", write_manifest(tmp_path / "m.json", document), "--json")
    assert json.loads(result.stdout)["error"]["code"] == "PROVENANCE_MISSING"


@pytest.mark.parametrize("canary", sorted(CANARIES))
def test_canaries_never_reach_stdout_or_stderr(tmp_path, canary):
    document = valid_manifest()
    document["name"] = CANARIES[canary]
    document["data"][0]["uri"] = "dataroot://x/" + CANARIES[canary].replace(" ", "_").replace("\n", "_")
    path = write_manifest(tmp_path / "m.json", document)
    for extra in ([], ["--json"]):
        result = _ito("manifest", "verify", path, *extra)
        assert result.returncode == 1
        assert CANARIES[canary] not in result.stdout + result.stderr
        if extra:
            assert json.loads(result.stdout)["error"]["code"] == "MANIFEST_CONTAINS_SECRET"
