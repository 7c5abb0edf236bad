"""Lineage tables in the DuckDB warehouse, the writes that replace their rows, and the queries
auditors run on them. Opening the warehouse, its lineage journal and its rebuild from that journal
are in `ito_assets.data.warehouse`.

Every row carries the manifest digest, so one warehouse holds many manifests; each writing step
replaces its own rows for its manifest in one transaction (a rerun never duplicates). Tables:

    manifests          manifest_digest, manifest_key, name, eval_suite_id, eval_suite_digest, ...
    sources            one row per data reference: uri, sha256, licence, format, normalisation,
                       its documents and the records skipped for an empty text (not documents)
    documents          one row per input document: id, provenance, length, source shard
    duplicates         removed duplicate -> kept document, cluster id, family id, method, similarity
    contamination_hits document x eval item: view, matched n-gram, offsets, overlap, action
                       (every input document is scanned, duplicates too)
    paraphrase_candidates  document window x eval item by embedding similarity: for review, never
                       removed (only when the run asked for them)
    eval_items         every item of the suite a manifest was decontaminated against, matched or not
    decisions          final state of every input document (kept / duplicate / contaminated)
Wherever a document id is, the user's own id (`source_record_id`) is beside it.
    clean_shards       clean shard path, sha256, rows
    clean_pieces       which clean shard holds each kept document or piece
    shard_consumers    which later run consumed a clean shard (written by the training stage)
    consumed_pieces    the documents and pieces a consumed clean shard held, kept from
                       clean_pieces when the consumption is recorded and never replaced

Every write is recorded in the warehouse's lineage journal before its rows are replaced, and an
audit that finds the warehouse corrupt as it reads it is answered from the warehouse rebuilt.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

import duckdb
import polars as pl

from ito_assets import digests
# warehouse imports this module too; each uses the other's names only when called.
from ito_assets.data import warehouse
from ito_assets.data.scratch import sql_list
from ito_assets.data.shards import Shard
from ito_assets.errors import ErrorCode, ItoError

T = TypeVar("T")

SCHEMA = {
    "manifests": "manifest_digest VARCHAR, manifest_key VARCHAR, name VARCHAR, eval_suite_id VARCHAR, "
    "eval_suite_digest VARCHAR, config JSON, recorded_at TIMESTAMP DEFAULT current_timestamp",
    "sources": "manifest_digest VARCHAR, source_index INTEGER, uri VARCHAR, sha256 VARCHAR, license VARCHAR, "
    "format VARCHAR, num_documents BIGINT, num_bytes BIGINT, normalization VARCHAR, num_empty_skipped BIGINT",
    "documents": "manifest_digest VARCHAR, doc_id VARCHAR, source_index INTEGER, source_uri VARCHAR, "
    "source_sha256 VARCHAR, license VARCHAR, row BIGINT, source_record_id VARCHAR, num_chars BIGINT, shard_path VARCHAR",
    "duplicates": "manifest_digest VARCHAR, doc_id VARCHAR, method VARCHAR, duplicate_of VARCHAR, cluster_id VARCHAR, "
    "similarity DOUBLE, exact_copy_of VARCHAR, source_record_id VARCHAR, family_id VARCHAR",
    "contamination_hits": "manifest_digest VARCHAR, doc_id VARCHAR, eval_item_id VARCHAR, benchmark VARCHAR, view VARCHAR, "
    "matched_ngram VARCHAR, char_start BIGINT, char_end BIGINT, covered_words INTEGER, view_words INTEGER, "
    "overlap_ratio DOUBLE, action VARCHAR, eval_suite_digest VARCHAR, source_record_id VARCHAR",
    "paraphrase_candidates": "manifest_digest VARCHAR, doc_id VARCHAR, source_record_id VARCHAR, eval_item_id VARCHAR, "
    "benchmark VARCHAR, view VARCHAR, char_start BIGINT, char_end BIGINT, similarity DOUBLE, excerpt VARCHAR",
    "decisions": "manifest_digest VARCHAR, doc_id VARCHAR, state VARCHAR, method VARCHAR, duplicate_of VARCHAR, "
    "cluster_id VARCHAR, similarity DOUBLE, eval_item_ids VARCHAR[], action VARCHAR, num_pieces INTEGER, "
    "source_record_id VARCHAR, family_id VARCHAR",
    "clean_shards": "manifest_digest VARCHAR, shard_path VARCHAR, shard_sha256 VARCHAR, num_rows BIGINT",
    "clean_pieces": "manifest_digest VARCHAR, doc_id VARCHAR, piece INTEGER, char_start BIGINT, char_end BIGINT, "
    "shard_path VARCHAR, shard_sha256 VARCHAR",
    # manifest_digest: whose clean shard the run read (two manifests over the same files write the
    # same bytes); NULL in a row recorded before it was kept.
    "shard_consumers": "shard_sha256 VARCHAR, run_id VARCHAR, stage VARCHAR, consumed_at TIMESTAMP, manifest_digest VARCHAR",
    # What each consumed clean shard held, kept when its consumption is recorded: clean_pieces is
    # replaced whenever the clean shards are made again (another dedup or decontamination
    # setting), and a run's documents must stay answerable after that. Keyed by shard, not by
    # manifest, so that `replace_rows` refuses it: rows are only ever added.
    "consumed_pieces": "shard_sha256 VARCHAR, manifest_digest VARCHAR, doc_id VARCHAR, piece INTEGER",
    # Every item of the suite a manifest was decontaminated against, matched or not: an audit of
    # an item tells "no document matched it" from "no such item", and from "never looked for" (no
    # view long enough to index: `looked_for` false; NULL where a warehouse predates it).
    "eval_items": "manifest_digest VARCHAR, eval_item_id VARCHAR, benchmark VARCHAR, looked_for BOOLEAN",
}


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    """The tables, and in a warehouse written by an earlier version the columns added since
    (new columns go at the end of a table, so an old table gains exactly those)."""
    for table, columns in SCHEMA.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({columns})")
        for column in columns.split(", "):
            con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column}")


def table_columns(table: str) -> list[str]:
    return [c.split()[0] for c in SCHEMA[table].split(", ")]


@dataclass(frozen=True)
class ParquetRows:
    """Rows that DuckDB reads from Parquet files itself, under the warehouse's cap: inserting a
    polars stream of every document's row held ~110 MB more at 128x the fixtures
    (benchmarks/data_scaling.py). `columns` maps a table column to a SQL expression over the
    files' columns and `filename` (the path as given); `where` filters; `by_file`, a small frame
    with a `filename` column, adds per-file values. The files carry their digests: the lineage
    journal records them, and a rebuild reads only files that still hash to them."""

    files: tuple[Shard, ...]
    columns: dict[str, str]
    where: str = "TRUE"
    by_file: pl.DataFrame | None = None

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    def select(self, present: list[str]) -> str:
        exprs = ", ".join(self.columns[c] for c in present)
        joined = " JOIN by_file USING (filename)" if self.by_file is not None else ""
        return f"SELECT ?, {exprs} FROM read_parquet({sql_list(list(self.paths))}, filename = true){joined} WHERE {self.where}"


def replace_rows(con: duckdb.DuckDBPyConnection, table: str, manifest_digest: str, rows: pl.DataFrame | ParquetRows) -> int:
    """Replace `table`'s rows of one manifest with `rows` (its columns minus manifest_digest, in
    any order) in one transaction."""
    columns = table_columns(table)
    if columns[0] != "manifest_digest":
        raise ValueError(f"table {table} is not keyed by manifest")
    present = [c for c in columns[1:] if c in rows.columns]
    names = ", ".join(present)
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"DELETE FROM {table} WHERE manifest_digest = ?", [manifest_digest])
        if isinstance(rows, ParquetRows):
            if rows.by_file is not None:
                con.register("by_file", rows.by_file)
            con.execute(f"INSERT INTO {table} (manifest_digest, {names}) {rows.select(present)}", [manifest_digest])
        else:
            con.register("incoming", rows.select(present).to_arrow())
            con.execute(f"INSERT INTO {table} (manifest_digest, {names}) SELECT ?, {names} FROM incoming", [manifest_digest])
        con.execute("COMMIT")
    except Exception:
        # A failed COMMIT (a full disk) has already ended the transaction: its error is the one to see.
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    finally:
        for name in ("incoming", "by_file"):
            with contextlib.suppress(duckdb.Error):
                con.unregister(name)
    return con.execute(f"SELECT count(*) FROM {table} WHERE manifest_digest = ?", [manifest_digest]).fetchone()[0]


def write_tables(path: Path, manifest_digest: str, tables: dict[str, pl.DataFrame | ParquetRows]) -> dict[str, int]:
    """Open the warehouse, make sure the tables exist, record the rows in the lineage journal,
    replace the given tables' rows."""

    def work(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
        ensure_schema(con)
        journaled = {table: warehouse.journal_rows(path, manifest_digest, table, rows) for table, rows in tables.items()}
        return {table: replace_rows(con, table, manifest_digest, rows) for table, rows in journaled.items()}

    return warehouse.writing_to(path, work)


def decontamination_record(path: Path, manifest_digest: str) -> dict:
    """What the manifests row holds of the manifest's decontamination (its suite and its
    `decontam.*` settings), so that the sources step, which writes that row again, keeps them: the
    hits and decisions in the warehouse still come from that suite. Empty where none ran."""

    def work(con: duckdb.DuckDBPyConnection) -> dict:
        ensure_schema(con)
        row = con.execute("SELECT eval_suite_id, eval_suite_digest, config FROM manifests WHERE manifest_digest = ?",
                          [manifest_digest]).fetchone()
        if row is None or row[0] is None:
            return {}
        config = {k: v for k, v in json.loads(row[2] or "{}").items() if k.startswith("decontam.")}
        return {"eval_suite_id": row[0], "eval_suite_digest": row[1], "config": config}

    return warehouse.writing_to(path, work)


def insert_consumers(con: duckdb.DuckDBPyConnection, rows: list[tuple]) -> None:
    con.execute("BEGIN TRANSACTION")
    try:
        for digest, run_id, stage, at, manifest in rows:
            con.execute(
                "INSERT INTO shard_consumers SELECT ?, ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM shard_consumers "
                "WHERE shard_sha256 = ? AND run_id = ? AND stage = ? AND manifest_digest IS NOT DISTINCT FROM ?)",
                [digest, run_id, stage, at, manifest, digest, run_id, stage, manifest])
        con.execute("COMMIT")
    except Exception:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise


def insert_consumed_pieces(con: duckdb.DuckDBPyConnection, shard_sha256: str, manifest_digest: str, rows: ParquetRows) -> None:
    """Add what a consumed shard held, once: a shard's rows are fixed by its bytes, so the first
    record stands and a repeated one (another run, a rebuild) adds nothing."""
    present = [c for c in table_columns("consumed_pieces")[2:] if c in rows.columns]
    con.execute("BEGIN TRANSACTION")
    try:
        if not _holds_consumed(con, shard_sha256, manifest_digest):
            exprs = ", ".join(rows.columns[c] for c in present)
            con.execute(f"INSERT INTO consumed_pieces (shard_sha256, manifest_digest, {', '.join(present)}) "
                        f"SELECT ?, ?, {exprs} FROM read_parquet({sql_list(list(rows.paths))}) WHERE {rows.where}",
                        [shard_sha256, manifest_digest])
        con.execute("COMMIT")
    except Exception:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise


def _holds_consumed(con: duckdb.DuckDBPyConnection, shard_sha256: str, manifest_digest: str) -> bool:
    sql = "SELECT 1 FROM consumed_pieces WHERE shard_sha256 = ? AND manifest_digest = ? LIMIT 1"
    return con.execute(sql, [shard_sha256, manifest_digest]).fetchone() is not None


def _keep_consumed_pieces(path: Path, con: duckdb.DuckDBPyConnection, shard_sha256s: list[str], manifest_digest: str) -> None:
    """Copy each consumed shard's rows of clean_pieces into consumed_pieces (journalled first). A
    shard clean_pieces does not hold (its rows replaced before the record) keeps nothing: its
    consumption is still recorded, and an audit of the manifest still finds it."""
    for sha in dict.fromkeys(shard_sha256s):
        if _holds_consumed(con, sha, manifest_digest):
            continue
        frame = con.execute("SELECT DISTINCT doc_id, piece FROM clean_pieces WHERE shard_sha256 = ? AND manifest_digest = ? "
                            "ORDER BY doc_id, piece NULLS FIRST", [sha, manifest_digest]).pl()
        if frame.height:
            insert_consumed_pieces(con, sha, manifest_digest, warehouse.journal_consumed_pieces(path, sha, manifest_digest, frame))


def _reads(query: Callable[..., T]) -> Callable[..., T]:
    """An auditor's query over the caller's connection: when the warehouse turns out corrupt as it
    is read (DuckDB checks each block as it reads it, so a damaged block shows only then), the
    warehouse is rebuilt from its lineage, the connection pointed at it, and the query asked again;
    over a read-only connection it is refused instead (WAREHOUSE_CORRUPT), as a reader writes nothing."""

    @functools.wraps(query)
    def run(con: duckdb.DuckDBPyConnection, *args):
        try:
            return query(con, *args)
        except duckdb.Error as error:
            if not warehouse.is_corrupt(error):
                raise
            reason = error
        path, read_only = _database(con)
        if path is None:
            raise ItoError(ErrorCode.WAREHOUSE_CORRUPT, "the warehouse is corrupt; one-line fix: delete it and re-materialize the data assets of every manifest")
        if read_only:
            raise warehouse.not_rebuilt_by_a_reader(path, reason) from None
        warehouse.rebuild(path, reason, attach=con)
        try:
            return query(con, *args)
        except duckdb.Error as error:
            raise warehouse.refused(error, path) from None

    return run


def _database(con: duckdb.DuckDBPyConnection) -> tuple[Path | None, bool]:
    """(the file the connection reads, whether it was opened read-only)."""
    try:
        row = con.execute("SELECT path, readonly FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    except duckdb.Error:
        return None, False
    return (Path(row[0]) if row and row[0] else None), bool(row and row[1])


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> list[dict]:
    cursor = con.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


@_reads
def audit_document(con: duckdb.DuckDBPyConnection, wanted: str) -> list[dict]:
    """Where a document came from, what happened to it and why, where it went — per manifest
    and source. `wanted` is the internal document id or the user's own record id (the id field
    of their input): every document either matches, with `matched_by` saying which."""
    found = _rows(
        con,
        "SELECT CASE WHEN d.doc_id = $1 THEN 'doc_id' ELSE 'source_record_id' END AS matched_by, "
        "d.manifest_digest, d.doc_id, d.source_uri, d.source_sha256, d.license, d.row, d.source_record_id, "
        "d.num_chars, x.state, x.method, x.duplicate_of, k.source_record_id AS duplicate_of_record_id, x.cluster_id, "
        "x.family_id, x.similarity, x.eval_item_ids, x.action, x.num_pieces, m.eval_suite_id, m.eval_suite_digest, "
        "CASE WHEN x.method = 'near' THEN r.exact_copy_of END AS exact_copy_of "
        "FROM documents d LEFT JOIN decisions x USING (manifest_digest, doc_id) "
        "LEFT JOIN manifests m ON m.manifest_digest = d.manifest_digest "
        "LEFT JOIN duplicates r ON r.manifest_digest = d.manifest_digest AND r.doc_id = d.doc_id "
        "LEFT JOIN documents k ON k.manifest_digest = d.manifest_digest AND k.doc_id = x.duplicate_of "
        "WHERE d.doc_id = $1 OR d.source_record_id = $1 ORDER BY d.manifest_digest, d.source_index, d.row",
        [wanted],
    )
    for entry in found:
        params = [entry["manifest_digest"], entry["doc_id"]]
        # Its family: every document linked to it by a chain of verified near-duplicate pairs.
        family = _rows(
            con,
            "SELECT x.doc_id, d.source_record_id, x.state, x.method, x.duplicate_of FROM decisions x "
            "JOIN documents d USING (manifest_digest, doc_id) WHERE x.manifest_digest = ? AND x.family_id = ? "
            "ORDER BY d.source_index, d.row",
            [entry["manifest_digest"], entry["family_id"]],
        )
        entry["family"] = family if len(family) > 1 else []
        entry["contamination_hits"] = _rows(
            con,
            "SELECT eval_item_id, benchmark, view, matched_ngram, char_start, char_end, overlap_ratio, action "
            "FROM contamination_hits WHERE manifest_digest = ? AND doc_id = ? ORDER BY char_start, eval_item_id",
            params,
        )
        entry["stale_reason"] = _stale_reason(entry)
        entry["stale"] = entry["stale_reason"] is not None
        entry["clean_pieces"] = _rows(
            con,
            "SELECT piece, char_start, char_end, shard_path, shard_sha256 FROM clean_pieces "
            "WHERE manifest_digest = ? AND doc_id = ? ORDER BY piece NULLS FIRST",
            params,
        )
        entry["consumed_by"] = _rows(con, _document_consumers(con), params)
    return found


def _stale_reason(entry: dict) -> str | None:
    """Why the document's contamination hits on record are not the ones its decision was made
    from, or None. The decision (what the clean shards follow) names the distinct items of its
    hits and their action; a decontamination run again for the manifest (another eval suite, or
    another rule) replaces the hits, and the decision stays until the clean shards are written again."""
    if entry["state"] is None:
        return None
    hits = entry["contamination_hits"]
    items = sorted({h["eval_item_id"] for h in hits}) or None
    actions = {h["action"] for h in hits}
    decided = sorted(entry["eval_item_ids"]) if entry["eval_item_ids"] else None
    if items == decided and (not hits or actions == {entry["action"]}):
        return None
    suite = "its suite not recorded"
    if entry["eval_suite_id"]:
        suite = f"eval suite {entry['eval_suite_id']} {entry['eval_suite_digest']}"
    return (f"the contamination hits on record ({', '.join(items or []) or 'none'}) come from another decontamination "
            f"({suite}) than the decision ({', '.join(decided or []) or 'no eval item'}), "
            "which the clean shards follow: "
            f"materialize clean_shards again for partition {digests.short_key(entry['manifest_digest'])}")


# A hit agrees with its document's decision when the decision names the item and the same action;
# a decision naming the item with no hit on record for it is the item's too. Either disagreement
# means a decontamination ran again after the decision: `stale`.
_ITEM_ROWS = """
WITH rows AS (
  SELECT h.manifest_digest, h.doc_id, d.source_uri, d.row, d.source_record_id, h.benchmark, h.view,
    h.matched_ngram, h.char_start, h.char_end, h.overlap_ratio, h.action, x.state, x.duplicate_of, h.eval_suite_digest,
    x.state IS NOT NULL
      AND (NOT coalesce(list_contains(x.eval_item_ids, $1), false) OR x.action IS DISTINCT FROM h.action) AS stale,
    d.source_index
  FROM contamination_hits h LEFT JOIN documents d USING (manifest_digest, doc_id)
  LEFT JOIN decisions x USING (manifest_digest, doc_id) WHERE h.eval_item_id = $1
  UNION ALL
  SELECT x.manifest_digest, x.doc_id, d.source_uri, d.row, d.source_record_id, NULL, NULL, NULL, NULL, NULL, NULL,
    x.action, x.state, x.duplicate_of, NULL, TRUE, d.source_index
  FROM decisions x LEFT JOIN documents d USING (manifest_digest, doc_id)
  WHERE list_contains(x.eval_item_ids, $1) AND NOT EXISTS (SELECT 1 FROM contamination_hits h
    WHERE h.manifest_digest = x.manifest_digest AND h.doc_id = x.doc_id AND h.eval_item_id = $1))
SELECT * EXCLUDE (source_index) FROM rows ORDER BY manifest_digest, source_index, row, doc_id, char_start NULLS LAST
"""


@_reads
def audit_eval_item(con: duckdb.DuckDBPyConnection, item_id: str) -> list[dict]:
    """Every document that matched an eval item, duplicates included, with the evidence, the
    action decontamination chose and the document's final state (a duplicate was removed as
    such; its action was never applied). A document whose decision names the item is listed
    even when the hits on record, from a later decontamination, no longer hold it (`stale`)."""
    return _rows(con, _ITEM_ROWS, [item_id])


@_reads
def paraphrase_candidates(con: duckdb.DuckDBPyConnection, item_id: str) -> list[dict]:
    """The possible paraphrases of an eval item, for review: never removed by the pipeline. A
    warehouse that no stage of this version has written yet has no such table: none."""
    if not _has_table(con, "paraphrase_candidates"):
        return []
    return _rows(
        con,
        "SELECT p.manifest_digest, p.doc_id, p.source_record_id, d.source_uri, d.row, p.view, p.similarity, "
        "p.char_start, p.char_end, p.excerpt FROM paraphrase_candidates p LEFT JOIN documents d USING (manifest_digest, doc_id) "
        "WHERE p.eval_item_id = ? ORDER BY p.manifest_digest, p.similarity DESC, p.doc_id",
        [item_id],
    )


def _has_table(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """A warehouse written before a table was added lacks it until a stage writes again."""
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table]).fetchone()[0])


