"""`runs.started_at`: when a run's training started (its first stage launched). The budget keeps a
run's cost spent once it started, whatever its end (a gate that fails after training no longer
gives its cost back).

Existing rows are backfilled from the append-only audit trail, erring towards the cap: the earliest
`run_running` event of the run (before this revision nothing marked a stage's launch, and a run
that became running may have trained). A run with no such event never started.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column: a plain ALTER TABLE ADD COLUMN on both SQLite and PostgreSQL.
    op.add_column("runs", sa.Column("started_at", sa.BigInteger(), nullable=True))
    op.execute(
        "UPDATE runs SET started_at = (SELECT min(audit_events.at) FROM audit_events "
        "WHERE audit_events.kind = 'run_running' AND audit_events.subject = runs.run_id) "
        "WHERE started_at IS NULL"
    )


def downgrade() -> None:
    raise RuntimeError("the ledger is never downgraded (its audit trail is append-only): restore a backup")
