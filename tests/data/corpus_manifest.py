"""A user's corpus on files for the data stages' tests: records written as JSONL, and the fixture
manifest naming that file alone, bound by its digest."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from ito_assets.digests import file_sha256
from ito_assets.manifest.verify import VerifiedManifest, verify_manifest
from ito_assets.settings import PROJECT_ROOT

FIXTURE_MANIFEST = PROJECT_ROOT / "data" / "fixtures" / "manifests" / "fixture-small.json"


def corpus_manifest(root: Path, records: Iterable[dict], *, decontamination: dict | None = None) -> VerifiedManifest:
    """`records` as `root/corpus.jsonl` and `root/manifest.json` naming it (CC0-1.0, JSONL), verified.
    `decontamination`: the reference's provenance; the fixture's where None. `root` must be its
    real path: the manifest reader refuses a path through a symbolic link."""
    path = root / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    manifest = json.loads(FIXTURE_MANIFEST.read_text())
    provenance = manifest["data"][0]["decontamination"] if decontamination is None else decontamination
    manifest["data"] = [{"uri": "dataroot://corpus.jsonl", "sha256": file_sha256(path), "license": "CC0-1.0",
                         "format": "jsonl", "decontamination": provenance}]
    (root / "manifest.json").write_text(json.dumps(manifest))
    return verify_manifest(str(root / "manifest.json"))
