"""Per-tenant cleanup: removes the artifacts of the account's finished runs and reports exactly
what it removed. It never touches a booking unless a release was asked for with its own,
separately approved confirmation (action release, bound to that booking): an economic action
is never a side effect of cleanup.

The files are removed inside the transaction that consumes the confirmation and reserves the
key: if removal fails nothing is consumed; if the commit fails after removal, a rerun finds
nothing left to remove and records the same runs as cleaned (removal is idempotent).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass

import sqlalchemy as sa

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, bookings, confirmations, entitlement, idempotency, ids
from ito_assets.control.fingerprint import request_fingerprint, validate_key
from ito_assets.control.identity import Identity
from ito_assets.control.ledger import Ledger, bookings as bookings_table, run_checkpoints, runs
from ito_assets.control.policy import ServerPolicy
from ito_assets.control.states import ACTIVE_RUN_STATES, TERMINAL_RUN_STATES, Action, BookingState
from ito_assets.control.validation import inside


@dataclass(frozen=True)
class CleanedRun:
    run_id: str
    num_files_removed: int
    num_bytes_removed: int
    num_checkpoints_removed: int


def _measure(folder: str) -> tuple[int, int]:
    num_files = num_bytes = 0
    for root, _dirs, files in os.walk(folder, followlinks=False):
        for name in files:
            num_files += 1
            try:
                num_bytes += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return num_files, num_bytes


def _remove_artifacts(folder: str, tenant_area: str) -> tuple[int, int]:
    """Remove one run's folder, which must lie inside the tenant's area and not be a link."""
    if not os.path.lexists(folder):
        return 0, 0
    if os.path.islink(folder) or not inside(folder, tenant_area):
        raise ItoError(ErrorCode.CHECKPOINT_STORAGE_INVALID, "a run's artifacts lie outside the tenant's area")
    measured = _measure(folder)
    shutil.rmtree(folder)
    return measured


@dataclass(frozen=True)
class Release:
    """A booking to release with this cleanup, and the reference of its own confirmation."""

    booking_id: str
    confirmation_ref: str

    def __repr__(self) -> str:  # the reference stays out of logs
        return f"Release(booking_id={self.booking_id!r})"


def _release_locked(conn: sa.Connection, ledger: Ledger, identity: Identity, release: Release, key: str) -> dict:
    now = ledger.now()
    booking = bookings.load(conn, release.booking_id, for_update=True) if ids.is_booking_id(release.booking_id) else None
    eligible = entitlement.eligibility(booking, identity.tenant, now, require_started=False)  # releasing needs no window
    confirmation = confirmations.resolve(conn, release.confirmation_ref, account_id=identity.tenant, for_update=True)
    confirmations.require_usable(confirmation, now=now, action=Action.RELEASE, booking_id=booking.booking_id,
                                 cost_cents=0)
    entitlement.require_unchanged(confirmation.eligibility, eligible)
    active = conn.execute(sa.select(sa.func.count()).select_from(runs).where(
        runs.c.booking_id == booking.booking_id, runs.c.state.in_([s.value for s in ACTIVE_RUN_STATES]))).scalar_one()
    if active:
        raise ItoError(ErrorCode.CAPACITY_UNAVAILABLE, "the booking still has active runs; cancel them first",
                       retryable=False)
    confirmations.consume(conn, confirmation, now=now, run_id=None, key=key)
    conn.execute(bookings_table.update().where(bookings_table.c.booking_id == booking.booking_id)
                 .values(state=BookingState.RELEASED.value, updated_at=now))
    audit.record(conn, now, "booking_released", actor=identity.token_id, account_id=identity.tenant,
                 subject=booking.booking_id, confirmation_id=confirmation.confirmation_id, idempotency_key=key)
    return {"booking_id": booking.booking_id, "state": BookingState.RELEASED.value}


def _clean_locked(conn: sa.Connection, ledger: Ledger, policy: ServerPolicy, identity: Identity, ref: str,
                  key: str, fingerprint: str, release: Release | None) -> dict:
    now = ledger.now()
    account_id = identity.tenant
    confirmation = confirmations.resolve(conn, ref, account_id=account_id, for_update=True)
    confirmations.require_usable(confirmation, now=now, action=Action.CLEANUP, cost_cents=0)
    changed = [_release_locked(conn, ledger, identity, release, key)] if release else []
    finished = conn.execute(sa.select(runs.c.run_id, runs.c.checkpoint_dir).where(
        runs.c.account_id == account_id, runs.c.cleaned_at.is_(None),
        runs.c.state.in_([s.value for s in TERMINAL_RUN_STATES])).order_by(runs.c.run_id).with_for_update()).all()
    cleaned = []
    for run_id, folder in finished:
        num_files, num_bytes = _remove_artifacts(folder, str(policy.tenant_area(account_id)))
        num_checkpoints = conn.execute(run_checkpoints.update().where(
            run_checkpoints.c.run_id == run_id, run_checkpoints.c.removed_at.is_(None)).values(removed_at=now)).rowcount
        conn.execute(runs.update().where(runs.c.run_id == run_id).values(cleaned_at=now, updated_at=now))
        cleaned.append(CleanedRun(run_id, num_files, num_bytes, num_checkpoints))
    report = {
        "account_id": account_id, "idempotency_key": key, "num_runs_cleaned": len(cleaned),
        "num_bytes_removed": sum(c.num_bytes_removed for c in cleaned),
        "runs": [asdict(c) for c in cleaned], "bookings_changed": changed, "cleaned_at": now,
    }
    confirmations.consume(conn, confirmation, now=now, run_id=None, key=key)
    idempotency.reserve(conn, account_id=account_id, key=key, action=Action.CLEANUP.value,
                        fingerprint=fingerprint, run_id=None, now=now, result=report)
    audit.record(conn, now, "tenant_cleaned", actor=identity.token_id, account_id=account_id,
                 subject=account_id, confirmation_id=confirmation.confirmation_id, idempotency_key=key,
                 num_runs_cleaned=len(cleaned), run_ids=[c.run_id for c in cleaned])
    return report


def cleanup_fingerprint(account_id: str, release_booking_id: str | None) -> str:
    return request_fingerprint(Action.CLEANUP.value, account_id=account_id, release_booking_id=release_booking_id)


def _replay(ledger: Ledger, account_id: str, key: str, fingerprint: str) -> dict | None:
    with ledger.read() as conn:
        record = idempotency.lookup(conn, account_id, key)
    if record is None:
        return None
    idempotency.require_same_request(record, Action.CLEANUP.value, fingerprint)
    return {**(record.result or {}), "replayed": True}


def cleanup_tenant(ledger: Ledger, policy: ServerPolicy, identity: Identity, *, confirmation_ref: str,
                   idempotency_key: str, release: Release | None = None) -> dict:
    """Returns the cleanup report (with `replayed`); replays the first report for the same key."""
    account_id = identity.tenant
    key = validate_key(idempotency_key)
    fingerprint = cleanup_fingerprint(account_id, release.booking_id if release else None)
    replay = _replay(ledger, account_id, key, fingerprint)
    if replay is not None:
        return replay
    try:
        with ledger.write() as conn:
            report = _clean_locked(conn, ledger, policy, identity, confirmation_ref, key, fingerprint, release)
    except (sa.exc.IntegrityError, sa.exc.OperationalError) as exc:
        if isinstance(exc, sa.exc.OperationalError) and not idempotency.is_lock_timeout(exc):
            raise
        replay = _replay(ledger, account_id, key, fingerprint)
        if replay is None:
            raise idempotency.in_flight() from None
        return replay
    return {**report, "replayed": False}
