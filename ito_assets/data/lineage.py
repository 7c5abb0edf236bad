"""Lineage tables in the DuckDB warehouse, and the queries auditors run on them.

Every row carries the manifest digest, so one warehouse holds many manifests; each writing step
replaces its own rows for its manifest in one transaction (a rerun never duplicates). Tables:

    manifests          manifest_digest, manifest_key, name, eval_suite_id, eval_suite_digest, ...
    sources            one row per data reference: uri, sha256, licence, format, normalisation
    documents          one row per input document: id, provenance, length, source shard
    duplicates         removed duplicate -> kept document, cluster id, method, similarity
    contamination_hits document x eval item: view, matched n-gram, offsets, overlap, action
    decisions          final state of every input document (kept / duplicate / contaminated)
    clean_shards       clean shard path, sha256, rows
    clean_pieces       which clean shard holds each kept document or piece
    shard_consumers    which later run consumed a clean shard (written by the training stage)

The warehouse is derived: every write is first recorded in its lineage journal, `<name>.lineage/`
beside it (per manifest and table: the Parquet files the rows are read from, with their sha256;
rows that exist only in memory are written there as Parquet first). A warehouse that DuckDB cannot
open or read because it is corrupt is rebuilt from the journal, with a logged warning, when every
file it names verifies; otherwise it is refused (WAREHOUSE_CORRUPT) with the one-line fix. A
warehouse deleted by hand is rebuilt from the records that verify when it is next written (the
others are dropped, with a warning naming the asset that writes them again). A lock held by a
writer is WAREHOUSE_BUSY; a full disk is STORAGE_FULL, the transaction rolled back.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import duckdb
import polars as pl

from ito_assets.data.config import MIN_MB_PER_DUCKDB_THREAD
from ito_assets.data.scratch import sql_list
from ito_assets.data.shards import Shard, disk_full, shard_problem, storage_full, write_bytes_atomic, write_table, writing
from ito_assets.errors import ErrorCode, ItoError

LOG = logging.getLogger(__name__)

SCHEMA = {
    "manifests": "manifest_digest VARCHAR, manifest_key VARCHAR, name VARCHAR, eval_suite_id VARCHAR, "
    "eval_suite_digest VARCHAR, config JSON, recorded_at TIMESTAMP DEFAULT current_timestamp",
    "sources": "manifest_digest VARCHAR, source_index INTEGER, uri VARCHAR, sha256 VARCHAR, license VARCHAR, "
    "format VARCHAR, num_documents BIGINT, num_bytes BIGINT, normalization VARCHAR",
    "documents": "manifest_digest VARCHAR, doc_id VARCHAR, source_index INTEGER, source_uri VARCHAR, "
    "source_sha256 VARCHAR, license VARCHAR, row BIGINT, source_record_id VARCHAR, num_chars BIGINT, shard_path VARCHAR",
    "duplicates": "manifest_digest VARCHAR, doc_id VARCHAR, method VARCHAR, duplicate_of VARCHAR, cluster_id VARCHAR, "
    "similarity DOUBLE, exact_copy_of VARCHAR",
    "contamination_hits": "manifest_digest VARCHAR, doc_id VARCHAR, eval_item_id VARCHAR, benchmark VARCHAR, view VARCHAR, "
    "matched_ngram VARCHAR, char_start BIGINT, char_end BIGINT, covered_words INTEGER, view_words INTEGER, "
    "overlap_ratio DOUBLE, action VARCHAR, eval_suite_digest VARCHAR",
    "decisions": "manifest_digest VARCHAR, doc_id VARCHAR, state VARCHAR, method VARCHAR, duplicate_of VARCHAR, "
    "cluster_id VARCHAR, similarity DOUBLE, eval_item_ids VARCHAR[], action VARCHAR, num_pieces INTEGER",
    "clean_shards": "manifest_digest VARCHAR, shard_path VARCHAR, shard_sha256 VARCHAR, num_rows BIGINT",
    "clean_pieces": "manifest_digest VARCHAR, doc_id VARCHAR, piece INTEGER, char_start BIGINT, char_end BIGINT, "
    "shard_path VARCHAR, shard_sha256 VARCHAR",
    "shard_consumers": "shard_sha256 VARCHAR, run_id VARCHAR, stage VARCHAR, consumed_at TIMESTAMP",
}


# DuckDB's buffer cap for the warehouse: its default, 80% of RAM, let a write of every
# document's row grow a stage's memory with the corpus (+40 MB from 64x to 128x the fixtures in
# benchmarks/data_scaling.py); capped, the rows go to the database file. DuckDB's floor for one
# thread.
MEMORY_LIMIT_MB = MIN_MB_PER_DUCKDB_THREAD

# The asset(s) whose materialisation writes a table's rows: what a refusal asks to run again.
TABLE_ASSETS = {
    "manifests": ("source_documents", "contamination_report"),
    "sources": ("source_documents",),
    "documents": ("source_documents",),
    "duplicates": ("deduplicated_documents",),
    "contamination_hits": ("contamination_report",),
    "decisions": ("clean_shards",),
    "clean_shards": ("clean_shards",),
    "clean_pieces": ("clean_shards",),
    "shard_consumers": ("training_tokens",),
}
CONSUMERS = "shard_consumers"  # the journal's folder of consumption records
# What DuckDB says of a file it cannot trust (an IOException's text); InternalException and
# SerializationException (a catalog that does not deserialise) count too. A lock held by another
# process is also an IOException, but "Could not set lock": WAREHOUSE_BUSY, never a rebuild.
_CORRUPT_TEXTS = ("not a valid DuckDB database file", "Corrupt database file", "Could not read enough bytes", "checksum")
_ATTACHED = itertools.count()
T = TypeVar("T")


def is_busy(error: BaseException) -> bool:
    return isinstance(error, duckdb.IOException) and "Could not set lock" in str(error)


def is_corrupt(error: BaseException) -> bool:
    if not isinstance(error, duckdb.Error) or disk_full(error) or is_busy(error):
        return False
    if isinstance(error, (duckdb.InternalException, duckdb.SerializationException)):
        return True
    return any(text in str(error) for text in _CORRUPT_TEXTS)


def _refused(error: BaseException, path: Path) -> BaseException:
    """The user-facing error for a DuckDB failure on the warehouse (or the error itself)."""
    if disk_full(error):
        return storage_full(f"the warehouse {path.name}")
    if is_busy(error):
        return ItoError(ErrorCode.WAREHOUSE_BUSY, "the warehouse is being written by a running step; retry shortly", retryable=True)
    if is_corrupt(error):
        return ItoError(ErrorCode.WAREHOUSE_CORRUPT, f"the warehouse {path.name} is unreadable even as rebuilt from its lineage; one-line fix: delete {path.name} and re-materialize the data assets of every manifest")
    return error


def journal_folder(path: Path) -> Path:
    """The warehouse's lineage journal: `warehouse.lineage/` beside `warehouse.duckdb`."""
    return path.with_suffix(".lineage")


