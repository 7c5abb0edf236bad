"""A warehouse that is missing: `ito audit` only reads, so it answers WAREHOUSE_NOT_FOUND with the
fix and leaves the journal as it is; the data step that rebuilds it moves the records it cannot
replay (a file missing, even for a moment) to the journal's quarantine folder, never deletes them."""

from __future__ import annotations

import logging
from pathlib import Path

import duckdb
import polars as pl
import pytest

from ito_assets.api.cli import run as cli
from ito_assets.data import lineage, warehouse

MANIFEST = "sha256:" + "c3" * 32
KEY = "c3" * 6


def _journal(path: Path) -> dict[str, bytes]:
    folder = warehouse.journal_folder(path)
    return {f.relative_to(folder).as_posix(): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


@pytest.fixture
def state(tmp_path: Path, monkeypatch) -> Path:
    """A state folder whose warehouse holds one manifest's manifests and documents rows."""
    monkeypatch.setenv("ITO_STATE_DIR", str(tmp_path))
    path = tmp_path / "warehouse.duckdb"
    lineage.write_tables(path, MANIFEST, {
        "manifests": pl.DataFrame({"manifest_key": [KEY], "name": ["m"]}),
        "documents": pl.DataFrame({"doc_id": ["d1"], "source_record_id": ["r1"], "source_index": [0], "row": [0]}),
    })
    return tmp_path


def test_an_audit_of_a_missing_warehouse_writes_nothing_and_names_the_fix(state: Path) -> None:
    path = state / "warehouse.duckdb"
    documents = warehouse.journal_folder(path) / MANIFEST.removeprefix("sha256:") / "documents.parquet"
    path.unlink()
    aside = documents.with_name("elsewhere")
    documents.rename(aside)  # a file absent for a moment (a restore in progress)
    before = _journal(path)
    for verb in (["manifest", KEY], ["doc", "r1"], ["eval-item", "x/1"]):
        document, status = cli(["audit", *verb, "--json"])
        assert status == 1 and document["error"]["code"] == "WAREHOUSE_NOT_FOUND"
        message = document["error"]["message"]
        assert "warehouse.lineage/" in message and "source_documents" in message and str(state) not in message
    assert not path.exists() and _journal(path) == before  # nothing rebuilt, no record set aside
    aside.rename(documents)
    warehouse.connect(path).close()  # the next data step: every record verifies again
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT doc_id FROM documents").fetchall() == [("d1",)]


def test_an_audit_with_no_warehouse_nor_journal_says_none_yet(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ITO_STATE_DIR", str(tmp_path))
    document, status = cli(["audit", "manifest", KEY, "--json"])
    assert status == 1 and document["error"]["code"] == "WAREHOUSE_NOT_FOUND"
    assert document["error"]["message"].startswith("no warehouse yet")
    assert not (tmp_path / "warehouse.duckdb").exists() and not (tmp_path / "warehouse.lineage").exists()


def test_a_rebuild_moves_the_records_it_cannot_replay_to_quarantine(state: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = state / "warehouse.duckdb"
    record_folder = warehouse.journal_folder(path) / MANIFEST.removeprefix("sha256:")
    record, data = record_folder / "documents.json", record_folder / "documents.parquet"
    kept = {record.name: record.read_bytes(), data.name: data.read_bytes()}
    data.write_bytes(data.read_bytes()[:-8])  # no longer hashes to its record
    path.unlink()
    with caplog.at_level(logging.WARNING, logger=warehouse.LOG.name):
        warehouse.connect(path).close()
    (warning,) = [r.getMessage() for r in caplog.records if r.name == warehouse.LOG.name]
    assert "left out: shard" in warning and "(its records moved to warehouse.lineage/quarantine/" in warning
    assert not record.exists() and not data.exists()
    (quarantined,) = (warehouse.journal_folder(path) / warehouse.QUARANTINE).glob(f"*/{record_folder.name}")
    assert {f.name for f in quarantined.iterdir()} == set(kept)
    assert (quarantined / record.name).read_bytes() == kept[record.name]
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM documents").fetchone() == (0,)
        assert con.execute("SELECT name FROM manifests").fetchall() == [("m",)]
    path.unlink()  # a later rebuild never reads the quarantine back, nor warns of it again
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=warehouse.LOG.name):
        warehouse.connect(path).close()
    assert "every file verified" in caplog.records[-1].getMessage()
