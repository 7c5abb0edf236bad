"""Cancellation: its own confirmation (action cancel, bound to the run) and its own idempotency
key: cancellation and cleanup are separate mutations, so approving one never approves the other.

A queued run that no Dagster run was launched for is cancelled at once; otherwise it becomes
`cancelling` and the Dagster shell terminates its run, then reports `cancelled` via set_state.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, confirmations, idempotency, ids, runs
from ito_assets.control.fingerprint import request_fingerprint, validate_key
from ito_assets.control.identity import Identity
from ito_assets.control.ledger import Ledger
from ito_assets.control.runs import Run
from ito_assets.control.states import TERMINAL_RUN_STATES, Action, RunState


@dataclass(frozen=True)
class Cancelled:
    run: Run
    replayed: bool


def _replay(conn: sa.Connection, account_id: str, key: str, fingerprint: str) -> Cancelled | None:
    record = idempotency.lookup(conn, account_id, key)
    if record is None:
        return None
    idempotency.require_same_request(record, Action.CANCEL.value, fingerprint)
    run = runs.load(conn, record.run_id)
    return Cancelled(run=run, replayed=True)


def _cancel_locked(conn: sa.Connection, ledger: Ledger, identity: Identity, run_id: str, ref: str,
                   key: str, fingerprint: str) -> Cancelled:
    account_id = identity.tenant
    run = runs.load(conn, run_id, for_update=True)
    if run is None or run.account_id != account_id:
        raise ItoError(ErrorCode.RUN_NOT_FOUND, "no such run for this account")
    replay = _replay(conn, account_id, key, fingerprint)
    if replay is not None:
        return replay
    confirmation = confirmations.resolve_bound(conn, ref, account_id=account_id, action=Action.CANCEL,
                                               booking_id=run.booking_id, target_run_id=run.run_id)
    now = ledger.now()  # after the locks: a confirmation that expired while this waited is expired
    confirmations.require_usable(confirmation, now=now, action=Action.CANCEL, booking_id=run.booking_id,
                                 manifest_digest=run.manifest_digest, target_run_id=run.run_id, cost_cents=0)
    if run.state in TERMINAL_RUN_STATES:
        raise ItoError(ErrorCode.RUN_FINISHED, f"the run already ended ({run.state.value})")
    confirmations.consume(conn, confirmation, now=now, run_id=run.run_id, key=key)
    idempotency.reserve(conn, account_id=account_id, key=key, action=Action.CANCEL.value,
                        fingerprint=fingerprint, run_id=run.run_id, now=now)
    audit.record(conn, now, "run_cancel_requested", actor=identity.token_id, account_id=account_id,
                 subject=run.run_id, confirmation_id=confirmation.confirmation_id, idempotency_key=key)
    if run.state is RunState.CANCELLING:
        return Cancelled(run=run, replayed=False)
    # Nothing was launched yet: there is no Dagster run to terminate.
    target = RunState.CANCELLED if run.state is RunState.QUEUED and run.dagster_run_id is None else RunState.CANCELLING
    run = runs.transition(conn, run, target, now=now, reason="cancelled by the account", actor=identity.token_id)
    return Cancelled(run=run, replayed=False)


def _record_refusal(ledger: Ledger, identity: Identity, run_id: str, key: str, error: ItoError) -> None:
    """A refused cancellation leaves its own audit event, as a refused train does: the run (only
    an id of the ledger's form: caller text never reaches the trail), the key and the code. A busy
    ledger (IDEMPOTENCY_KEY_IN_FLIGHT) is not written to, and a failed write never changes the answer."""
    if error.code is ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT:
        return
    try:
        audit.record_refusal(ledger, "run_cancel_refused", error.code.value, actor=identity.token_id,
                             account_id=identity.tenant, subject=run_id if ids.is_run_id(run_id) else None,
                             idempotency_key=key)
    except sa.exc.SQLAlchemyError:
        pass


def cancel_run(ledger: Ledger, identity: Identity, run_id: str, *, confirmation_ref: str,
               idempotency_key: str) -> Cancelled:
    key = validate_key(idempotency_key)
    try:
        return _cancel(ledger, identity, run_id, confirmation_ref, key)
    except ItoError as error:
        _record_refusal(ledger, identity, run_id, key, error)
        raise


def _cancel(ledger: Ledger, identity: Identity, run_id: str, confirmation_ref: str, key: str) -> Cancelled:
    account_id = identity.tenant
    fingerprint = request_fingerprint(Action.CANCEL.value, run_id=run_id)
    with ledger.read() as conn:
        replay = _replay(conn, account_id, key, fingerprint)
    if replay is not None:
        return replay
    try:
        with ledger.write() as conn:
            return _cancel_locked(conn, ledger, identity, run_id, confirmation_ref, key, fingerprint)
    except (sa.exc.IntegrityError, sa.exc.OperationalError) as exc:
        if isinstance(exc, sa.exc.OperationalError) and not idempotency.is_lock_timeout(exc):
            raise
        with ledger.read() as conn:
            replay = _replay(conn, account_id, key, fingerprint)
        if replay is None:
            raise idempotency.in_flight() from None
        return replay
