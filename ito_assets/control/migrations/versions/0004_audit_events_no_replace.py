"""The audit trail refuses an insert that reuses a sequence number (SQLite).

0001's triggers refuse UPDATE and DELETE, but SQLite's `INSERT OR REPLACE` (and `REPLACE INTO`)
resolves the primary-key conflict by deleting the old row without firing a DELETE trigger
(recursive triggers are off by default), so an event could be rewritten in place. A BEFORE INSERT
trigger fires before that conflict is resolved and aborts an insert whose `seq` is already taken;
an ordinary append (its seq given by SQLite, which a BEFORE trigger sees as -1, a value no row
holds: the sequence starts at 1) never matches one. PostgreSQL needs nothing: its
`INSERT ... ON CONFLICT DO UPDATE` is an UPDATE, which 0001's trigger already refuses.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_SQLITE_NO_REPLACE = (
    "CREATE TRIGGER IF NOT EXISTS audit_events_no_replace BEFORE INSERT ON audit_events "
    "WHEN NEW.seq IS NOT NULL AND EXISTS (SELECT 1 FROM audit_events WHERE seq = NEW.seq) "
    "BEGIN SELECT RAISE(ABORT, 'audit_events is append-only'); END"
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute(_SQLITE_NO_REPLACE)


def downgrade() -> None:
    raise RuntimeError("the ledger is never downgraded (its audit trail is append-only): restore a backup")
