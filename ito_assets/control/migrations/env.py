"""Alembic's environment for the ledger: always run on a connection the caller already holds
(control/migrate.py), inside the caller's transaction, so an upgrade commits whole or not at all."""

from __future__ import annotations

from alembic import context

from ito_assets.control.ledger import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("the ledger's migrations run through ito_assets.control.migrate, on an open connection")
context.configure(connection=connection, target_metadata=metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
