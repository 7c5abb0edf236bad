"""The ledger's schema is made and changed by Alembic only, on SQLite and PostgreSQL.

A ledger created by the release before migrations (the tables of revision 0001, no
`alembic_version`) is upgraded by the first open and keeps every row; a ledger migrated by a
newer release is refused with LEDGER_SCHEMA_TOO_NEW; the migrated schema is the model's.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from gate_world import PG_URL, postgres_reason
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import migrate
from ito_assets.control.ledger import metadata, normalize_url, open_ledger

T0 = 1_790_000_000

# One row in every table of revision 0001, written as that release wrote them (plain SQL).
LEGACY_ROWS = [
    ("accounts", dict(account_id="acc_1", name="lab", created_at=T0)),
    ("identity_tokens", dict(token_id="tok_1", token_hash="a" * 64, role="account", account_id="acc_1",
                             label="ci", created_at=T0, created_by=None, revoked_at=None)),
    ("bookings", dict(booking_id="bkg_1", account_id="acc_1", state="completed", gpu_type="H100", num_gpus=8,
                      num_nodes=1, topology="1x8", region="eu-west", network="ib", starts_at=T0,
                      ends_at=T0 + 7200, price_per_gpu_hour_cents=100, revision=1, created_at=T0, updated_at=T0)),
    ("confirmations", dict(confirmation_id="cfm_1", ref_hash="b" * 64, account_id="acc_1", action="train",
                           booking_id="bkg_1", booking_revision=1, manifest_digest="sha256:" + "c" * 64,
                           target_run_id=None, cost_cents=1600, eligibility="{}", created_at=T0,
                           expires_at=T0 + 600, approved_by="tok_0", approved_at=T0, consumed_at=T0,
                           consumed_by_run="run_1", consumed_by_key="key-0001")),
    ("manifests", dict(digest="sha256:" + "c" * 64, content=b"{}", size_bytes=2, first_seen_at=T0)),
    ("idempotency_keys", dict(account_id="acc_1", key="key-0001", action="train", fingerprint="d" * 64,
                              run_id="run_1", result=None, created_at=T0)),
    ("runs", dict(run_id="run_1", account_id="acc_1", booking_id="bkg_1", manifest_digest="sha256:" + "c" * 64,
                  idempotency_key="key-0001", request_fingerprint="d" * 64, confirmation_id="cfm_1",
                  state="succeeded", state_reason=None, dagster_run_id="dg-1", cost_cents=1600,
                  checkpoint_dir="/tenants/acc_1/run_1", created_at=T0, updated_at=T0, finished_at=T0,
                  cleaned_at=None)),
    ("run_logs", dict(run_id="run_1", at=T0, level="info", message="started")),
    ("run_metrics", dict(run_id="run_1", step=1, name="pretraining/loss", value=3.5, at=T0)),
    ("run_checkpoints", dict(run_id="run_1", step=1, path="step-1", sha256="e" * 64, size_bytes=10,
                             created_at=T0, removed_at=None)),
    ("audit_events", dict(at=T0, actor="tok_0", account_id="acc_1", kind="run_created", subject="run_1",
                          code=None, detail="{}")),
]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine_url(request, tmp_path: Path):
    """(url, schema) of an empty database: a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}", None
        return
    reason = postgres_reason()
    if reason:
        pytest.skip(reason)
    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield PG_URL, schema
    admin = sa.create_engine(normalize_url(PG_URL))
    with admin.begin() as conn:
        conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    admin.dispose()


def _raw_engine(url: str, schema: str | None) -> sa.Engine:
    if schema is None:
        return sa.create_engine(url)
    admin = sa.create_engine(normalize_url(url))
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    admin.dispose()
    return sa.create_engine(normalize_url(url), connect_args={"options": f"-c search_path={schema}"})


def _migrate_to(engine: sa.Engine, revision: str) -> None:
    with engine.begin() as conn:
        command.upgrade(migrate._config(conn), revision)


def _legacy_ledger(url: str, schema: str | None) -> sa.Engine:
    """What the release before migrations left: revision 0001's tables and rows, no version table."""
    engine = _raw_engine(url, schema)
    _migrate_to(engine, "0001")
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE alembic_version")
        tables = sa.MetaData()
        tables.reflect(conn)
        for name, row in LEGACY_ROWS:
            conn.execute(tables.tables[name].insert().values(**row))
    return engine


def _rows(engine: sa.Engine) -> dict[str, list[dict]]:
    tables = sa.MetaData()
    with engine.connect() as conn:
        tables.reflect(conn)
        return {name: [dict(r) for r in conn.execute(sa.select(tables.tables[name])).mappings()]
                for name, _ in LEGACY_ROWS}


def _revision(engine: sa.Engine) -> tuple[str, ...]:
    with engine.connect() as conn:
        return migrate.current(conn)


def test_the_migrated_schema_is_the_model(engine_url) -> None:
    url, schema = engine_url
    ledger = open_ledger(url, schema=schema)
    with ledger.engine.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn), metadata)
    ledger.dispose()
    assert differences == []


