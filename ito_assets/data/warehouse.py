"""The DuckDB warehouse as a file: opening it, telling busy from corrupt, the lineage journal of
every write, and rebuilding a corrupt warehouse from that journal. Its tables and the audit
queries over them are in `ito_assets.data.lineage`.

The warehouse is derived: every write is first recorded in its lineage journal, `<name>.lineage/`
beside it (per manifest and table: the Parquet files the rows are read from, with their sha256;
rows that exist only in memory are written there as Parquet first). A warehouse that DuckDB cannot
open or read because it is corrupt is rebuilt from the journal, with a logged warning, when every
file it names verifies; otherwise it is refused (WAREHOUSE_CORRUPT) with the one-line fix. A
warehouse deleted by hand is rebuilt from the records that verify when it is next written (the
others are moved aside to the journal's `quarantine/` folder, never deleted, with a warning naming
the asset that writes them again). A read-only open (`ito audit`) rebuilds nothing: a missing or
corrupt warehouse is refused with its code, and the next data step rebuilds it. A lock held by a
writer is WAREHOUSE_BUSY; a full disk is STORAGE_FULL, the transaction rolled back; a write that
needs more than the warehouse's memory cap is WAREHOUSE_OUT_OF_MEMORY, rolled back too.

The warehouse and its journal hold the lineage of the user's corpus, so they are its owner's
alone: the file, its `.wal` and its `.corrupt` copy 0600, the journal's folders 0700 and its files
0600.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

import duckdb
import polars as pl

# lineage imports this module too; each uses the other's names only when called.
from ito_assets.data import lineage, shards
from ito_assets.data.config import MIN_MB_PER_DUCKDB_THREAD
from ito_assets.data.shards import Shard, shard_problem, store_name, writing
from ito_assets.errors import disk_full, storage_full
from ito_assets.digests import Digest, file_sha256, short_key
from ito_assets.errors import ErrorCode, ItoError

LOG = logging.getLogger(__name__)

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
    "paraphrase_candidates": ("contamination_report",),
    "eval_items": ("contamination_report",),
    "decisions": ("clean_shards",),
    "clean_shards": ("clean_shards",),
    "clean_pieces": ("clean_shards",),
    "shard_consumers": ("training_tokens",),
    "consumed_pieces": ("training_tokens",),
}
CONSUMERS = "shard_consumers"  # the journal's folder of consumption records
CONSUMED_PIECES = "consumed_pieces"  # the journal's folder of what each consumed shard held
# Where a rebuild moves the journal records it could not replay (a file missing or changed, even
# for a moment): kept for a person to restore or delete, never read back by a rebuild.
QUARANTINE = "quarantine"
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


def refused(error: BaseException, path: Path) -> BaseException:
    """The user-facing error for a DuckDB failure on the warehouse (or the error itself)."""
    if disk_full(error):
        return storage_full(f"the warehouse {path.name}")
    if is_busy(error):
        return ItoError(ErrorCode.WAREHOUSE_BUSY, "the warehouse is being written by a running step; retry shortly", retryable=True)
    if is_corrupt(error):
        return ItoError(ErrorCode.WAREHOUSE_CORRUPT, f"the warehouse {path.name} is unreadable even as rebuilt from its lineage; one-line fix: delete {path.name} and re-materialize the data assets of every manifest")
    if isinstance(error, duckdb.OutOfMemoryException):
        # The cap is fixed, so the same write fails again: not retryable as it is.
        return ItoError(ErrorCode.WAREHOUSE_OUT_OF_MEMORY, f"the warehouse {path.name} ran out of its {MEMORY_LIMIT_MB} MB "
                        "memory cap while writing lineage rows; the write was rolled back")
    return error


def not_rebuilt_by_a_reader(path: Path, error: BaseException) -> ItoError:
    """A corrupt warehouse found by a read-only connection, which rebuilds nothing (a rebuild
    writes the file and sets aside the journal records that do not verify at that moment): the
    journal is verified, read only, to name the way out, as a rebuild would."""
    name = path.name
    why = str(error).replace(str(path), name)
    _, _, problems = _records(path)
    if problems:
        detail, assets = _fix(path, problems)
        return ItoError(ErrorCode.WAREHOUSE_CORRUPT, f"the warehouse {name} is corrupt ({why}) and its lineage is incomplete: "
                        f"{detail}; one-line fix: delete {name} and re-materialize {assets}")
    return ItoError(ErrorCode.WAREHOUSE_CORRUPT,
                    f"the warehouse {name} is corrupt ({why}) and a read-only open does not rebuild it; the next data "
                    "step rebuilds it from its lineage journal (materialize source_documents for any manifest partition, "
                    "or make run), then read again")


def journal_folder(path: Path) -> Path:
    """The warehouse's lineage journal: `warehouse.lineage/` beside `warehouse.duckdb`."""
    return path.with_suffix(".lineage")


