"""The append-only audit trail: who did what to which subject, and which gate refused what.

Details hold identifiers, digests, amounts and codes only: never a token, a confirmation
reference or a caller-supplied free text (the server passes values it has validated).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ito_assets.control.ledger import Ledger, audit_events


@dataclass(frozen=True)
class AuditEvent:
    seq: int
    at: int
    actor: str | None
    account_id: str | None
    kind: str
    subject: str | None
    code: str | None
    detail: dict[str, Any]


def record(conn: sa.Connection, at: int, kind: str, *, actor: str | None = None,
           account_id: str | None = None, subject: str | None = None, code: str | None = None,
           **detail: Any) -> None:
    """Append one event inside the caller's transaction: the event commits with the change."""
    conn.execute(audit_events.insert().values(
        at=at, actor=actor, account_id=account_id, kind=kind, subject=subject, code=code,
        detail=json.dumps(detail, sort_keys=True, default=str),
    ))


def record_refusal(ledger: Ledger, kind: str, code: str, *, actor: str | None,
                   account_id: str | None, subject: str | None = None, **detail: Any) -> None:
    """A refused request leaves a trace in its own transaction (the refused one rolled back)."""
    with ledger.write() as conn:
        record(conn, ledger.now(), kind, actor=actor, account_id=account_id, subject=subject,
               code=code, **detail)


def events(ledger: Ledger, *, account_id: str | None = None, subject: str | None = None,
           after_seq: int = 0, limit: int = 100) -> list[AuditEvent]:
    query = sa.select(audit_events).where(audit_events.c.seq > after_seq)
    if account_id is not None:
        query = query.where(audit_events.c.account_id == account_id)
    if subject is not None:
        query = query.where(audit_events.c.subject == subject)
    with ledger.read() as conn:
        rows = conn.execute(query.order_by(audit_events.c.seq).limit(limit)).mappings().all()
    return [AuditEvent(**{**row, "detail": json.loads(row["detail"])}) for row in rows]
