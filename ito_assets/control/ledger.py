"""The ledger: SQLAlchemy Core tables and the engine that holds them.

The tables below are the model every query uses; the schema in a database is made and changed
only by the Alembic migrations in control/migrations, which a test keeps identical to this model.

SQLite file by default (WAL; write transactions start with BEGIN IMMEDIATE so two reservations
never interleave), any PostgreSQL URL in production (row locks with SELECT ... FOR UPDATE,
conditional updates and unique constraints). Atomicity is the database's job: no Python lock.
Timestamps are integer seconds since the epoch, UTC: expiry is compared to the second.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sqlite3
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import sqlalchemy as sa
from sqlalchemy import event

from ito_assets.errors import ErrorCode, ItoError

metadata = sa.MetaData()
_Id = sa.String(40)
_Time = sa.BigInteger

accounts = sa.Table(
    "accounts", metadata,
    sa.Column("account_id", _Id, primary_key=True),
    sa.Column("name", sa.String(128), nullable=False, unique=True),
    sa.Column("created_at", _Time, nullable=False),
)

# Only the sha256 of a token is stored; revocation is a timestamp, never a delete (audit).
tokens = sa.Table(
    "identity_tokens", metadata,
    sa.Column("token_id", _Id, primary_key=True),
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("account_id", _Id, sa.ForeignKey("accounts.account_id"), nullable=True),
    sa.Column("label", sa.String(128), nullable=False),
    sa.Column("created_at", _Time, nullable=False),
    sa.Column("created_by", _Id, nullable=True),
    sa.Column("revoked_at", _Time, nullable=True),
)

bookings = sa.Table(
    "bookings", metadata,
    sa.Column("booking_id", _Id, primary_key=True),
    sa.Column("account_id", _Id, sa.ForeignKey("accounts.account_id"), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("gpu_type", sa.String(64), nullable=False),
    sa.Column("num_gpus", sa.Integer, nullable=False),
    sa.Column("num_nodes", sa.Integer, nullable=False),
    sa.Column("topology", sa.String(128), nullable=False),
    sa.Column("region", sa.String(64), nullable=False),
    sa.Column("network", sa.String(64), nullable=False),
    sa.Column("starts_at", _Time, nullable=False),
    sa.Column("ends_at", _Time, nullable=False),
    sa.Column("price_per_gpu_hour_cents", sa.BigInteger, nullable=False),
    # Bumped by every amendment: eligibilities and confirmations carry the revision they saw.
    sa.Column("revision", sa.Integer, nullable=False),
    sa.Column("created_at", _Time, nullable=False),
    sa.Column("updated_at", _Time, nullable=False),
)

confirmations = sa.Table(
    "confirmations", metadata,
    sa.Column("confirmation_id", _Id, primary_key=True),  # non-secret handle for audit trails
    sa.Column("ref_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("account_id", _Id, sa.ForeignKey("accounts.account_id"), nullable=False),
    sa.Column("action", sa.String(16), nullable=False),
    sa.Column("booking_id", _Id, nullable=True),
    sa.Column("booking_revision", sa.Integer, nullable=True),
    sa.Column("manifest_digest", sa.String(71), nullable=True),
    sa.Column("target_run_id", _Id, nullable=True),
    sa.Column("cost_cents", sa.BigInteger, nullable=False),
    sa.Column("eligibility", sa.Text, nullable=True),  # canonical JSON snapshot
    sa.Column("created_at", _Time, nullable=False),
    sa.Column("expires_at", _Time, nullable=False),
    sa.Column("approved_by", _Id, nullable=True),
    sa.Column("approved_at", _Time, nullable=True),
    sa.Column("consumed_at", _Time, nullable=True),
    sa.Column("consumed_by_run", _Id, nullable=True),
    sa.Column("consumed_by_key", sa.String(128), nullable=True),
)

# Content-addressed store of the very manifest bytes a run was created from.
manifests = sa.Table(
    "manifests", metadata,
    sa.Column("digest", sa.String(71), primary_key=True),
    sa.Column("content", sa.LargeBinary, nullable=False),
    sa.Column("size_bytes", sa.Integer, nullable=False),
    sa.Column("first_seen_at", _Time, nullable=False),
)

# One row per (account, manifest): the lock every train of that manifest takes before it sums
# what the manifest has committed, whatever booking it runs on, so two trains on two bookings
# cannot both fit under the cap.
budgets = sa.Table(
    "budgets", metadata,
    sa.Column("account_id", _Id, sa.ForeignKey("accounts.account_id"), primary_key=True),
    sa.Column("manifest_digest", sa.String(71), primary_key=True),
    sa.Column("created_at", _Time, nullable=False),
)

idempotency_keys = sa.Table(
    "idempotency_keys", metadata,
    sa.Column("account_id", _Id, primary_key=True),
    sa.Column("key", sa.String(128), primary_key=True),
    sa.Column("action", sa.String(16), nullable=False),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("run_id", _Id, nullable=True),
    sa.Column("result", sa.Text, nullable=True),  # replayed answer of non-run actions (cleanup)
    sa.Column("created_at", _Time, nullable=False),
)

runs = sa.Table(
    "runs", metadata,
    sa.Column("run_id", _Id, primary_key=True),
    sa.Column("account_id", _Id, sa.ForeignKey("accounts.account_id"), nullable=False),
    sa.Column("booking_id", _Id, sa.ForeignKey("bookings.booking_id"), nullable=False),
    sa.Column("manifest_digest", sa.String(71), sa.ForeignKey("manifests.digest"), nullable=False),
    sa.Column("idempotency_key", sa.String(128), nullable=False),
    sa.Column("request_fingerprint", sa.String(64), nullable=False),
    sa.Column("confirmation_id", _Id, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("state_reason", sa.String(256), nullable=True),
    sa.Column("dagster_run_id", sa.String(64), nullable=True),
    sa.Column("cost_cents", sa.BigInteger, nullable=False),
    sa.Column("checkpoint_dir", sa.Text, nullable=False),
    sa.Column("created_at", _Time, nullable=False),
    sa.Column("updated_at", _Time, nullable=False),
    sa.Column("finished_at", _Time, nullable=True),
    sa.Column("cleaned_at", _Time, nullable=True),
    # Set once, by the move into running: a run that ever started keeps its cost spent, whatever its end.
    sa.Column("started_at", _Time, nullable=True),
    sa.UniqueConstraint("account_id", "idempotency_key", name="uq_runs_account_key"),
)

run_logs = sa.Table(
    "run_logs", metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("run_id", _Id, sa.ForeignKey("runs.run_id"), nullable=False, index=True),
    sa.Column("at", _Time, nullable=False),
    sa.Column("level", sa.String(16), nullable=False),
    sa.Column("message", sa.Text, nullable=False),
)

run_metrics = sa.Table(
    "run_metrics", metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("run_id", _Id, sa.ForeignKey("runs.run_id"), nullable=False, index=True),
    sa.Column("step", sa.BigInteger, nullable=False),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("value", sa.Float, nullable=False),
    sa.Column("at", _Time, nullable=False),
)

run_checkpoints = sa.Table(
    "run_checkpoints", metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("run_id", _Id, sa.ForeignKey("runs.run_id"), nullable=False, index=True),
    sa.Column("step", sa.BigInteger, nullable=False),
    sa.Column("path", sa.Text, nullable=False),  # inside the run's checkpoint_dir
    sa.Column("sha256", sa.String(64), nullable=True),
    sa.Column("size_bytes", sa.BigInteger, nullable=False),
    sa.Column("created_at", _Time, nullable=False),
    sa.Column("removed_at", _Time, nullable=True),
)

audit_events = sa.Table(
    "audit_events", metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("at", _Time, nullable=False),
    sa.Column("actor", _Id, nullable=True),  # token id, never the token
    sa.Column("account_id", _Id, nullable=True),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("subject", sa.String(128), nullable=True),
    sa.Column("code", sa.String(64), nullable=True),
    sa.Column("detail", sa.Text, nullable=False),
)

# Append-only is enforced by the database, so neither a bug nor a direct SQL session can edit
# it: triggers refuse UPDATE and DELETE (and TRUNCATE on PostgreSQL); they are created by the
# migrations (control/migrations/versions), like every table here.


def insert_if_absent(conn: sa.Connection, table: sa.Table, values: dict) -> None:
    """INSERT ... ON CONFLICT DO NOTHING: concurrent writers of the same shared row (a manifest
    copy, a budget row) both succeed, and no unique violation is mistaken for a key race."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    conn.execute(insert(table).values(**values).on_conflict_do_nothing())