def _open(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(path), read_only=read_only, config={"memory_limit": f"{MEMORY_LIMIT_MB}MB", "threads": 1, "preserve_insertion_order": False})


def connect(path: Path, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """The warehouse, rebuilt from its lineage first when DuckDB cannot open it because it is
    corrupt (WAREHOUSE_CORRUPT when the lineage is incomplete); WAREHOUSE_BUSY while another
    process writes it; STORAGE_FULL when the disk is full."""
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            _restore_missing(path)
    try:
        return _open(path, read_only)
    except duckdb.Error as error:
        if not is_corrupt(error):
            raise _refused(error, path) from None
        reason = error
    rebuild(path, reason)
    try:
        return _open(path, read_only)
    except duckdb.Error as error:
        raise _refused(error, path) from None


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    for table, columns in SCHEMA.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({columns})")


def _columns(table: str) -> list[str]:
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
    columns = _columns(table)
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


def _writing_to(path: Path, work: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
    """work(con) on the warehouse; a file found corrupt only once it is read is rebuilt from the
    lineage and the work done again, once (it replaces rows, so twice is the same as once)."""
    for attempt in (0, 1):
        con = connect(path)
        try:
            result = work(con)
            con.close()  # DuckDB may checkpoint here: a full disk shows now, not later
            return result
        except duckdb.Error as error:
            if attempt or not is_corrupt(error):
                raise _refused(error, path) from None
            reason = error
        finally:
            with contextlib.suppress(duckdb.Error):
                con.close()
        rebuild(path, reason)
    raise AssertionError("unreachable")


def write_tables(path: Path, manifest_digest: str, tables: dict[str, pl.DataFrame | ParquetRows]) -> dict[str, int]:
    """Open the warehouse, make sure the tables exist, record the rows in the lineage journal,
    replace the given tables' rows."""

    def work(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
        ensure_schema(con)
        journaled = {table: _journaled(path, manifest_digest, table, rows) for table, rows in tables.items()}
        return {table: replace_rows(con, table, manifest_digest, rows) for table, rows in journaled.items()}

    return _writing_to(path, work)


# The lineage journal. Per manifest and table, `<journal>/<manifest hex>/<table>.json` names the
# Parquet files (path, sha256) and the SQL that give the table's rows; rows that exist only in
# memory are written beside it as `<table>.parquet` first, so that every write, and every
# rebuild, goes through the same read of Parquet. Consumption records are JSON of their own.


def _record_folder(path: Path, manifest_digest: str) -> Path:
    hexdigest = manifest_digest.removeprefix("sha256:")
    safe = hexdigest if len(hexdigest) == 64 and all(c in "0123456789abcdef" for c in hexdigest) else hashlib.sha256(manifest_digest.encode()).hexdigest()
    return journal_folder(path) / safe


def _journaled(path: Path, manifest_digest: str, table: str, rows: pl.DataFrame | ParquetRows) -> ParquetRows:
    """Record `rows` in the journal; the rows to insert, as the journal will replay them."""
    folder = _record_folder(path, manifest_digest)
    store = path.parent
    if isinstance(rows, pl.DataFrame):
        columns = _columns(table)
        if "recorded_at" in columns and "recorded_at" not in rows.columns:  # a rebuild keeps the time
            rows = rows.with_columns(pl.lit(datetime.now()).alias("recorded_at"))
        frame = write_table(rows, folder / f"{table}.parquet", store=store)
        rows = ParquetRows((frame,), {c: c for c in columns[1:] if c in rows.columns})
    by_file = write_table(rows.by_file, folder / f"{table}.by-file.parquet", store=store) if rows.by_file is not None else None
    body = {"table": table, "manifest_digest": manifest_digest, "files": [asdict(f) for f in rows.files], "columns": rows.columns,
            "where": rows.where, "by_file": asdict(by_file) if by_file else None}
    write_bytes_atomic(folder / f"{table}.json", (json.dumps(body, indent=1) + "\n").encode(), what=f"the warehouse's lineage of {table}")
    return rows


@dataclass(frozen=True)
class _Record:
    table: str
    manifest_digest: str
    rows: ParquetRows


@dataclass(frozen=True)
class _Problem:
    table: str  # "" when unknown
    manifest_digest: str  # "" when not per manifest
    detail: str
    record: Path | None = None


def _records(path: Path) -> tuple[list[_Record], list[tuple], list[_Problem]]:
    """The journal's records, each file verified against its digest, its consumption rows, and
    what is missing or does not verify."""
    folder = journal_folder(path)
    if not folder.is_dir():
        return [], [], [_Problem("", "", "no lineage was recorded beside it")]
    records, consumers, problems = [], [], []
    for file in sorted(folder.glob("*/*.json")):
        name = file.relative_to(folder.parent).as_posix()
        table = digest = ""
        try:
            body = json.loads(file.read_bytes())
            if file.parent.name == CONSUMERS:
                table = CONSUMERS
                consumers += [(sha, body["run_id"], body["stage"], datetime.fromisoformat(at)) for sha, at in body["rows"]]
                continue
            table, digest = body["table"], body["manifest_digest"]
            if table not in SCHEMA:
                raise KeyError(table)
            files = tuple(Shard(**f) for f in body["files"])
            by_file = Shard(**body["by_file"]) if body["by_file"] else None
            found = [p for p in map(shard_problem, (*files, *([by_file] if by_file else []))) if p]
            if found:
                problems.append(_Problem(table, digest, found[0], file))
                continue
            frame = pl.read_parquet(by_file.path) if by_file else None
            records.append(_Record(table, digest, ParquetRows(files, dict(body["columns"]), body["where"], frame)))
        except (OSError, ValueError, KeyError, TypeError):
            problems.append(_Problem(table, digest, f"the lineage record {name} is unreadable", file))
    return records, consumers, problems


def _fix(path: Path, problems: list[_Problem]) -> tuple[str, str]:
    """(what is wrong, in one clause; the assets to materialise again)."""
    assets: list[str] = []
    for problem in problems:
        partition = f" (partition {problem.manifest_digest.removeprefix('sha256:')[:12]})" if problem.manifest_digest else ""
        for asset in TABLE_ASSETS.get(problem.table, ("the data assets of every manifest",)):
            if asset + partition not in assets:
                assets.append(asset + partition)
    more = f", and {len(problems) - 1} more" if len(problems) > 1 else ""
    return problems[0].detail + more, ", ".join(assets)


def _insert_consumers(con: duckdb.DuckDBPyConnection, rows: list[tuple]) -> None:
    con.execute("BEGIN TRANSACTION")
    try:
        for digest, run_id, stage, at in rows:
            con.execute(
                "INSERT INTO shard_consumers SELECT ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM shard_consumers "
                "WHERE shard_sha256 = ? AND run_id = ? AND stage = ?)", [digest, run_id, stage, at, digest, run_id, stage])
        con.execute("COMMIT")
    except Exception:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise


def _wal(path: Path) -> Path:
    return path.with_name(path.name + ".wal")


def rebuild(path: Path, reason: BaseException | str, *, partial: bool = False, attach: duckdb.DuckDBPyConnection | None = None) -> None:
    """Replace the warehouse by one built from its lineage journal, every file verified first.
    Incomplete lineage: WAREHOUSE_CORRUPT with the fix, or, `partial` (the file was deleted by
    hand, which is that fix), built from the records that verify, the others forgotten. The
    unreadable file is kept as `<name>.corrupt`. `attach`: a caller's connection, pointed at the
    rebuilt file before it takes the warehouse's name (the same process cannot open that name
    again while the connection to the corrupt file is open)."""
    name = path.name
    why = str(reason).replace(str(path), name)
    records, consumers, problems = _records(path)
    if problems and not partial:
        detail, assets = _fix(path, problems)
        raise ItoError(ErrorCode.WAREHOUSE_CORRUPT, f"the warehouse {name} is corrupt ({why}) and its lineage is incomplete: {detail}; "
                       f"one-line fix: delete {name} and re-materialize {assets}")
    temporary = path.with_name(f".{name}.rebuild-{os.getpid()}")
    with writing(f"the warehouse {name}", temporary, _wal(temporary)):
        temporary.unlink(missing_ok=True)
        _wal(temporary).unlink(missing_ok=True)
        con = _open(temporary, read_only=False)
        try:
            ensure_schema(con)
            for record in records:
                replace_rows(con, record.table, record.manifest_digest, record.rows)
            _insert_consumers(con, consumers)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        if attach is not None:
            alias = f"rebuilt_{next(_ATTACHED)}"
            attach.execute(f"ATTACH '{str(temporary).replace(chr(39), chr(39) * 2)}' AS {alias} (READ_ONLY)")
            attach.execute(f"USE {alias}")
        kept = path.with_name(name + ".corrupt")
        kept.unlink(missing_ok=True)
        if path.exists():
            with contextlib.suppress(OSError):  # kept for inspection where the file system links
                os.link(path, kept)
        _wal(path).unlink(missing_ok=True)
        os.replace(temporary, path)
    state = "missing" if partial else f"corrupt ({why})"
    manifests = len({r.manifest_digest for r in records})
    kept_note = f"; the unreadable file is kept as {kept.name}" if kept.exists() else ""
    if problems:
        for problem in problems:
            if problem.record is not None:
                problem.record.unlink(missing_ok=True)
        detail, assets = _fix(path, problems)
        LOG.warning("the warehouse %s was %s; rebuilt from the %d lineage records that verify (%d manifests); left out: %s; "
                    "re-materialize %s to restore them", name, state, len(records), manifests, detail, assets)
    else:
        LOG.warning("the warehouse %s was %s; rebuilt from its lineage: %d records of %d manifests, every file verified%s; "
                    "tables outside the lineage (training_telemetry) are written again when their assets next materialize",
                    name, state, len(records), manifests, kept_note)


def _restore_missing(path: Path) -> None:
    """Before a warehouse is created: the first one starts its journal; one deleted by hand is
    rebuilt from the records that verify."""
    folder = journal_folder(path)
    _wal(path).unlink(missing_ok=True)  # a stale log must not replay into a new file
    if folder.is_dir() and any(folder.glob("*/*.json")):
        rebuild(path, "missing", partial=True)
    else:
        folder.mkdir(parents=True, exist_ok=True)


def _reads(query: Callable[..., T]) -> Callable[..., T]:
    """An auditor's query over the caller's connection: when the warehouse turns out corrupt as it
    is read (DuckDB checks each block as it reads it, so a damaged block shows only then), the
    warehouse is rebuilt from its lineage, the connection pointed at it, and the query asked again."""

    @functools.wraps(query)
    def run(con: duckdb.DuckDBPyConnection, *args):
        try:
            return query(con, *args)
        except duckdb.Error as error:
            if not is_corrupt(error):
                raise
            reason = error
        path = _database_path(con)
        if path is None:
            raise ItoError(ErrorCode.WAREHOUSE_CORRUPT, "the warehouse is corrupt; one-line fix: delete it and re-materialize the data assets of every manifest")
        rebuild(path, reason, attach=con)
        try:
            return query(con, *args)
        except duckdb.Error as error:
            raise _refused(error, path) from None

    return run


def _database_path(con: duckdb.DuckDBPyConnection) -> Path | None:
    try:
        row = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    except duckdb.Error:
        return None
    return Path(row[0]) if row and row[0] else None


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> list[dict]:
    cursor = con.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


@_reads
def audit_document(con: duckdb.DuckDBPyConnection, doc_id: str) -> list[dict]:
    """Where a document came from, what happened to it and why, where it went — per manifest."""
    found = _rows(
        con,
        "SELECT d.manifest_digest, d.doc_id, d.source_uri, d.source_sha256, d.license, d.row, d.source_record_id, "
        "d.num_chars, x.state, x.method, x.duplicate_of, x.cluster_id, x.similarity, x.eval_item_ids, x.action, "
        "x.num_pieces FROM documents d LEFT JOIN decisions x USING (manifest_digest, doc_id) "
        "WHERE d.doc_id = ? ORDER BY d.manifest_digest",
        [doc_id],
    )
    for entry in found:
        params = [entry["manifest_digest"], doc_id]
        entry["contamination_hits"] = _rows(
            con,
            "SELECT eval_item_id, benchmark, view, matched_ngram, char_start, char_end, overlap_ratio, action "
            "FROM contamination_hits WHERE manifest_digest = ? AND doc_id = ? ORDER BY char_start, eval_item_id",
            params,
        )
        entry["clean_pieces"] = _rows(
            con,
            "SELECT piece, char_start, char_end, shard_path, shard_sha256 FROM clean_pieces "
            "WHERE manifest_digest = ? AND doc_id = ? ORDER BY piece NULLS FIRST",
            params,
        )
        entry["consumed_by"] = _rows(
            con,
            "SELECT DISTINCT c.run_id, c.stage, c.consumed_at FROM clean_pieces p JOIN shard_consumers c "
            "ON c.shard_sha256 = p.shard_sha256 WHERE p.manifest_digest = ? AND p.doc_id = ? ORDER BY c.consumed_at",
            params,
        )
    return found


@_reads
def audit_eval_item(con: duckdb.DuckDBPyConnection, item_id: str) -> list[dict]:
    """Every document that matched an eval item, with the evidence and the action taken."""
    return _rows(
        con,
        "SELECT h.manifest_digest, h.doc_id, d.source_uri, d.row, d.source_record_id, h.benchmark, h.view, "
        "h.matched_ngram, h.char_start, h.char_end, h.overlap_ratio, h.action, h.eval_suite_digest "
        "FROM contamination_hits h LEFT JOIN documents d USING (manifest_digest, doc_id) "
        "WHERE h.eval_item_id = ? ORDER BY h.manifest_digest, d.source_index, d.row",
        [item_id],
    )


@_reads
def resolve_manifest(con: duckdb.DuckDBPyConnection, digest: str) -> list[str]:
    """Manifest digests matching `sha256:HEX`, a bare hex digest or a prefix (the partition key)."""
    wanted = digest.lower().removeprefix("sha256:")
    rows = con.execute(
        "SELECT DISTINCT manifest_digest FROM manifests WHERE starts_with(manifest_digest, ?) ORDER BY 1",
        ["sha256:" + wanted],
    ).fetchall()
    return [r[0] for r in rows]


@_reads
def audit_manifest(con: duckdb.DuckDBPyConnection, manifest_digest: str) -> dict:
    params = [manifest_digest]
    manifest = _rows(con, "SELECT manifest_digest, manifest_key, name, eval_suite_id, eval_suite_digest, recorded_at FROM manifests WHERE manifest_digest = ?", params)
    return {
        "manifest": manifest[0] if manifest else None,
        "sources": _rows(con, "SELECT source_index, uri, sha256, license, format, num_documents, normalization FROM sources WHERE manifest_digest = ? ORDER BY source_index", params),
        "states": _rows(con, "SELECT state, coalesce(method, action) AS detail, count(*) AS num_documents FROM decisions WHERE manifest_digest = ? GROUP BY ALL ORDER BY 1, 2", params),
        "contamination_by_benchmark": _rows(con, "SELECT benchmark, count(DISTINCT doc_id) AS num_documents, count(DISTINCT eval_item_id) AS num_eval_items FROM contamination_hits WHERE manifest_digest = ? GROUP BY 1 ORDER BY 1", params),
        "clean_shards": _rows(con, "SELECT shard_path, shard_sha256, num_rows FROM clean_shards WHERE manifest_digest = ? ORDER BY shard_path", params),
        "consumed_by": _rows(con, "SELECT DISTINCT c.run_id, c.stage, c.consumed_at FROM clean_shards s JOIN shard_consumers c ON c.shard_sha256 = s.shard_sha256 WHERE s.manifest_digest = ? ORDER BY c.consumed_at", params),
    }


def record_consumption(path: Path, shard_sha256s: list[str], run_id: str, stage: str) -> int:
    """Which run consumed which clean shards (for `ito audit`); a repeated record is not duplicated.
    Recorded in the lineage journal too, so that a rebuilt warehouse still answers it."""
    at = datetime.now()  # one time for the row and its record, so that a rebuild gives the same answer

    def work(con: duckdb.DuckDBPyConnection) -> None:
        ensure_schema(con)
        _journal_consumption(path, shard_sha256s, run_id, stage, at)
        _insert_consumers(con, [(digest, run_id, stage, at) for digest in shard_sha256s])

    _writing_to(path, work)
    return len(shard_sha256s)


def _journal_consumption(path: Path, shard_sha256s: list[str], run_id: str, stage: str, at: datetime) -> None:
    """One record per (run, stage), its shards merged with what it held (the first time kept, as
    the table keeps the first row)."""
    record = journal_folder(path) / CONSUMERS / (hashlib.sha256(f"{run_id}\0{stage}".encode()).hexdigest()[:32] + ".json")
    rows: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        rows = {sha: first for sha, first in json.loads(record.read_bytes())["rows"]}
    for digest in shard_sha256s:
        rows.setdefault(digest, at.isoformat())
    body = {"run_id": run_id, "stage": stage, "rows": sorted(rows.items())}
    write_bytes_atomic(record, (json.dumps(body, indent=1) + "\n").encode(), what="the warehouse's lineage of shard_consumers")
