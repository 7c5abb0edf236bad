"""The ledger's schema under Alembic: every open brings it to this release's head.

Run inside one write transaction that first takes the ledger's migration lock (SQLite: BEGIN
IMMEDIATE, the only writer; PostgreSQL: a transaction-scoped advisory lock per schema), so two
processes opening a fresh ledger at once cannot both create it. A ledger made before migrations
existed (tables, no `alembic_version`) is stamped as the first revision and upgraded from there.
A ledger at a revision this release does not know was migrated by a newer release: refused.
"""

from __future__ import annotations

import functools
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from ito_assets.errors import ErrorCode, ItoError

_LOCATION = Path(__file__).with_name("migrations")
_BASELINE = "0001"  # the schema metadata.create_all made before there were migrations


def _config(conn: sa.Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_LOCATION))
    config.attributes["connection"] = conn
    return config


@functools.lru_cache(maxsize=1)
def _script() -> ScriptDirectory:
    config = Config()
    config.set_main_option("script_location", str(_LOCATION))
    return ScriptDirectory.from_config(config)


def head() -> str:
    return _script().get_current_head()


def current(conn: sa.Connection) -> tuple[str, ...]:
    return tuple(MigrationContext.configure(conn).get_current_heads())


def _take_lock(conn: sa.Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('ito-ledger:' || current_schema()))")


def upgrade(engine: sa.Engine) -> str:
    """Bring the ledger behind `engine` to head; returns the revision it was at before ('' if new)."""
    with engine.connect() as conn:
        conn.execution_options(ito_immediate=True)
        with conn.begin():
            _take_lock(conn)
            before = current(conn)
            known = {revision.revision for revision in _script().walk_revisions()}
            if set(before) - known:
                raise ItoError(ErrorCode.LEDGER_SCHEMA_TOO_NEW,
                               "the ledger was migrated by a newer release of ito-training; run that release")
            if before == (head(),):
                return head()
            if not before and sa.inspect(conn).has_table("runs"):
                command.stamp(_config(conn), _BASELINE)
                before = (_BASELINE,)
            command.upgrade(_config(conn), "head")
    return before[0] if before else ""