def test_a_ledger_from_before_migrations_is_upgraded_and_keeps_every_row(engine_url) -> None:
    url, schema = engine_url
    legacy = _legacy_ledger(url, schema)
    before = _rows(legacy)
    assert all(len(rows) == 1 for rows in before.values())
    ledger = open_ledger(url, schema=schema)
    assert _revision(ledger.engine) == (migrate.head(),)
    after = _rows(ledger.engine)
    # 0003's column is added; no run_running event in that trail, so the run never started.
    assert [row.pop("started_at") for row in after["runs"]] == [None]
    assert after == before
    assert sa.inspect(ledger.engine).has_table("budgets")
    ledger.dispose()
    legacy.dispose()


def test_a_versioned_ledger_at_the_first_revision_is_upgraded(engine_url) -> None:
    url, schema = engine_url
    engine = _raw_engine(url, schema)
    _migrate_to(engine, "0001")
    assert _revision(engine) == ("0001",)
    assert migrate.upgrade(engine) == "0001"
    assert _revision(engine) == (migrate.head(),)
    assert migrate.upgrade(engine) == migrate.head()  # at head: nothing to do
    engine.dispose()


def _insert_run(conn, tables, run_id: str, state: str) -> None:
    row = {**dict(LEGACY_ROWS)["runs"], "run_id": run_id, "state": state, "idempotency_key": f"key-{run_id}"}
    conn.execute(tables.tables["runs"].insert().values(**row))


def test_0003_backfills_started_at_from_the_audit_trails_run_running_events(engine_url) -> None:
    """A ledger at 0002 with runs that did and did not start: started_at is the earliest
    `run_running` event of each run, and None for a run with none (it never started)."""
    url, schema = engine_url
    engine = _raw_engine(url, schema)
    _migrate_to(engine, "0002")
    with engine.begin() as conn:
        tables = sa.MetaData()
        tables.reflect(conn)
        for name in ("accounts", "bookings", "manifests"):
            conn.execute(tables.tables[name].insert().values(**dict(LEGACY_ROWS)[name]))
        for run_id, state in (("run_trained_then_gate", "gate_failed"), ("run_refused_at_start", "gate_failed"),
                              ("run_done", "succeeded"), ("run_live", "running")):
            _insert_run(conn, tables, run_id, state)
        events = [(T0 + 5, "run_running", "run_trained_then_gate"), (T0 + 9, "run_gate_failed", "run_trained_then_gate"),
                  (T0 + 4, "run_gate_failed", "run_refused_at_start"), (T0 + 7, "run_running", "run_done"),
                  (T0 + 3, "run_running", "run_live"), (T0 + 8, "run_running", "run_live"),  # the earliest counts
                  (T0 + 6, "run_running", "bkg_1")]  # another subject: matches no run
        for at, kind, subject in events:
            conn.execute(tables.tables["audit_events"].insert().values(
                at=at, actor=None, account_id="acc_1", kind=kind, subject=subject, code=None, detail="{}"))
    assert migrate.upgrade(engine) == "0002"
    with engine.connect() as conn:
        started = dict(conn.exec_driver_sql("SELECT run_id, started_at FROM runs").all())
    assert started == {"run_trained_then_gate": T0 + 5, "run_refused_at_start": None, "run_done": T0 + 7,
                       "run_live": T0 + 3}
    engine.dispose()


def test_a_ledger_from_a_newer_release_is_refused(engine_url) -> None:
    url, schema = engine_url
    open_ledger(url, schema=schema).dispose()
    engine = _raw_engine(url, schema)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(ItoError) as refused:
        open_ledger(url, schema=schema)
    assert refused.value.code is ErrorCode.LEDGER_SCHEMA_TOO_NEW
    assert _revision(engine) == ("9999",)  # refused, not rewritten
    engine.dispose()


