"""Gate 3, the confirmation: separate, single-use, bound to account, action, booking, manifest
digest and cost, short-lived, approved out of band by another identity (the desk).

The caller only ever holds the opaque reference `cfr_` + 26 characters; the ledger stores its
sha256. An unknown reference and another account's reference give the same answer,
CONFIRMATION_INVALID, so a reference cannot be probed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

import sqlalchemy as sa

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, ids
from ito_assets.control.ledger import Ledger, confirmations
from ito_assets.control.states import Action


@dataclass(frozen=True, kw_only=True)
class Confirmation:
    confirmation_id: str
    account_id: str
    action: Action
    booking_id: str | None
    booking_revision: int | None
    manifest_digest: str | None
    target_run_id: str | None
    cost_cents: int
    eligibility: str | None
    created_at: int
    expires_at: int
    approved_by: str | None
    approved_at: int | None
    consumed_at: int | None
    consumed_by_run: str | None
    consumed_by_key: str | None

    def binding(self) -> dict:
        """What a human must see before approving, since an approval covers exactly this: account,
        action, booking, manifest digest, cost and expiry."""
        return {
            "confirmation_id": self.confirmation_id, "account_id": self.account_id,
            "action": self.action.value, "booking_id": self.booking_id,
            "booking_revision": self.booking_revision, "manifest_digest": self.manifest_digest,
            "run_id": self.target_run_id, "cost_cents": self.cost_cents,
            "eligibility": json.loads(self.eligibility) if self.eligibility else None,
            "created_at": self.created_at, "expires_at": self.expires_at,
            "approved": self.approved_at is not None, "consumed": self.consumed_at is not None,
        }


@dataclass(frozen=True)
class IssuedConfirmation:
    ref: str
    confirmation: Confirmation

    def __repr__(self) -> str:  # the reference stays out of logs and tracebacks
        return f"IssuedConfirmation(confirmation_id={self.confirmation.confirmation_id!r})"


_COLUMNS = {f.name for f in fields(Confirmation)}


def _from_row(row) -> Confirmation:
    values = {k: v for k, v in dict(row).items() if k in _COLUMNS}
    return Confirmation(**{**values, "action": Action(values["action"])})


def issue(conn: sa.Connection, *, now: int, ttl_s: int, account_id: str, action: Action, cost_cents: int,
          booking_id: str | None = None, booking_revision: int | None = None,
          manifest_digest: str | None = None, target_run_id: str | None = None,
          eligibility_json: str | None = None, actor: str | None = None) -> IssuedConfirmation:
    ref = ids.new_confirmation_ref()
    values = dict(
        confirmation_id=ids.new_id("cfm"), account_id=account_id, action=action.value,
        booking_id=booking_id, booking_revision=booking_revision, manifest_digest=manifest_digest,
        target_run_id=target_run_id, cost_cents=cost_cents, eligibility=eligibility_json,
        created_at=now, expires_at=now + ttl_s, approved_by=None, approved_at=None,
        consumed_at=None, consumed_by_run=None, consumed_by_key=None,
    )
    conn.execute(confirmations.insert().values(ref_hash=ids.secret_hash(ref), **values))
    audit.record(conn, now, "confirmation_requested", actor=actor, account_id=account_id,
                 subject=values["confirmation_id"], action=action.value, booking_id=booking_id,
                 manifest_digest=manifest_digest, run_id=target_run_id, cost_cents=cost_cents,
                 expires_at=values["expires_at"])
    return IssuedConfirmation(ref=ref, confirmation=_from_row(values))


def _invalid() -> ItoError:
    return ItoError(ErrorCode.CONFIRMATION_INVALID, "the confirmation reference is not valid")


def resolve(conn: sa.Connection, ref: str, *, account_id: str | None, for_update: bool = False) -> Confirmation:
    """The confirmation behind `ref`; `account_id=None` is the desk's view (any account)."""
    if not ids.is_confirmation_ref(ref):
        raise _invalid()
    query = sa.select(confirmations).where(confirmations.c.ref_hash == ids.secret_hash(ref))
    row = conn.execute(query.with_for_update() if for_update else query).mappings().first()
    if row is None or (account_id is not None and row["account_id"] != account_id):
        raise _invalid()
    return _from_row(row)


