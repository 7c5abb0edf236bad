"""`ito audit eval-item X` names every manifest that never looked for X: one decontaminated
against a suite without X, and one with no suite's items recorded, beside the one where X was
too short to index. "0 matching document(s)" alone read as a corpus free of X."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from ito_assets.api.cli import run as cli
from ito_assets.data import lineage

WITH_BOTH, WITHOUT_X2, NO_ITEMS, HIT_ONLY = ("sha256:" + c * 64 for c in "abcd")


def _items(*rows: tuple[str, bool]) -> pl.DataFrame:
    return pl.DataFrame({"eval_item_id": [r[0] for r in rows], "benchmark": ["x"] * len(rows), "looked_for": [r[1] for r in rows]},
                        schema={"eval_item_id": pl.String, "benchmark": pl.String, "looked_for": pl.Boolean})


@pytest.fixture
def state(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("ITO_STATE_DIR", str(tmp_path))
    path = tmp_path / "warehouse.duckdb"
    for digest, suite, items in ((WITH_BOTH, "suite-2", _items(("x/1", True), ("x/2", True))),
                                 (WITHOUT_X2, "suite-1", _items(("x/1", True))),
                                 (NO_ITEMS, None, None), (HIT_ONLY, "old", None)):
        tables = {"manifests": pl.DataFrame({"manifest_key": [digest[7:19]], "name": ["m"], "eval_suite_id": [suite]},
                                            schema={"manifest_key": pl.String, "name": pl.String, "eval_suite_id": pl.String})}
        if items is not None:
            tables["eval_items"] = items
        lineage.write_tables(path, digest, tables)
    # A warehouse written before the item lists were kept: its hit is its only record of the suite.
    lineage.write_tables(path, HIT_ONLY, {"contamination_hits": pl.DataFrame({"doc_id": ["d"], "eval_item_id": ["x/2"], "action": ["drop"]})})
    return tmp_path


def test_every_manifest_that_never_looked_for_the_item_is_named(state: Path) -> None:
    report, status = cli(["audit", "eval-item", "x/2", "--json"])
    assert status == 0 and report["data"]["num_documents"] == 1  # HIT_ONLY's document
    assert report["data"]["not_in_suite_of"] == [WITHOUT_X2, NO_ITEMS]
    assert report["data"]["not_looked_for_in"] == []
    text, _ = cli(["audit", "eval-item", "x/2"])
    warnings = [line for line in text["_text"] if line.startswith("warning:")]
    assert warnings == [
        f"warning: in manifest {WITHOUT_X2[7:19]}, this item was not looked for: it is not in the eval suite the manifest "
        "was decontaminated against (suite-1); to protect it, decontaminate against a suite that holds it (materialize "
        f"contamination_report and clean_shards again for partition {WITHOUT_X2[7:19]})",
        f"warning: in manifest {NO_ITEMS[7:19]}, this item was not looked for as far as the warehouse knows: no eval "
        "suite's items are recorded for it (never decontaminated, or written before the items were kept); materialize "
        f"contamination_report again for partition {NO_ITEMS[7:19]}",
    ]


def test_an_item_every_suite_holds_names_only_the_manifests_without_items(state: Path) -> None:
    report, status = cli(["audit", "eval-item", "x/1", "--json"])
    assert status == 0 and report["data"]["num_documents"] == 0
    assert report["data"]["not_in_suite_of"] == [NO_ITEMS, HIT_ONLY]


def test_too_short_is_told_apart_from_not_in_the_suite(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ITO_STATE_DIR", str(tmp_path))
    path = tmp_path / "warehouse.duckdb"
    lineage.write_tables(path, WITH_BOTH, {"manifests": pl.DataFrame({"manifest_key": ["a" * 12], "name": ["m"]}),
                                           "eval_items": _items(("x/1", False), ("x/2", True))})
    report, _ = cli(["audit", "eval-item", "x/1", "--json"])
    assert report["data"]["not_looked_for_in"] == [WITH_BOTH] and report["data"]["not_in_suite_of"] == []
    report, _ = cli(["audit", "eval-item", "x/2", "--json"])
    assert report["data"]["not_looked_for_in"] == [] and report["data"]["not_in_suite_of"] == []
