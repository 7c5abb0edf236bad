"""The ledger as every release before migrations created it (metadata.create_all), triggers included.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_SQLITE_APPEND_ONLY = [
    f"CREATE TRIGGER IF NOT EXISTS audit_events_no_{verb} BEFORE {verb.upper()} ON audit_events "
    "BEGIN SELECT RAISE(ABORT, 'audit_events is append-only'); END"
    for verb in ("update", "delete")
]
_PG_APPEND_ONLY = [
    "CREATE OR REPLACE FUNCTION ito_audit_append_only() RETURNS trigger AS $$ "
    "BEGIN RAISE EXCEPTION 'audit_events is append-only'; END $$ LANGUAGE plpgsql",
    "CREATE TRIGGER audit_events_append_only BEFORE UPDATE OR DELETE ON audit_events "
    "FOR EACH ROW EXECUTE FUNCTION ito_audit_append_only()",
]


def upgrade() -> None:
    op.create_table("accounts",
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("account_id"),
        sa.UniqueConstraint("name")
    )
    op.create_table("audit_events",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.String(length=40), nullable=True),
        sa.Column("account_id", sa.String(length=40), nullable=True),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=128), nullable=True),
        sa.Column("code", sa.String(length=64), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("seq")
    )
    op.create_table("idempotency_keys",
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("account_id", "key")
    )
    op.create_table("manifests",
        sa.Column("digest", sa.String(length=71), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("first_seen_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("digest")
    )
    op.create_table("bookings",
        sa.Column("booking_id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("gpu_type", sa.String(length=64), nullable=False),
        sa.Column("num_gpus", sa.Integer(), nullable=False),
        sa.Column("num_nodes", sa.Integer(), nullable=False),
        sa.Column("topology", sa.String(length=128), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("network", sa.String(length=64), nullable=False),
        sa.Column("starts_at", sa.BigInteger(), nullable=False),
        sa.Column("ends_at", sa.BigInteger(), nullable=False),
        sa.Column("price_per_gpu_hour_cents", sa.BigInteger(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.account_id"], ),
        sa.PrimaryKeyConstraint("booking_id")
    )
    op.create_table("confirmations",
        sa.Column("confirmation_id", sa.String(length=40), nullable=False),
        sa.Column("ref_hash", sa.String(length=64), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("booking_id", sa.String(length=40), nullable=True),
        sa.Column("booking_revision", sa.Integer(), nullable=True),
        sa.Column("manifest_digest", sa.String(length=71), nullable=True),
        sa.Column("target_run_id", sa.String(length=40), nullable=True),
        sa.Column("cost_cents", sa.BigInteger(), nullable=False),
        sa.Column("eligibility", sa.Text(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("approved_by", sa.String(length=40), nullable=True),
        sa.Column("approved_at", sa.BigInteger(), nullable=True),
        sa.Column("consumed_at", sa.BigInteger(), nullable=True),
        sa.Column("consumed_by_run", sa.String(length=40), nullable=True),
        sa.Column("consumed_by_key", sa.String(length=128), nullable=True),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.account_id"], ),
        sa.PrimaryKeyConstraint("confirmation_id"),
        sa.UniqueConstraint("ref_hash")
    )
    op.create_table("identity_tokens",
        sa.Column("token_id", sa.String(length=40), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=True),
        sa.Column("label", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("created_by", sa.String(length=40), nullable=True),
        sa.Column("revoked_at", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.account_id"], ),
        sa.PrimaryKeyConstraint("token_id"),
        sa.UniqueConstraint("token_hash")
    )
    op.create_table("runs",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("booking_id", sa.String(length=40), nullable=False),
        sa.Column("manifest_digest", sa.String(length=71), nullable=False),
        sa.Column("idempotency_key", sa.String(length=128), nullable=False),
        sa.Column("request_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("confirmation_id", sa.String(length=40), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("state_reason", sa.String(length=256), nullable=True),
        sa.Column("dagster_run_id", sa.String(length=64), nullable=True),
        sa.Column("cost_cents", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint_dir", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.Column("finished_at", sa.BigInteger(), nullable=True),
        sa.Column("cleaned_at", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.account_id"], ),
        sa.ForeignKeyConstraint(["booking_id"], ["bookings.booking_id"], ),
        sa.ForeignKeyConstraint(["manifest_digest"], ["manifests.digest"], ),
        sa.PrimaryKeyConstraint("run_id"),
        sa.UniqueConstraint("account_id", "idempotency_key", name="uq_runs_account_key")
    )
    op.create_table("run_checkpoints",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("removed_at", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], ),
        sa.PrimaryKeyConstraint("seq")
    )
    op.create_index(op.f("ix_run_checkpoints_run_id"), "run_checkpoints", ["run_id"], unique=False)
    op.create_table("run_logs",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], ),
        sa.PrimaryKeyConstraint("seq")
    )
    op.create_index(op.f("ix_run_logs_run_id"), "run_logs", ["run_id"], unique=False)
    op.create_table("run_metrics",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], ),
        sa.PrimaryKeyConstraint("seq")
    )
    op.create_index(op.f("ix_run_metrics_run_id"), "run_metrics", ["run_id"], unique=False)
    dialect = op.get_bind().dialect.name
    for statement in {"sqlite": _SQLITE_APPEND_ONLY, "postgresql": _PG_APPEND_ONLY}.get(dialect, []):
        op.execute(statement)


def downgrade() -> None:
    raise RuntimeError("the ledger is never downgraded (its audit trail is append-only): restore a backup")