# Owner-only files. Only a regular file is changed: a link to a device (the tests' /dev/full)
# keeps its mode, and so does a file of another user (ours to read, not to change).


def _tighten(fd: int) -> None:
    if stat.S_ISREG(os.fstat(fd).st_mode):
        with contextlib.suppress(PermissionError):
            os.fchmod(fd, 0o600)


def _owner_only(path: Path) -> None:
    """An existing file made 0600; absent or unopenable, left to DuckDB's open to report."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        _tighten(fd)
    finally:
        os.close(fd)


def _private_folder(folder: Path) -> None:
    folder.mkdir(mode=0o700, exist_ok=True)
    with contextlib.suppress(PermissionError):
        os.chmod(folder, 0o700)  # one made before, or under a looser umask


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _write_private(path: Path, what: str, write: Callable[[Path], object]) -> None:
    """`write(temporary)`, then the temporary renamed to `path`; the temporary is created 0600
    first, and `write` opens it again by name, which keeps that mode."""
    temporary = path.with_name(f".{path.name}.tmp")
    with writing(what, temporary):
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _tighten(fd)  # a stale temporary keeps its old mode otherwise
        finally:
            os.close(fd)
        write(temporary)
        os.replace(temporary, path)


def _wal(path: Path) -> Path:
    return path.with_name(path.name + ".wal")


def _open(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    _owner_only(path)
    con = duckdb.connect(str(path), read_only=read_only, config={"memory_limit": f"{MEMORY_LIMIT_MB}MB", "threads": 1, "preserve_insertion_order": False})
    _owner_only(_wal(path))  # DuckDB creates its log with the umask's mode
    return con


def _create(path: Path) -> None:
    """A new, empty warehouse, its owner's alone from the start. DuckDB refuses an empty file and
    makes its own with the umask's mode, so it is made in a private folder and linked into place:
    a link, unlike a rename, never replaces a warehouse another writer created meanwhile."""
    staging = path.with_name(f".{path.name}.new-{os.getpid()}")
    made = staging / path.name
    with writing(f"the warehouse {path.name}", staging):
        _remove(staging)
        _private_folder(staging)
        _open(made, read_only=False).close()
        _owner_only(made)
        try:
            os.link(made, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links
            if not path.exists():
                os.replace(made, path)
    _remove(staging)


def connect(path: Path, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """The warehouse, rebuilt from its lineage first when DuckDB cannot open it because it is
    corrupt (WAREHOUSE_CORRUPT when the lineage is incomplete), unless `read_only`: a reader
    never writes, so it is refused with WAREHOUSE_CORRUPT and the way out; WAREHOUSE_BUSY while
    another process writes it; STORAGE_FULL when the disk is full."""
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            _rebuilding(path, lambda: _restore_missing(path))
    try:
        return _open(path, read_only)
    except duckdb.Error as error:
        if not is_corrupt(error):
            raise refused(error, path) from None
        if read_only:
            raise not_rebuilt_by_a_reader(path, error) from None
        reason = error
    _rebuilding(path, lambda: rebuild(path, reason))
    try:
        return _open(path, read_only)
    except duckdb.Error as error:
        raise refused(error, path) from None


def _rebuilding(path: Path, work: Callable[[], None]) -> None:
    """A rebuild's DuckDB errors (a replayed record past the memory cap) answered as a write's are."""
    try:
        work()
    except duckdb.Error as error:
        raise refused(error, path) from None


def writing_to(path: Path, work: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
    """work(con) on the warehouse; a file found corrupt only once it is read is rebuilt from the
    lineage and the work done again, once (it replaces rows, so twice is the same as once)."""
    for attempt in (0, 1):
        con = connect(path)
        try:
            result = work(con)
            _owner_only(_wal(path))  # the log the work's commits created
            con.close()  # DuckDB may checkpoint here: a full disk shows now, not later
            return result
        except duckdb.Error as error:
            if attempt or not is_corrupt(error):
                raise refused(error, path) from None
            reason = error
        finally:
            with contextlib.suppress(duckdb.Error):
                con.close()
        rebuild(path, reason)
    raise AssertionError("unreachable")


# The lineage journal. Per manifest and table, `<journal>/<manifest hex>/<table>.json` names the
# Parquet files (path, sha256) and the SQL that give the table's rows; rows that exist only in
# memory are written beside it as `<table>.parquet` first, so that every write, and every
# rebuild, goes through the same read of Parquet. Consumption records are JSON of their own.


def _journal_subfolder(path: Path, name: str) -> Path:
    top = journal_folder(path)
    _private_folder(top)
    _private_folder(top / name)
    return top / name


def _record_folder(path: Path, manifest_digest: str) -> Path:
    try:
        safe = Digest.parse(manifest_digest, bare=True).hex
    except ValueError:  # not a digest: still one folder per name, and no path syntax from it
        safe = hashlib.sha256(manifest_digest.encode()).hexdigest()
    return _journal_subfolder(path, safe)


def _journal_table(frame: pl.DataFrame, path: Path, store: Path) -> Shard:
    """`shards.write_table`, the file 0600."""
    _write_private(path, store_name(path, store), lambda temporary: shards._write_parquet(frame, temporary, compression=shards.COMPRESSION))
    return Shard(path=str(path), sha256=file_sha256(path), num_rows=frame.height, store=str(store))


def journal_rows(path: Path, manifest_digest: str, table: str, rows: pl.DataFrame | lineage.ParquetRows) -> lineage.ParquetRows:
    """Record `rows` in the journal; the rows to insert, as the journal will replay them."""
    folder = _record_folder(path, manifest_digest)
    store = path.parent
    if isinstance(rows, pl.DataFrame):
        columns = lineage.table_columns(table)
        if "recorded_at" in columns and "recorded_at" not in rows.columns:  # a rebuild keeps the time
            # UTC: the column has no zone, and `ito audit` prints it as UTC.
            rows = rows.with_columns(pl.lit(datetime.now(timezone.utc).replace(tzinfo=None)).alias("recorded_at"))
        frame = _journal_table(rows, folder / f"{table}.parquet", store)
        rows = lineage.ParquetRows((frame,), {c: c for c in columns[1:] if c in rows.columns})
    by_file = _journal_table(rows.by_file, folder / f"{table}.by-file.parquet", store) if rows.by_file is not None else None
    body = {"table": table, "manifest_digest": manifest_digest, "files": [asdict(f) for f in rows.files], "columns": rows.columns,
            "where": rows.where, "by_file": asdict(by_file) if by_file else None}
    data = (json.dumps(body, indent=1) + "\n").encode()
    _write_private(folder / f"{table}.json", f"the warehouse's lineage of {table}", lambda temporary: temporary.write_bytes(data))
    return rows


def journal_consumption(path: Path, shard_sha256s: list[str], run_id: str, stage: str, at: datetime,
                        manifest_digest: str) -> None:
    """One record per (run, stage, manifest), its shards merged with what it held (the first time
    kept, as the table keeps the first row)."""
    name = hashlib.sha256(f"{run_id}\0{stage}\0{manifest_digest}".encode()).hexdigest()[:32]
    record = _journal_subfolder(path, CONSUMERS) / (name + ".json")
    rows: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        rows = {sha: first for sha, first in json.loads(record.read_bytes())["rows"]}
    for digest in shard_sha256s:
        rows.setdefault(digest, at.isoformat())
    body = {"run_id": run_id, "stage": stage, "manifest_digest": manifest_digest, "rows": sorted(rows.items())}
    data = (json.dumps(body, indent=1) + "\n").encode()
    _write_private(record, "the warehouse's lineage of shard_consumers", lambda temporary: temporary.write_bytes(data))


def journal_consumed_pieces(path: Path, shard_sha256: str, manifest_digest: str, frame: pl.DataFrame) -> lineage.ParquetRows:
    """Record what a consumed shard held (`frame`: doc_id, piece) as Parquet beside its record;
    the rows to insert, as the journal will replay them. One record per (manifest, shard)."""
    name = hashlib.sha256(f"{manifest_digest}\0{shard_sha256}".encode()).hexdigest()[:32]
    folder = _journal_subfolder(path, CONSUMED_PIECES)
    written = _journal_table(frame, folder / f"{name}.parquet", path.parent)
    rows = lineage.ParquetRows((written,), {c: c for c in frame.columns})
    body = {"table": CONSUMED_PIECES, "manifest_digest": manifest_digest, "shard_sha256": shard_sha256,
            "files": [asdict(written)], "columns": rows.columns, "where": rows.where, "by_file": None}
    data = (json.dumps(body, indent=1) + "\n").encode()
    _write_private(folder / f"{name}.json", "the warehouse's lineage of consumed_pieces", lambda temporary: temporary.write_bytes(data))
    return rows


@dataclass(frozen=True)
class _Record:
    table: str
    manifest_digest: str
    rows: lineage.ParquetRows
    shard_sha256: str = ""  # a consumed_pieces record's shard; "" for a table's record


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
        if file.parent.name == QUARANTINE:
            continue
        name = file.relative_to(folder.parent).as_posix()
        table = digest = ""
        try:
            body = json.loads(file.read_bytes())
            if file.parent.name == CONSUMERS:
                table = CONSUMERS
                consumers += [(sha, body["run_id"], body["stage"], datetime.fromisoformat(at), body.get("manifest_digest"))
                              for sha, at in body["rows"]]  # an earlier record names no manifest
                continue
            table, digest = body["table"], body["manifest_digest"]
            if table not in lineage.SCHEMA:
                raise KeyError(table)
            files = tuple(Shard(**f) for f in body["files"])
            by_file = Shard(**body["by_file"]) if body["by_file"] else None
            found = [p for p in map(shard_problem, (*files, *([by_file] if by_file else []))) if p]
            if found:
                problems.append(_Problem(table, digest, found[0], file))
                continue
            frame = pl.read_parquet(by_file.path) if by_file else None
            rows = lineage.ParquetRows(files, dict(body["columns"]), body["where"], frame)
            records.append(_Record(table, digest, rows, body["shard_sha256"] if table == CONSUMED_PIECES else ""))
        except (OSError, ValueError, KeyError, TypeError):
            problems.append(_Problem(table, digest, f"the lineage record {name} is unreadable", file))
    return records, consumers, problems


def _fix(path: Path, problems: list[_Problem]) -> tuple[str, str]:
    """(what is wrong, in one clause; the assets to materialise again)."""
    assets: list[str] = []
    for problem in problems:
        partition = f" (partition {short_key(problem.manifest_digest)})" if problem.manifest_digest else ""
        for asset in TABLE_ASSETS.get(problem.table, ("the data assets of every manifest",)):
            if asset + partition not in assets:
                assets.append(asset + partition)
    more = f", and {len(problems) - 1} more" if len(problems) > 1 else ""
    return problems[0].detail + more, ", ".join(assets)


def rebuild(path: Path, reason: BaseException | str, *, partial: bool = False, attach: duckdb.DuckDBPyConnection | None = None) -> None:
    """Replace the warehouse by one built from its lineage journal, every file verified first.
    Incomplete lineage: WAREHOUSE_CORRUPT with the fix, or, `partial` (the file was deleted by
    hand, which is that fix), built from the records that verify, the others moved to the
    journal's quarantine folder (`_quarantine`). The
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
    # Built in a private folder: DuckDB creates the file and its log with the umask's mode, and
    # the log holds the replayed rows until the checkpoint.
    staging = path.with_name(f".{name}.rebuild-{os.getpid()}")
    temporary = staging / name
    with writing(f"the warehouse {name}", staging):
        _remove(staging)
        _private_folder(staging)
        con = _open(temporary, read_only=False)
        try:
            lineage.ensure_schema(con)
            for record in records:
                if record.shard_sha256:
                    lineage.insert_consumed_pieces(con, record.shard_sha256, record.manifest_digest, record.rows)
                else:
                    lineage.replace_rows(con, record.table, record.manifest_digest, record.rows)
            lineage.insert_consumers(con, consumers)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        _owner_only(temporary)
        if attach is not None:
            alias = f"rebuilt_{next(_ATTACHED)}"
            attach.execute(f"ATTACH '{str(temporary).replace(chr(39), chr(39) * 2)}' AS {alias} (READ_ONLY)")
            attach.execute(f"USE {alias}")
        kept = path.with_name(name + ".corrupt")
        kept.unlink(missing_ok=True)
        if path.exists():
            with contextlib.suppress(OSError):  # kept for inspection where the file system links
                os.link(path, kept)
                _owner_only(kept)
        _wal(path).unlink(missing_ok=True)
        os.replace(temporary, path)
    _remove(staging)
    state = "missing" if partial else f"corrupt ({why})"
    tables = [r for r in records if not r.shard_sha256]
    manifests = len({r.manifest_digest for r in tables})
    kept_note = f"; the unreadable file is kept as {kept.name}" if kept.exists() else ""
    if problems:
        aside = _quarantine(path, [p.record for p in problems if p.record is not None])
        detail, assets = _fix(path, problems)
        moved = f" (its records moved to {aside})" if aside else ""
        LOG.warning("the warehouse %s was %s; rebuilt from the %d lineage records that verify (%d manifests); left out: %s%s; "
                    "re-materialize %s to restore them", name, state, len(tables), manifests, detail, moved, assets)
    else:
        LOG.warning("the warehouse %s was %s; rebuilt from its lineage: %d records of %d manifests, every file verified%s; "
                    "tables outside the lineage (training_telemetry) are written again when their assets next materialize",
                    name, state, len(tables), manifests, kept_note)