def _has_column(con: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    """A read-only audit of a warehouse written before a column was added sees it missing (a
    writing step adds it, `ensure_schema`)."""
    sql = "SELECT count(*) FROM information_schema.columns WHERE table_name = ? AND column_name = ?"
    return bool(con.execute(sql, [table, column]).fetchone()[0])


def _empty_skipped_column(con: duckdb.DuckDBPyConnection) -> str:
    """`num_empty_skipped`, NULL (not recorded) where the warehouse predates it."""
    return "num_empty_skipped" if _has_column(con, "sources", "num_empty_skipped") else "NULL::BIGINT AS num_empty_skipped"


@_reads
def empty_records_skipped(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Per manifest, the records its sources stage skipped for an empty or whitespace-only text:
    they are not documents, so no audit of a document finds them (their ids are not kept)."""
    if not _has_column(con, "sources", "num_empty_skipped"):
        return {}
    sql = "SELECT manifest_digest, sum(num_empty_skipped) FROM sources GROUP BY 1 HAVING sum(num_empty_skipped) > 0 ORDER BY 1"
    return {digest: int(n) for digest, n in con.execute(sql).fetchall()}


# Why a manifest's decontamination never looked for an item, so that "no document matched"
# says nothing about that manifest's corpus.
TOO_SHORT = "too_short"  # in its suite, but no view long enough to index
NOT_IN_SUITE = "not_in_suite"  # its suite's items are recorded, and this one is not among them
SUITE_NOT_RECORDED = "suite_not_recorded"  # no item of any suite recorded for it (no decontamination, or an older warehouse)


@_reads
def manifests_not_looking_for(con: duckdb.DuckDBPyConnection, item_id: str) -> list[dict]:
    """The manifests whose decontamination did not look for this item, each with why
    (`manifest_digest`, `reason`: TOO_SHORT, NOT_IN_SUITE or SUITE_NOT_RECORDED, `eval_suite_id`).
    A manifest with a hit for the item looked for it, whatever else is recorded."""
    if not _has_table(con, "manifests"):
        return []
    has_items = _has_table(con, "eval_items")
    short = "e.looked_for = false" if has_items and _has_column(con, "eval_items", "looked_for") else "false"
    items = "SELECT manifest_digest, eval_item_id, looked_for FROM eval_items" if has_items else \
        "SELECT NULL::VARCHAR AS manifest_digest, NULL::VARCHAR AS eval_item_id, NULL::BOOLEAN AS looked_for WHERE false"
    hits = "SELECT manifest_digest FROM contamination_hits WHERE eval_item_id = $1 AND manifest_digest IS NOT NULL" if _has_table(con, "contamination_hits") else \
        "SELECT NULL::VARCHAR AS manifest_digest WHERE false"
    sql = f"""
WITH items AS ({items}),
     m AS (SELECT manifest_digest, any_value(eval_suite_id) AS eval_suite_id FROM manifests GROUP BY 1)
SELECT m.manifest_digest, m.eval_suite_id,
  CASE WHEN bool_or(e.eval_item_id = $1 AND {short}) THEN '{TOO_SHORT}'
       WHEN bool_or(e.eval_item_id = $1) THEN NULL
       WHEN count(e.eval_item_id) > 0 THEN '{NOT_IN_SUITE}'
       ELSE '{SUITE_NOT_RECORDED}' END AS reason
FROM m LEFT JOIN items e USING (manifest_digest)
WHERE m.manifest_digest NOT IN ({hits})
GROUP BY ALL HAVING reason IS NOT NULL ORDER BY 1"""
    return [{"manifest_digest": d, "reason": r, "eval_suite_id": suite} for d, suite, r in con.execute(sql, [item_id]).fetchall()]


@_reads
def eval_item_known(con: duckdb.DuckDBPyConnection, item_id: str) -> bool:
    """Whether a suite some manifest was decontaminated against holds this item, or a document
    matched it."""
    tables = [t for t in ("eval_items", "contamination_hits", "paraphrase_candidates") if _has_table(con, t)]
    return any(con.execute(f"SELECT 1 FROM {t} WHERE eval_item_id = ? LIMIT 1", [item_id]).fetchone() for t in tables)


@_reads
def resolve_manifest(con: duckdb.DuckDBPyConnection, digest: str) -> list[str]:
    """Manifest digests matching `sha256:HEX`, a bare hex digest or a prefix (the partition key)."""
    wanted = digest.lower().removeprefix(digests.PREFIX)
    rows = con.execute(
        "SELECT DISTINCT manifest_digest FROM manifests WHERE starts_with(manifest_digest, ?) ORDER BY 1",
        [digests.PREFIX + wanted],
    ).fetchall()
    return [r[0] for r in rows]


REMOVAL_METHODS = ("exact", "near")


def removals_by_method(con: duckdb.DuckDBPyConnection, manifest_digest: str) -> dict[str, int]:
    """The manifest's duplicate removals by method, from the `duplicates` table: the one count that
    the `deduplicated_documents` asset's metadata and `ito audit manifest` both report (the rule
    that classifies a removal is in `dedup.decide`)."""
    sql = "SELECT method, count(*) FROM duplicates WHERE manifest_digest = ? GROUP BY method"
    found = dict(con.execute(sql, [manifest_digest]).fetchall())
    return {method: int(found.get(method, 0)) for method in REMOVAL_METHODS}


def written_removals_by_method(path: Path, manifest_digest: str) -> dict[str, int]:
    """`removals_by_method` as the dedup stage reads it back, once its rows are written."""
    return warehouse.writing_to(path, lambda con: removals_by_method(con, manifest_digest))


def _source_rows(con: duckdb.DuckDBPyConnection, manifest_digest: str) -> list[dict]:
    """The manifest's sources in manifest order, each with its documents and the records skipped
    for an empty text (records read = the two together)."""
    return _rows(con, f"SELECT source_index, uri, sha256, license, format, num_documents, {_empty_skipped_column(con)}, "
                 "normalization FROM sources WHERE manifest_digest = ? ORDER BY source_index", [manifest_digest])


# On its own; inside another query undecorated, so that one read finds the damage and rebuilds.
source_rows = _reads(_source_rows)


# The manifest's documents whose decision (what the clean shards follow) disagrees with the rows
# on record, as `_stale_reason` and _ITEM_ROWS judge one document: its hits name other items or
# another action (a decontamination ran again), or its duplicate row says otherwise (a
# deduplication ran again). No decisions yet (the clean shards not written): nothing to disagree.
_STALE_CONTAMINATION = """
WITH h AS (SELECT doc_id, list_sort(list(DISTINCT eval_item_id)) AS items, list_sort(list(DISTINCT action)) AS actions
           FROM contamination_hits WHERE manifest_digest = $1 GROUP BY doc_id),
     x AS (SELECT doc_id, list_sort(coalesce(eval_item_ids, [])) AS items, action FROM decisions WHERE manifest_digest = $1)
SELECT count(*) FROM x LEFT JOIN h USING (doc_id)
WHERE x.items <> coalesce(h.items, []) OR (h.items IS NOT NULL AND h.actions <> [x.action])
"""
_STALE_DEDUP = """
WITH d AS (SELECT doc_id, method, duplicate_of FROM duplicates WHERE manifest_digest = $1),
     x AS (SELECT doc_id, state, method, duplicate_of FROM decisions WHERE manifest_digest = $1)
SELECT count(*) FROM x FULL JOIN d USING (doc_id)
WHERE EXISTS (SELECT 1 FROM x) AND (x.doc_id IS NULL OR (x.state = 'duplicate') <> (d.doc_id IS NOT NULL)
  OR (d.doc_id IS NOT NULL AND (x.method IS DISTINCT FROM d.method OR x.duplicate_of IS DISTINCT FROM d.duplicate_of)))
"""


def _stale_documents(con: duckdb.DuckDBPyConnection, manifest_digest: str) -> dict[str, int]:
    return {step: int(con.execute(query, [manifest_digest]).fetchone()[0])
            for step, query in (("decontamination", _STALE_CONTAMINATION), ("deduplication", _STALE_DEDUP))}


@_reads
def audit_manifest(con: duckdb.DuckDBPyConnection, manifest_digest: str) -> dict:
    params = [manifest_digest]
    stale = _stale_documents(con, manifest_digest)
    manifest = _rows(con, "SELECT manifest_digest, manifest_key, name, eval_suite_id, eval_suite_digest, recorded_at FROM manifests WHERE manifest_digest = ?", params)
    return {
        "manifest": manifest[0] if manifest else None,
        "sources": _source_rows(con, manifest_digest),
        "states": _rows(con, "SELECT state, coalesce(method, action) AS detail, count(*) AS num_documents FROM decisions WHERE manifest_digest = ? GROUP BY ALL ORDER BY 1, 2", params),
        "removed_by_method": removals_by_method(con, manifest_digest),
        "contamination_by_benchmark": _rows(con, "SELECT benchmark, count(DISTINCT doc_id) AS num_documents, count(DISTINCT eval_item_id) AS num_eval_items FROM contamination_hits WHERE manifest_digest = ? GROUP BY 1 ORDER BY 1", params),
        "clean_shards": _rows(con, "SELECT shard_path, shard_sha256, num_rows FROM clean_shards WHERE manifest_digest = ? ORDER BY shard_path", params),
        "consumed_by": _rows(con, _manifest_consumers(con), params),
        "stale_documents": stale,
        "stale": any(stale.values()),
    }


# Who consumed a document or a manifest. A consumption names the manifest whose clean shard the
# run read; a row recorded before runs named theirs (NULL) counts for every manifest with that
# shard, as it did, and so does every row of a warehouse whose table has no such column yet (an
# audit opens it read-only: nothing adds it there). The shards a document was in are those kept
# when a run consumed them (`consumed_pieces`) and, for a consumption recorded before they were
# kept, the current clean shards: a shard's digest fixes what it holds, so either is exact.


def _named_manifest(con: duckdb.DuckDBPyConnection) -> str:
    if not _has_column(con, "shard_consumers", "manifest_digest"):
        return "TRUE"
    return "(c.manifest_digest = $1 OR c.manifest_digest IS NULL)"


def _document_consumers(con: duckdb.DuckDBPyConnection) -> str:
    shards = ["SELECT shard_sha256 FROM clean_pieces WHERE manifest_digest = $1 AND doc_id = $2"]
    if _has_table(con, "consumed_pieces"):
        shards.append("SELECT shard_sha256 FROM consumed_pieces WHERE manifest_digest = $1 AND doc_id = $2")
    return ("SELECT DISTINCT c.run_id, c.stage, c.consumed_at FROM shard_consumers c "
            f"WHERE {_named_manifest(con)} AND c.shard_sha256 IN ({' UNION '.join(shards)}) ORDER BY c.consumed_at")


def _manifest_consumers(con: duckdb.DuckDBPyConnection) -> str:
    """Every consumption naming the manifest, whichever clean shards it has now; an unnamed one
    where the shard is one of the manifest's, now or when a run consumed it."""
    shards = ["SELECT shard_sha256 FROM clean_shards WHERE manifest_digest = $1"]
    if _has_table(con, "consumed_pieces"):
        shards.append("SELECT shard_sha256 FROM consumed_pieces WHERE manifest_digest = $1")
    in_shards = f"c.shard_sha256 IN ({' UNION '.join(shards)})"
    where = f"({in_shards} AND c.manifest_digest IS NULL) OR c.manifest_digest = $1"
    if not _has_column(con, "shard_consumers", "manifest_digest"):
        where = in_shards
    return f"SELECT DISTINCT c.run_id, c.stage, c.consumed_at FROM shard_consumers c WHERE {where} ORDER BY c.consumed_at"


def record_consumption(path: Path, shard_sha256s: list[str], run_id: str, stage: str, manifest_digest: str) -> int:
    """Which run consumed which clean shards of which manifest (for `ito audit`), and what those
    shards held (`consumed_pieces`, so that the answer survives the clean shards being made again);
    a repeated record is not duplicated. Recorded in the lineage journal too, so that a rebuilt
    warehouse still answers it."""
    # One time for the row and its record, so that a rebuild gives the same answer; UTC (the column
    # has no zone: the machine's local time would read as another moment elsewhere).
    at = datetime.now(timezone.utc).replace(tzinfo=None)

    def work(con: duckdb.DuckDBPyConnection) -> None:
        ensure_schema(con)
        _keep_consumed_pieces(path, con, shard_sha256s, manifest_digest)
        warehouse.journal_consumption(path, shard_sha256s, run_id, stage, at, manifest_digest)
        insert_consumers(con, [(digest, run_id, stage, at, manifest_digest) for digest in shard_sha256s])

    warehouse.writing_to(path, work)
    return len(shard_sha256s)