def _open_at_once(url: str, schema: str | None, num_openers: int = 4) -> list:
    """`num_openers` threads open the ledger at `url` behind one barrier and each appends one audit
    event; returns the ledgers (every opener must succeed)."""
    barrier, errors, ledgers = threading.Barrier(num_openers), [], []

    def opener() -> None:
        barrier.wait()
        try:
            ledger = open_ledger(url, schema=schema)
            with ledger.write() as conn:
                conn.exec_driver_sql("INSERT INTO audit_events (at, kind, detail) VALUES (1, 'opened', '{}')")
            ledgers.append(ledger)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(num_openers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(ledgers) == num_openers
    with ledgers[0].read() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM audit_events WHERE kind = 'opened'").scalar() == num_openers
    return ledgers


def test_two_processes_opening_a_fresh_ledger_at_once_both_succeed(engine_url) -> None:
    url, schema = engine_url
    ledgers = _open_at_once(url, schema)
    assert _revision(ledgers[0].engine) == (migrate.head(),)
    for ledger in ledgers:
        ledger.dispose()


def test_many_fresh_sqlite_ledgers_opened_by_racing_openers_all_open_in_wal(tmp_path: Path) -> None:
    # Switching a new file to WAL once failed one opener in about nine races of four; twenty races,
    # each in a folder that does not exist yet, so the folder's creation races too.
    for attempt in range(20):
        ledgers = _open_at_once(f"sqlite:///{tmp_path / f'race-{attempt}' / 'state' / 'ledger.db'}", None)
        with ledgers[0].read() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        for ledger in ledgers:
            ledger.dispose()


@pytest.fixture
def pg_ledger():
    """A migrated ledger in a fresh PostgreSQL schema, dropped afterwards."""
    reason = postgres_reason()
    if reason:
        pytest.skip(reason)
    schema = f"t_{uuid.uuid4().hex[:16]}"
    ledger = open_ledger(PG_URL, schema=schema)
    yield ledger, schema
    with ledger.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
    ledger.dispose()


def _audit_kinds(ledger) -> list[str]:
    with ledger.read() as conn:
        return conn.exec_driver_sql("SELECT kind FROM audit_events").scalars().all()


# SQLite has no TRUNCATE: a DELETE without WHERE is its truncation, and the trigger refuses it.
ERASURES = {"sqlite": ["DELETE FROM audit_events", "UPDATE audit_events SET kind = 'x'"],
            "postgresql": ["TRUNCATE audit_events", "DELETE FROM audit_events", "UPDATE audit_events SET kind = 'x'"]}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_ledger(request, tmp_path: Path):
    if request.param == "postgres":
        yield request.getfixturevalue("pg_ledger")[0]
        return
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    yield ledger
    ledger.dispose()


def test_the_audit_trail_refuses_every_erasure(any_ledger) -> None:
    with any_ledger.write() as conn:
        conn.exec_driver_sql("INSERT INTO audit_events (at, kind, detail) VALUES (1, 'kept', '{}')")
    for statement in ERASURES[any_ledger.engine.dialect.name]:
        with pytest.raises(sa.exc.DBAPIError, match="append-only"):
            with any_ledger.write() as conn:
                conn.exec_driver_sql(statement)
    assert _audit_kinds(any_ledger) == ["kept"]


# The grants docs/operations.md gives a server role that does not own the ledger's tables.
SERVER_ROLE_GRANTS = """
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role};
REVOKE UPDATE, DELETE, TRUNCATE ON {schema}.audit_events FROM {role};
"""


@pytest.mark.postgres
def test_a_server_role_with_the_documented_grants_can_append_but_not_erase_the_audit_trail(pg_ledger) -> None:
    ledger, schema = pg_ledger
    role = f"ito_server_{schema[2:]}"
    with ledger.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} NOLOGIN")
        for statement in filter(str.strip, SERVER_ROLE_GRANTS.format(schema=schema, role=role).split(";")):
            conn.exec_driver_sql(statement)
    try:
        with ledger.engine.begin() as conn:
            conn.exec_driver_sql(f"SET LOCAL ROLE {role}")
            conn.exec_driver_sql("INSERT INTO audit_events (at, kind, detail) VALUES (1, 'kept', '{}')")
        for statement in ("TRUNCATE audit_events", "DELETE FROM audit_events", "UPDATE audit_events SET at = 2"):
            with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
                with ledger.engine.begin() as conn:
                    conn.exec_driver_sql(f"SET LOCAL ROLE {role}")
                    conn.exec_driver_sql(statement)
        assert _audit_kinds(ledger) == ["kept"]
    finally:
        with ledger.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
            conn.exec_driver_sql(f"DROP ROLE {role}")


def test_ito_serve_refuses_to_start_on_a_ledger_from_a_newer_release(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    open_ledger(url).dispose()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    engine.dispose()
    env = {**os.environ, "ITO_LEDGER_URL": url, "ITO_STATE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "ito_assets.api.cli", "serve", "--port", "0", "--json"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    document = json.loads(done.stdout)
    assert document["ok"] is False and document["error"]["code"] == "LEDGER_SCHEMA_TOO_NEW"
    assert "Traceback" not in done.stderr


def test_a_new_sqlite_ledger_is_0600_in_a_0700_folder_and_an_old_one_is_tightened(tmp_path: Path) -> None:
    import os
    import stat

    folder = tmp_path / "state" / "nested"
    ledger = open_ledger(f"sqlite:///{folder / 'ledger.db'}")
    with ledger.write() as conn:  # WAL mode: the -wal and -shm files now exist
        conn.exec_driver_sql("INSERT INTO audit_events (at, kind, detail) VALUES (1, 'x', '{}')")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    assert modes == {"ledger.db": 0o600, "ledger.db-wal": 0o600, "ledger.db-shm": 0o600}
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    with ledger.read() as conn:  # set once at open, persistent, so every later connection has it
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    ledger.dispose()
    old = tmp_path / "old.db"
    old.touch(mode=0o644)
    os.chmod(old, 0o644)
    open_ledger(f"sqlite:///{old}").dispose()
    assert stat.S_IMODE(old.stat().st_mode) == 0o600
