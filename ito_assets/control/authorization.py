"""Defence in depth for the Dagster shell: before its first step, the training job re-verifies in
the ledger that the run it was launched for is still authorized: a booking released or the run
cancelled while it waited must not spend compute.

`reverify` raises the ItoError of the first gate that no longer holds; the job's blocking asset
check turns that into a stopped run and the sensor reports `gate_failed` with its code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import bookings, entitlement, intake, run_tags, runs
from ito_assets.control.ledger import Ledger, confirmations
from ito_assets.control.states import RunState
from ito_assets.manifest.secure_read import ManifestBytes


@dataclass(frozen=True, kw_only=True)
class Authorization:
    run_id: str
    account_id: str
    booking_id: str
    manifest_digest: str
    idempotency_key: str
    confirmation_id: str
    cost_cents: int
    checkpoint_dir: str
    eligibility: entitlement.Eligibility  # the booking's hardware, among its terms
    price_per_gpu_hour_cents: int  # the booking's: the plan the job executes is priced with it
    started_at: int | None  # when its first training stage launched; None: no compute spent yet
    verified_at: int  # the ledger's clock at this re-verification
    # The bytes confirmed and digested when the run was created, read back and verified: what
    # the run trains, whatever has happened to any file since.
    manifest: ManifestBytes = field(repr=False, compare=False)

    def tags(self) -> dict[str, str]:
        return run_tags.for_run(self)


def reverify(ledger: Ledger, run_id: str) -> Authorization:
    """Re-check a created run: it is queued or running; its booking still entitles the account
    (state, window, and the very revision the confirmation was computed against); its
    confirmation was consumed by this run; the stored manifest still hashes to its digest."""
    now = ledger.now()
    with ledger.read() as conn:
        run = runs.load(conn, run_id)
        if run is None:
            raise ItoError(ErrorCode.RUN_NOT_FOUND, "no such run")
        if run.state not in (RunState.QUEUED, RunState.RUNNING):
            raise ItoError(ErrorCode.RUN_FINISHED, f"the run is {run.state.value}")
        booking = bookings.load(conn, run.booking_id)
        eligible = entitlement.eligibility(booking, run.account_id, now)
        bound = conn.execute(sa.select(confirmations).where(
            confirmations.c.confirmation_id == run.confirmation_id)).mappings().first()
        content = intake.stored_content(conn, run.manifest_digest)
    if bound is None or bound["consumed_by_run"] != run.run_id or bound["account_id"] != run.account_id:
        raise ItoError(ErrorCode.CONFIRMATION_INVALID, "the run's confirmation does not authorize it")
    entitlement.require_unchanged(bound["eligibility"], eligible)
    confirmed = intake.verify_stored(content, run.manifest_digest)  # a lost row reads as a mismatch
    return Authorization(
        run_id=run.run_id, account_id=run.account_id, booking_id=run.booking_id,
        manifest_digest=run.manifest_digest, idempotency_key=run.idempotency_key,
        confirmation_id=run.confirmation_id, cost_cents=run.cost_cents, checkpoint_dir=run.checkpoint_dir,
        eligibility=eligible, price_per_gpu_hour_cents=booking.price_per_gpu_hour_cents,
        started_at=run.started_at, verified_at=now, manifest=confirmed,
    )
