"""The data assets' pieces the fixture chain does not reach: the paraphrase candidates table and
a dedup stage that found no candidate pairs."""

from __future__ import annotations

from types import SimpleNamespace

import polars as pl
import pytest

pytest.importorskip("matplotlib")

from ito_assets.defs.data.metadata import paraphrase_metadata, similarity_metadata  # noqa: E402


def test_paraphrase_candidates_are_a_table_by_similarity(tmp_path):
    path = tmp_path / "paraphrases.parquet"
    pl.DataFrame({"doc_id": ["d1", "d2"], "eval_item_id": ["e1", "e2"], "similarity": [0.86123, 0.97456],
                  "excerpt": ["x" * 200, "short"]}).write_parquet(path)
    metadata = paraphrase_metadata(SimpleNamespace(paraphrases=SimpleNamespace(path=str(path))))
    candidates = metadata["paraphrase_candidates"]
    assert [c.name for c in candidates.schema.columns] == ["doc", "eval item", "similarity", "excerpt"]
    assert [r.data["similarity"] for r in candidates.records] == [0.975, 0.861]  # most similar first
    assert len(candidates.records[1].data["excerpt"]) == 80 and metadata["num_paraphrase_candidates"] == 2


def test_no_candidate_pairs_is_an_empty_table_and_a_no_data_chart():
    metadata = similarity_metadata((0,) * 20, 0.8)
    assert metadata["similarity_histogram"].records == []
    assert metadata["similarity_chart"].value.startswith("![near-duplicate similarity](data:image/png;base64,")
