"""`training_manifest`'s overview: a sentence, with the data references as a table with a schema."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ito_assets.defs.manifest.assets import _verdict_metadata
from ito_assets.manifest.discovery import judge


def test_data_references_are_a_table_beside_the_overview(installation):
    path = installation.manifest("overview", provenance=False)
    key = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    metadata = _verdict_metadata(judge(path, key, max_bytes=installation.settings.max_manifest_bytes))
    references = metadata["data_references"]
    assert [c.name for c in references.schema.columns] == ["data reference", "licence", "format", "provenance"]
    assert references.records and references.records[0].data["provenance"] is False
    assert metadata["overview"].value.startswith("**overview**: model") and "|" not in metadata["overview"].value
