"""The per-(account, manifest) budget rows that serialize trains of one manifest across its
bookings, and a statement-level trigger that refuses TRUNCATE of the audit trail on PostgreSQL
(the row trigger of 0001 never sees a TRUNCATE).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("manifest_digest", sa.String(length=71), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.account_id"]),
        sa.PrimaryKeyConstraint("account_id", "manifest_digest"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events "
                   "FOR EACH STATEMENT EXECUTE FUNCTION ito_audit_append_only()")


def downgrade() -> None:
    raise RuntimeError("the ledger is never downgraded (its audit trail is append-only): restore a backup")