def resolve_bound(conn: sa.Connection, ref: str, *, account_id: str, action: Action, booking_id: str | None = None,
                  target_run_id: str | None = None) -> Confirmation:
    """The confirmation behind `ref`, locked, once it is known to be bound to `action` on this
    booking and run; one bound to anything else is refused (CONFIRMATION_MISMATCH) before its row
    is locked. A request that names another request's confirmation (a train naming a cleanup's)
    would otherwise wait on it, and on PostgreSQL deadlock with it where the other locks in the
    opposite order (a cleanup locks its confirmation, then the booking it releases or the runs it
    cleans). A binding never changes once issued, so the look without the lock judges it as one
    under the lock would; `require_usable` judges the rest under the lock."""
    seen = resolve(conn, ref, account_id=account_id)
    if (seen.action, seen.booking_id, seen.target_run_id) != (action, booking_id, target_run_id):
        raise _mismatch()
    return resolve(conn, ref, account_id=account_id, for_update=True)


def _mismatch() -> ItoError:
    return ItoError(ErrorCode.CONFIRMATION_MISMATCH, "the confirmation is bound to a different action, booking, run or cost")


def require_usable(c: Confirmation, *, now: int, action: Action, booking_id: str | None = None,
                   manifest_digest: str | None = None, target_run_id: str | None = None,
                   cost_cents: int | None = None) -> None:
    """Binding first (a mismatch is never a usable confirmation), then single use, expiry (to the
    second: usable while now < expires_at) and approval."""
    if (c.action, c.booking_id, c.target_run_id) != (action, booking_id, target_run_id) or (
            cost_cents is not None and cost_cents != c.cost_cents):
        raise _mismatch()
    if c.manifest_digest != manifest_digest:
        # Exact equality: the approver saw this digest, so any other manifest was never approved.
        raise ItoError(ErrorCode.MANIFEST_DIGEST_MISMATCH, "the manifest differs from the one the confirmation is bound to")
    if c.consumed_at is not None:
        raise ItoError(ErrorCode.CONFIRMATION_CONSUMED, "the confirmation was already used")
    if now >= c.expires_at:
        raise ItoError(ErrorCode.CONFIRMATION_EXPIRED, "the confirmation has expired; request a new one")
    if c.approved_at is None:
        raise ItoError(ErrorCode.CONFIRMATION_NOT_APPROVED, "the confirmation has not been approved by the desk")


def consume(conn: sa.Connection, c: Confirmation, *, now: int, run_id: str | None, key: str) -> None:
    """One conditional update: of any number of concurrent consumers exactly one sees rowcount 1."""
    changed = conn.execute(
        confirmations.update()
        .where(confirmations.c.confirmation_id == c.confirmation_id, confirmations.c.consumed_at.is_(None))
        .values(consumed_at=now, consumed_by_run=run_id, consumed_by_key=key)
    ).rowcount
    if changed != 1:
        raise ItoError(ErrorCode.CONFIRMATION_CONSUMED, "the confirmation was already used")


def show(ledger: Ledger, ref: str) -> Confirmation:
    with ledger.read() as conn:
        return resolve(conn, ref, account_id=None)


def approve(ledger: Ledger, ref: str, *, approver_token_id: str, expected_cost_cents: int,
            expected_digest: str | None = None) -> Confirmation:
    """The desk approves what it saw: the cost (and, if given, the manifest digest) it names must
    equal the binding, so an approval can never cover terms the approver did not read."""
    with ledger.write() as conn:
        c = resolve(conn, ref, account_id=None, for_update=True)
        now = ledger.now()  # after the write lock: waiting for it may outlast the expiry second
        if c.cost_cents != expected_cost_cents or (expected_digest is not None and expected_digest != c.manifest_digest):
            raise ItoError(ErrorCode.CONFIRMATION_MISMATCH, "the approval names a different cost or manifest digest")
        if c.consumed_at is not None:
            raise ItoError(ErrorCode.CONFIRMATION_CONSUMED, "the confirmation was already used")
        if now >= c.expires_at:
            raise ItoError(ErrorCode.CONFIRMATION_EXPIRED, "the confirmation has expired")
        if c.approved_at is not None:
            return c
        conn.execute(confirmations.update().where(confirmations.c.confirmation_id == c.confirmation_id)
                     .values(approved_by=approver_token_id, approved_at=now))
        audit.record(conn, now, "confirmation_approved", actor=approver_token_id, account_id=c.account_id,
                     subject=c.confirmation_id, action=c.action.value, cost_cents=c.cost_cents)
    return Confirmation(**{**{f: getattr(c, f) for f in _COLUMNS}, "approved_by": approver_token_id, "approved_at": now})