def _now() -> int:
    return int(time.time())


@dataclass(frozen=True)
class Ledger:
    """An engine over the ledger tables plus the clock every gate reads (tests inject one)."""

    engine: sa.Engine
    clock: Callable[[], int] = field(default=_now)

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    def now(self) -> int:
        return int(self.clock())

    @contextlib.contextmanager
    def read(self) -> Iterator[sa.Connection]:
        with self.engine.connect() as conn, conn.begin():
            yield conn

    @contextlib.contextmanager
    def write(self) -> Iterator[sa.Connection]:
        """A write transaction. SQLite: BEGIN IMMEDIATE takes the write lock up front, so a
        read-then-write (a reservation) cannot be overtaken by another writer in between."""
        with self.engine.connect() as conn:
            conn.execution_options(ito_immediate=True)
            with conn.begin():
                yield conn

    def dispose(self) -> None:
        self.engine.dispose()


def _sqlite_hooks(engine: sa.Engine, lock_timeout_ms: int) -> None:
    # pysqlite's own transaction handling issues BEGIN lazily and never IMMEDIATE; turn it off and
    # emit BEGIN ourselves (SQLAlchemy documentation, "Serializable isolation / Savepoints").
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        # NORMAL is durable against corruption in WAL mode (sqlite.org/wal.html, "Performance").
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={lock_timeout_ms}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        immediate = conn.get_execution_options().get("ito_immediate", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


@contextlib.contextmanager
def _folder_lock(folder: Path, timeout_s: float) -> Iterator[None]:
    """An flock on the ledger's folder, never on the database file: closing any descriptor of the
    database would drop the POSIX locks SQLite holds on it in this process (sqlite.org, "How To
    Corrupt An SQLite Database File", 2.2). flock and those record locks do not interact on Linux."""
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the ledger folder's set-up lock was held for more than {timeout_s:g} s") from None
                time.sleep(0.01)
        yield
    finally:
        os.close(descriptor)  # releases the flock


# What the state folder (ITO_STATE_DIR) holds besides the ledger (docs/operations.md, "The state
# folder"): a folder of these names alone is the product's own, never a home or a shared folder.
_STATE_FOLDER_ENTRIES = frozenset({"dagster", "warehouse.duckdb", "warehouse.duckdb.wal", "warehouse.lineage",
                                   "shards", "decision", "data-manifests", "tenants", "walkthrough"})


def _tighten_folder(folder: Path, ledger_name: str) -> None:
    """The ledger's folder to 0700, where this user owns it and it holds nothing but the ledger's
    files and the state folder's: a folder made a moment before (by the ledger, or by a caller with
    the default mode), a ledger's own, the state folder. A folder that holds anything else (a home
    folder the URL points into), and a sticky one such as /tmp or a group's setgid one (shared by
    design), keeps the mode its owner chose."""
    info = folder.stat()
    if info.st_uid != os.geteuid() or info.st_mode & 0o077 == 0 or info.st_mode & (stat.S_ISVTX | stat.S_ISGID):
        return
    with os.scandir(folder) as entries:  # stops at the first stranger: a large home folder costs little
        if any(not entry.name.startswith(ledger_name) and entry.name not in _STATE_FOLDER_ENTRIES
               for entry in entries):
            return
    os.chmod(folder, 0o700)


def _prepare_sqlite_file(url: str, timeout_s: float) -> None:
    """The ledger holds token hashes, bookings and the audit trail: its file is 0600, in a folder
    made 0700 (or tightened to it, see _tighten_folder). SQLite gives its -wal and -shm files the
    database file's mode.

    WAL is set here, once, under a lock on the folder: switching a fresh file's journal mode needs
    an exclusive lock that SQLite does not wait for, so processes opening a new ledger at once
    failed with "database is locked". WAL is persistent; later connections find it set."""
    name = url.split("///", 1)[1] if "///" in url else ""
    if not name or name == ":memory:" or name.startswith("file:"):
        return
    path = Path(name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _folder_lock(path.parent, timeout_s):
        _tighten_folder(path.parent, path.name)
        if not path.exists():
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        os.chmod(path, 0o600)  # an older, wider file is tightened
        connection = sqlite3.connect(path, timeout=timeout_s)
        try:
            connection.execute("PRAGMA journal_mode=WAL")
        finally:
            connection.close()
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):  # the last connection to close removes them
            os.chmod(path.with_name(path.name + suffix), 0o600)


def normalize_url(url: str) -> str:
    """`postgresql://` and `postgres://` use psycopg 3, the driver this project installs."""
    return re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", url)


# How long a transaction waits for another's lock before the request is answered "in flight".
# 30 s: far above a reservation's milliseconds, within the client's default wait for one request
# (ITO_TIMEOUT_S, 30 s). `ito serve` takes above 0 to 3600 s (api/server.py LOCK_TIMEOUT_RANGE_S).
DEFAULT_LOCK_TIMEOUT_S = 30.0


def open_ledger(url: str, *, schema: str | None = None, clock: Callable[[], int] | None = None,
                create: bool = True, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Ledger:
    """Open (and by default create) the ledger at `url`. `schema` (PostgreSQL only) isolates a
    ledger in its own schema: tests use one per test so parallel runs never clash."""
    url = normalize_url(url)
    lock_ms = max(1, int(lock_timeout_s * 1000))
    if url.startswith("sqlite"):
        _prepare_sqlite_file(url, lock_timeout_s)
        engine = sa.create_engine(url, connect_args={"timeout": lock_timeout_s, "check_same_thread": False},
                                  pool_size=20, max_overflow=40, pool_timeout=60)
        _sqlite_hooks(engine, lock_ms)
    else:
        options = [f"-c lock_timeout={lock_ms}"]
        if schema is not None:
            if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
                raise ItoError(ErrorCode.USAGE_ERROR, "ITO_LEDGER_SCHEMA must be a lower-case SQL identifier "
                                                      "of at most 63 characters")
            options.append(f"-c search_path={schema}")
        connect_args = {"connect_timeout": 10, "options": " ".join(options)}
        # READ COMMITTED whatever the server's or the role's default: the budget cap's check, under
        # the manifest's lock, must see the runs other trains committed while it waited; a snapshot
        # taken at a transaction's first statement (REPEATABLE READ) misses them, and two trains both
        # fit the cap (measured: 1.5x the cap committed).
        engine = sa.create_engine(url, connect_args=connect_args, pool_size=20, max_overflow=40,
                                  pool_timeout=60, pool_pre_ping=True, isolation_level="READ COMMITTED")
        if schema is not None and create:
            with engine.begin() as conn:
                # IF NOT EXISTS still races on the catalogue's unique index: serialize the creators.
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock(hashtext('ito-ledger-schema:{schema}'))")
                conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    if create:
        from ito_assets.control import migrate

        migrate.upgrade(engine)
    return Ledger(engine=engine, clock=clock or _now)
