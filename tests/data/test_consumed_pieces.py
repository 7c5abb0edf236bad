"""Which runs trained on a document stays answerable after the manifest's clean shards are made
again (another dedup threshold, another decontamination rule): what each consumed shard held is
kept when the consumption is recorded (`consumed_pieces`), never replaced, and journalled, so a
rebuilt warehouse answers the same."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

from ito_assets.data import lineage, warehouse

MANIFEST = "sha256:" + "d4" * 32
OTHER = "sha256:" + "e5" * 32
OLD, NEW = "a" * 64, "b" * 64


def _clean(path: Path, manifest: str, placed: dict[str, list[str]]) -> None:
    """The rows the sources and clean stages write, for documents d1 and d2 and clean shards
    named by digest holding the given ones (the others removed as duplicates)."""
    docs = [d for ids in placed.values() for d in ids]
    inputs = ["d1", "d2"]
    lineage.write_tables(path, manifest, {
        "documents": pl.DataFrame({"doc_id": inputs, "source_record_id": [f"r-{d}" for d in inputs], "source_index": [0, 0],
                                   "row": [0, 1]}),
        "decisions": pl.DataFrame({"doc_id": inputs, "state": ["kept" if d in docs else "duplicate" for d in inputs]}),
        "clean_shards": pl.DataFrame({"shard_path": [f"{sha[:4]}.parquet" for sha in placed], "shard_sha256": list(placed),
                                      "num_rows": [len(ids) for ids in placed.values()]}),
        "clean_pieces": pl.DataFrame({"doc_id": docs, "piece": pl.Series([None] * len(docs), dtype=pl.Int32),
                                      "shard_path": [f"{sha[:4]}.parquet" for sha, ids in placed.items() for _ in ids],
                                      "shard_sha256": [sha for sha, ids in placed.items() for _ in ids]}),
    })


def _consumers(path: Path, manifest: str, doc_id: str) -> tuple[list[str], list[str]]:
    """(runs of the document, runs of the manifest), as `ito audit` reads them."""
    with warehouse.connect(path, read_only=True) as con:
        (entry,) = [e for e in lineage.audit_document(con, doc_id) if e["manifest_digest"] == manifest]
        report = lineage.audit_manifest(con, manifest)
    return [c["run_id"] for c in entry["consumed_by"]], [c["run_id"] for c in report["consumed_by"]]


def test_a_document_keeps_its_consumer_after_the_clean_shards_are_made_again(tmp_path: Path) -> None:
    path = tmp_path / "warehouse.duckdb"
    _clean(path, MANIFEST, {OLD: ["d1", "d2"]})
    lineage.record_consumption(path, [OLD], "run_R", "training_tokens", MANIFEST)
    assert _consumers(path, MANIFEST, "d1") == (["run_R"], ["run_R"])
    _clean(path, MANIFEST, {NEW: ["d1"]})  # another threshold: d2 removed, d1 in a new shard
    assert _consumers(path, MANIFEST, "d1") == (["run_R"], ["run_R"])
    assert _consumers(path, MANIFEST, "d2")[0] == ["run_R"]
    lineage.record_consumption(path, [NEW], "run_S", "training_tokens", MANIFEST)
    assert _consumers(path, MANIFEST, "d1") == (["run_R", "run_S"], ["run_R", "run_S"])
    assert _consumers(path, MANIFEST, "d2")[0] == ["run_R"]  # never in the shard run_S read


def test_another_manifest_over_the_same_shard_is_not_answered_by_this_ones_run(tmp_path: Path) -> None:
    path = tmp_path / "warehouse.duckdb"
    _clean(path, MANIFEST, {OLD: ["d1"]})
    _clean(path, OTHER, {OLD: ["d1"]})  # the same files: the same shard bytes
    lineage.record_consumption(path, [OLD], "run_R", "training_tokens", MANIFEST)
    _clean(path, MANIFEST, {NEW: ["d1"]})
    assert _consumers(path, MANIFEST, "d1") == (["run_R"], ["run_R"])
    assert _consumers(path, OTHER, "d1") == ([], [])


def test_a_repeated_record_adds_no_rows_and_the_kept_rows_are_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "warehouse.duckdb"
    _clean(path, MANIFEST, {OLD: ["d1", "d2"]})
    for run in ("run_R", "run_R", "run_S"):
        lineage.record_consumption(path, [OLD, OLD], run, "training_tokens", MANIFEST)
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT doc_id FROM consumed_pieces ORDER BY 1").fetchall() == [("d1",), ("d2",)]
    with warehouse.connect(path) as con:
        try:
            lineage.replace_rows(con, "consumed_pieces", MANIFEST, pl.DataFrame({"doc_id": ["x"]}))
        except ValueError as error:
            assert "not keyed by manifest" in str(error)
        else:
            raise AssertionError("consumed_pieces was replaced")


def test_a_shard_the_warehouse_never_placed_keeps_no_pieces_but_its_consumption(tmp_path: Path) -> None:
    path = tmp_path / "warehouse.duckdb"
    _clean(path, MANIFEST, {OLD: ["d1"]})
    lineage.record_consumption(path, [NEW], "run_R", "training_tokens", MANIFEST)
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM consumed_pieces").fetchone() == (0,)
    assert _consumers(path, MANIFEST, "d1") == ([], ["run_R"])  # the manifest's consumption stands


def test_a_rebuilt_warehouse_still_answers_who_consumed_a_document(tmp_path: Path) -> None:
    path = tmp_path / "warehouse.duckdb"
    _clean(path, MANIFEST, {OLD: ["d1"]})
    lineage.record_consumption(path, [OLD], "run_R", "training_tokens", MANIFEST)
    _clean(path, MANIFEST, {NEW: ["d1"]})
    path.unlink()
    warehouse.connect(path).close()  # a writer's open: rebuilt from the journal
    assert _consumers(path, MANIFEST, "d1") == (["run_R"], ["run_R"])
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT shard_sha256, doc_id FROM consumed_pieces").fetchall() == [(OLD, "d1")]
