"""Gate 4, idempotency keys: looked up before any confirmation is touched; reserved in the same
transaction that creates the work; unique per account by the primary key (the database, not
Python, decides which of two concurrent requests wins).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import sqlalchemy as sa

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control.ledger import idempotency_keys


@dataclass(frozen=True)
class KeyRecord:
    account_id: str
    key: str
    action: str
    fingerprint: str
    run_id: str | None
    result: dict | None
    created_at: int


def lookup(conn: sa.Connection, account_id: str, key: str) -> KeyRecord | None:
    row = conn.execute(sa.select(idempotency_keys).where(
        idempotency_keys.c.account_id == account_id, idempotency_keys.c.key == key)).mappings().first()
    if row is None:
        return None
    return KeyRecord(**{**row, "result": json.loads(row["result"]) if row["result"] else None})


def require_same_request(record: KeyRecord, action: str, fingerprint: str) -> KeyRecord:
    """A key seen before replays its first answer only for the very same request."""
    if record.action != action or record.fingerprint != fingerprint:
        raise ItoError(ErrorCode.IDEMPOTENCY_KEY_REUSED,
                       "this idempotency key was already used for a different request")
    return record


def reserve(conn: sa.Connection, *, account_id: str, key: str, action: str, fingerprint: str,
            run_id: str | None, now: int, result: dict | None = None) -> None:
    """Insert the key; a concurrent insert of the same key raises sa.exc.IntegrityError, which
    the caller turns into a replay after its transaction has rolled back."""
    conn.execute(idempotency_keys.insert().values(
        account_id=account_id, key=key, action=action, fingerprint=fingerprint, run_id=run_id,
        result=json.dumps(result, sort_keys=True) if result is not None else None, created_at=now,
    ))


def store_result(conn: sa.Connection, account_id: str, key: str, result: dict) -> None:
    conn.execute(idempotency_keys.update().where(
        idempotency_keys.c.account_id == account_id, idempotency_keys.c.key == key,
    ).values(result=json.dumps(result, sort_keys=True)))


def is_lock_timeout(exc: BaseException) -> bool:
    """SQLite's busy timeout ("database is locked") or PostgreSQL's lock_timeout (SQLSTATE 55P03)."""
    orig = getattr(exc, "orig", None)
    if getattr(orig, "sqlstate", None) == "55P03":
        return True
    text = str(orig or exc).lower()
    return "database is locked" in text or "database is busy" in text


def in_flight() -> ItoError:
    return ItoError(ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT,
                    "a request with this key (or another on the same booking) is still in progress; "
                    "retry with the same key")
