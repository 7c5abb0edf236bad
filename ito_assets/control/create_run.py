"""The one transaction that creates a training run.

1. The idempotency key is validated and looked up first: the same request replays its run, even
   after its confirmation was consumed; a different request under the key is refused.
2. One write transaction: the booking row is locked (FOR UPDATE on PostgreSQL; BEGIN IMMEDIATE
   holds SQLite's write lock) and the entitlement re-read from it, so a booking released between
   confirm and train never yields a run; the key is looked up again under that lock; the
   confirmation is checked against the request; the manifest's budget row is locked, so trains
   of one manifest on different bookings still sum its spend one at a time; gate 5 is
   re-validated; the confirmation is consumed by one conditional update, the key reserved and
   the run inserted. All of it commits or none does.
3. A concurrent twin that lost the race (unique violation) or waited too long for the lock
   answers from the winner's committed key, or IDEMPOTENCY_KEY_IN_FLIGHT: never a second run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import sqlalchemy as sa

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, budget, confirmations, entitlement, idempotency, ids, intake, runs, validation
from ito_assets.control.confirm_request import entitle, entitled_recipe_pairs, validate
from ito_assets.control.fingerprint import request_fingerprint, validate_key
from ito_assets.control.identity import Identity
from ito_assets.control.ledger import Ledger
from ito_assets.control.ledger import runs as runs_table
from ito_assets.control.policy import ServerPolicy
from ito_assets.control.runs import Run
from ito_assets.control.states import Action, RunState
from ito_assets.control.validation import RunRequirements
from ito_assets.manifest.verify import VerifiedManifest


@dataclass(frozen=True, kw_only=True)
class TrainRequest:
    booking_id: str
    verified: VerifiedManifest
    confirmation_ref: str
    idempotency_key: str
    requirements: RunRequirements = field(default_factory=RunRequirements)

    def fingerprint(self) -> str:
        return request_fingerprint(Action.TRAIN.value, booking_id=self.booking_id,
                                   manifest_digest=self.verified.digest)

    def __repr__(self) -> str:  # the confirmation reference stays out of logs
        return f"TrainRequest(booking_id={self.booking_id!r}, idempotency_key={self.idempotency_key!r})"


@dataclass(frozen=True)
class Created:
    run: Run
    replayed: bool  # True when an earlier identical request had already created the run


def _replay(conn: sa.Connection, account_id: str, key: str, fingerprint: str) -> Created | None:
    record = idempotency.lookup(conn, account_id, key)
    if record is None:
        return None
    idempotency.require_same_request(record, Action.TRAIN.value, fingerprint)
    run = runs.load(conn, record.run_id) if record.run_id else None
    if run is None:
        raise ItoError(ErrorCode.INTERNAL_ERROR, "an idempotency key points to no run")
    return Created(run=run, replayed=True)


def _replay_after_race(ledger: Ledger, account_id: str, key: str, fingerprint: str) -> Created:
    with ledger.read() as conn:
        replay = _replay(conn, account_id, key, fingerprint)
    if replay is None:
        raise idempotency.in_flight()
    return replay


def _insert(conn: sa.Connection, request: TrainRequest, account_id: str, checkpoint_root: str,
            confirmation: confirmations.Confirmation, now: int) -> Run:
    run_id = ids.new_run_id()
    key = request.idempotency_key
    confirmations.consume(conn, confirmation, now=now, run_id=run_id, key=key)
    idempotency.reserve(conn, account_id=account_id, key=key, action=Action.TRAIN.value,
                        fingerprint=request.fingerprint(), run_id=run_id, now=now)
    intake.store(conn, request.verified, now=now)
    values = dict(
        run_id=run_id, account_id=account_id, booking_id=request.booking_id,
        manifest_digest=request.verified.digest, idempotency_key=key,
        request_fingerprint=request.fingerprint(), confirmation_id=confirmation.confirmation_id,
        state=RunState.QUEUED.value, state_reason=None, dagster_run_id=None,
        cost_cents=confirmation.cost_cents, checkpoint_dir=os.path.join(checkpoint_root, run_id),
        created_at=now, updated_at=now, finished_at=None, cleaned_at=None, started_at=None,
    )
    conn.execute(runs_table.insert().values(**values))
    audit.record(conn, now, "run_created", actor=None, account_id=account_id, subject=run_id,
                 booking_id=request.booking_id, manifest_digest=request.verified.digest,
                 idempotency_key=key, confirmation_id=confirmation.confirmation_id,
                 cost_cents=confirmation.cost_cents)
    return runs.from_row(values)


def _create_locked(conn: sa.Connection, ledger: Ledger, policy: ServerPolicy, account_id: str,
                   request: TrainRequest, pairs: validation.RecipePairs) -> Created:
    """The gates in order, under the booking lock and then the manifest's budget lock:
    entitlement, the manifest bound in the confirmation, the confirmation itself, the key, then
    server-side validation and cost. Booking before budget, always: no two trains can wait on
    each other's lock."""
    booking, eligible = entitle(conn, ledger, account_id, request.booking_id, for_update=True)
    # Under the booking lock: a twin that committed while we waited is visible now.
    replay = _replay(conn, account_id, request.idempotency_key, request.fingerprint())
    if replay is not None:
        return replay
    confirmation = confirmations.resolve_bound(conn, request.confirmation_ref, account_id=account_id,
                                               action=Action.TRAIN, booking_id=request.booking_id)
    # Read after the booking's and the confirmation's locks: a wait for either may outlast the
    # confirmation's expiry second.
    now = ledger.now()
    confirmations.require_usable(confirmation, now=now, action=Action.TRAIN, booking_id=request.booking_id,
                                 manifest_digest=request.verified.digest)
    entitlement.require_same_network(confirmation.eligibility, eligible)
    budget.lock(conn, account_id, request.verified.digest, now=now)
    pre = validate(conn, policy, account_id, booking, eligible, request.verified, request.requirements, now=now,
                   pairs=pairs)
    if confirmation.cost_cents != pre.cost_cents:
        raise ItoError(ErrorCode.CONFIRMATION_MISMATCH, "the cost changed since the confirmation was approved")
    entitlement.require_unchanged(confirmation.eligibility, eligible)
    return Created(run=_insert(conn, request, account_id, pre.checkpoint_root, confirmation, now), replayed=False)