def _quarantine(path: Path, records: list[Path]) -> str:
    """Move journal records a rebuild left out, with the Parquet files written beside them, into
    `<journal>/quarantine/<UTC time>/<their folder>/`: a file missing only for a moment (a
    remounted disk, a restore in progress) must not cost its lineage. The folder, as the warning
    names it; "" when there was none to move."""
    if not records:
        return ""
    top = journal_folder(path)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    aside = top / QUARANTINE / stamp
    _private_folder(top / QUARANTINE)
    _private_folder(aside)
    for record in records:
        target = aside / record.parent.name
        _private_folder(target)
        for file in [record, *record.parent.glob(f"{record.stem}.*.parquet"), record.with_suffix(".parquet")]:
            with contextlib.suppress(FileNotFoundError):
                os.replace(file, target / file.name)
    return aside.relative_to(path.parent).as_posix()


def has_journal(path: Path) -> bool:
    """Whether the warehouse at `path` has lineage records to be rebuilt from."""
    folder = journal_folder(path)
    return folder.is_dir() and any(folder.glob("*/*.json"))


def _restore_missing(path: Path) -> None:
    """Before a warehouse is created: the first one starts its journal; one deleted by hand is
    rebuilt from the records that verify."""
    folder = journal_folder(path)
    _wal(path).unlink(missing_ok=True)  # a stale log must not replay into a new file
    if has_journal(path):
        rebuild(path, "missing", partial=True)
    else:
        _private_folder(folder)
        _create(path)
