"""The SQLite audit trail cannot be rewritten by an insert that reuses a sequence number
(`INSERT OR REPLACE`, `REPLACE INTO`): the conflict's delete fires no DELETE trigger, so only a
BEFORE INSERT trigger stops it. A ledger made before that trigger gains it when it is opened."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from ito_assets.control import audit, migrate
from ito_assets.control.ledger import open_ledger

T0 = 1_790_000_000
REWRITES = [
    "INSERT OR REPLACE INTO audit_events (seq, at, actor, account_id, kind, subject, code, detail) "
    "VALUES (1, 0, NULL, 'acc_1', 'run_succeeded', 'run_1', NULL, '{}')",
    "REPLACE INTO audit_events (seq, at, actor, account_id, kind, subject, code, detail) "
    "VALUES (1, 0, NULL, 'acc_1', 'run_succeeded', 'run_1', NULL, '{}')",
    # A plain insert of a taken seq was refused by the primary key already; it stays refused.
    "INSERT INTO audit_events (seq, at, actor, account_id, kind, subject, code, detail) "
    "VALUES (1, 0, NULL, 'acc_1', 'run_succeeded', 'run_1', NULL, '{}')",
]


def _trail(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT seq, kind, subject, detail FROM audit_events ORDER BY seq").fetchall()


def _ledger_with_one_event(path: Path):
    ledger = open_ledger(f"sqlite:///{path}")
    with ledger.write() as conn:
        audit.record(conn, T0, "run_cancelled", actor="tok_x", account_id="acc_1", subject="run_1", reason="by request")
    return ledger


@pytest.mark.parametrize("sql", REWRITES)
def test_an_insert_reusing_a_seq_is_refused_and_the_event_kept(tmp_path: Path, sql: str) -> None:
    path = tmp_path / "ledger.db"
    ledger = _ledger_with_one_event(path)
    before = _trail(path)
    with sqlite3.connect(path) as db, pytest.raises(sqlite3.DatabaseError):
        db.execute(sql)
    assert _trail(path) == before and [e.kind for e in audit.events(ledger)] == ["run_cancelled"]
    ledger.dispose()


def test_appends_still_work_around_the_trigger(tmp_path: Path) -> None:
    """The next seq (SQLite's own, or one given explicitly above the last) is an append."""
    path = tmp_path / "ledger.db"
    ledger = _ledger_with_one_event(path)
    with ledger.write() as conn:
        audit.record(conn, T0 + 1, "run_created", account_id="acc_1", subject="run_2")
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO audit_events (seq, at, kind, detail) VALUES (3, 0, 'run_running', '{}')")
        db.execute("INSERT OR REPLACE INTO audit_events (seq, at, kind, detail) VALUES (4, 0, 'run_running', '{}')")
    assert [seq for seq, *_ in _trail(path)] == [1, 2, 3, 4]
    ledger.dispose()


def test_a_ledger_at_the_previous_revision_gains_the_trigger_and_keeps_its_events(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        command.upgrade(migrate._config(conn), "0003")
        conn.exec_driver_sql("INSERT INTO audit_events (at, kind, detail) VALUES (0, 'run_created', '{}')")
    engine.dispose()
    with sqlite3.connect(path) as db:  # what 0003 allowed
        db.execute(REWRITES[0].replace("'run_succeeded'", "'run_created'"))
    before = _trail(path)
    ledger = open_ledger(f"sqlite:///{path}")
    with ledger.engine.connect() as conn:
        assert migrate.current(conn) == (migrate.head(),) == ("0004",)
    assert _trail(path) == before
    with sqlite3.connect(path) as db, pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute(REWRITES[0])
    ledger.dispose()
