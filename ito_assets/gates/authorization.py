"""Defence in depth for the Dagster shell: before its first step, the training job re-verifies in
the ledger that the run it was launched for is still authorized (DESIGN.md, "Gates are code").

`reverify` raises the ItoError of the first gate that no longer holds; the job's blocking asset
check turns that into a stopped run and the sensor reports `gate_failed` with its code.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import sqlalchemy as sa

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.gates import bookings, entitlement, runs
from ito_assets.gates.ledger import Ledger, confirmations, manifests
from ito_assets.gates.states import RunState


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
    eligibility: entitlement.Eligibility

    def tags(self) -> dict[str, str]:
        """The Dagster run tags issue 3 asks for (account, booking, manifest digest, key)."""
        return {"ito/run_id": self.run_id, "ito/account_id": self.account_id, "ito/booking_id": self.booking_id,
                "ito/manifest_digest": self.manifest_digest, "ito/idempotency_key": self.idempotency_key}


def reverify(ledger: Ledger, run_id: str) -> Authorization:
    """Re-check a created run: it is queued or running; its booking still entitles the account
    (state, window, and the very revision the confirmation was computed against); its
    confirmation was consumed by this run; the stored manifest still hashes to its digest."""
    with ledger.read() as conn:
        run = runs.load(conn, run_id)
        if run is None:
            raise ItoError(ErrorCode.RUN_NOT_FOUND, "no such run")
        if run.state not in (RunState.QUEUED, RunState.RUNNING):
            raise ItoError(ErrorCode.RUN_FINISHED, f"the run is {run.state.value}")
        eligible = entitlement.eligibility(bookings.load(conn, run.booking_id), run.account_id, ledger.now())
        bound = conn.execute(sa.select(confirmations).where(
            confirmations.c.confirmation_id == run.confirmation_id)).mappings().first()
        content = conn.execute(sa.select(manifests.c.content).where(
            manifests.c.digest == run.manifest_digest)).scalar_one_or_none()
    if bound is None or bound["consumed_by_run"] != run.run_id or bound["account_id"] != run.account_id:
        raise ItoError(ErrorCode.CONFIRMATION_INVALID, "the run's confirmation does not authorize it")
    entitlement.require_unchanged(bound["eligibility"], eligible)
    if content is None or "sha256:" + hashlib.sha256(bytes(content)).hexdigest() != run.manifest_digest:
        raise ItoError(ErrorCode.MANIFEST_DIGEST_MISMATCH, "the stored manifest no longer matches the run's digest")
    return Authorization(
        run_id=run.run_id, account_id=run.account_id, booking_id=run.booking_id,
        manifest_digest=run.manifest_digest, idempotency_key=run.idempotency_key,
        confirmation_id=run.confirmation_id, cost_cents=run.cost_cents, checkpoint_dir=run.checkpoint_dir,
        eligibility=eligible,
    )