def create_run(ledger: Ledger, policy: ServerPolicy, identity: Identity, request: TrainRequest) -> Created:
    account_id = identity.tenant
    validate_key(request.idempotency_key)
    try:
        return _create(ledger, policy, account_id, request)
    except ItoError as error:
        # Every refusal is audited, wherever it was found (a reused key is found before the write
        # transaction, under its lock, or after a lost race); "in flight" is no answer yet.
        if error.code is not ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT:
            _audit_refusal(ledger, identity, request, error)
        raise


def _create(ledger: Ledger, policy: ServerPolicy, account_id: str, request: TrainRequest) -> Created:
    with ledger.read() as conn:
        replay = _replay(conn, account_id, request.idempotency_key, request.fingerprint())
    if replay is not None:
        return replay
    pairs = entitled_recipe_pairs(ledger, policy, account_id, request.booking_id, request.verified)  # before any lock
    try:
        with ledger.write() as conn:
            return _create_locked(conn, ledger, policy, account_id, request, pairs)
    except sa.exc.IntegrityError:
        return _replay_after_race(ledger, account_id, request.idempotency_key, request.fingerprint())
    except sa.exc.OperationalError as exc:
        if not idempotency.is_lock_timeout(exc):
            raise
        return _replay_after_race(ledger, account_id, request.idempotency_key, request.fingerprint())


def _audit_refusal(ledger: Ledger, identity: Identity, request: TrainRequest, error: ItoError) -> None:
    # The subject is the booking only when its id has the ledger's form: caller text never
    # reaches the audit trail (and cannot overflow its subject column).
    subject = request.booking_id if ids.is_booking_id(request.booking_id) else None
    try:
        audit.record_refusal(ledger, "run_refused", error.code.value, actor=identity.token_id,
                             account_id=identity.tenant, subject=subject,
                             manifest_digest=request.verified.digest, idempotency_key=request.idempotency_key)
    except sa.exc.SQLAlchemyError:
        pass  # a busy or full ledger must not turn a refusal into another answer
