"""`confirm request`: the server computes what a mutation would do and what it costs, and issues
an unapproved, short-lived confirmation bound to exactly that. Nothing here creates a workload.

Every gate that can be checked before approval is checked here too, so a human is never asked
to approve a request that would fail anyway; `create_run` checks them all again.
"""

from __future__ import annotations

from dataclasses import dataclass

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import bookings, budget, confirmations, cost, entitlement, ids, runs, validation
from ito_assets.control.confirmations import IssuedConfirmation
from ito_assets.control.history import BlockHistory, block_history
from ito_assets.control.identity import Identity
from ito_assets.control.ledger import Ledger
from ito_assets.control.policy import ServerPolicy
from ito_assets.control.states import TERMINAL_RUN_STATES, Action
from ito_assets.manifest.verify import VerifiedManifest
from ito_assets.training.run_plan import RunPlan


@dataclass(frozen=True)
class TrainPreflight:
    """Everything gate 5 establishes for a train request, computed inside one transaction."""

    eligibility: entitlement.Eligibility
    cost_cents: int
    checkpoint_root: str
    run_plan: RunPlan  # on this booking's hardware, its post-training recipe included
    window_left_s: int  # what the booked window still has ahead


def entitle(conn, ledger: Ledger, account_id: str, booking_id: str, *, for_update: bool,
            require_started: bool = True) -> tuple:
    """Gate 1 from the booking row (locked FOR UPDATE inside a creating transaction). An id not in
    the form the ledger issues is no booking: BOOKING_NOT_FOUND before any query."""
    booking = bookings.load(conn, booking_id, for_update=for_update) if ids.is_booking_id(booking_id) else None
    return booking, entitlement.eligibility(booking, account_id, ledger.now(), require_started=require_started)


def entitled_recipe_pairs(ledger: Ledger, policy: ServerPolicy, account_id: str, booking_id: str,
                      verified: VerifiedManifest, *, require_started: bool = True) -> validation.RecipePairs:
    """Gate 1, then the recipe's pair files (`validation.read_recipe_pairs`), before the gates'
    transaction: a caller with no booking of theirs never makes the server read a file. Gate 1 is
    asked again inside the transaction, where it counts."""
    with ledger.read() as conn:
        entitle(conn, ledger, account_id, booking_id, for_update=False, require_started=require_started)
    return validation.read_recipe_pairs(verified.manifest, policy)


def validate(conn, policy: ServerPolicy, account_id: str, booking: bookings.Booking, eligible: entitlement.Eligibility,
             verified: VerifiedManifest, requirements: validation.RunRequirements, *, now: int,
             pairs: validation.RecipePairs, create_storage: bool = True) -> TrainPreflight:
    """Gate 5: data policy, checkpoint storage, network, capacity (the plan inside the window
    included, post-training too) and cost, in that order. `pairs`: `validation.read_recipe_pairs`,
    read before the caller's transaction. `create_storage=False` for a quote: the checkpoint
    folder is checked, never created."""
    manifest = verified.manifest
    validation.check_data_policy(manifest, policy)
    folder = validation.check_checkpoint_storage(manifest.checkpoint_policy.storage_uri, account_id, policy,
                                                 create=create_storage)
    validation.check_network(requirements, eligible)
    validation.check_capacity(requirements, eligible, num_active_runs=runs.count_active(conn, booking.booking_id),
                              policy=policy)
    run_plan = validation.check_plan_fits(manifest, booking, now=now, pair_shapes=pairs.require())
    committed = budget.state(conn, account_id, verified.digest, manifest.budget).committed_cents
    cost_cents = cost.training_cost_cents(booking, manifest.budget, committed_cents=committed)
    return TrainPreflight(eligibility=eligible, cost_cents=cost_cents, checkpoint_root=str(folder), run_plan=run_plan,
                          window_left_s=validation.window_left_s(booking.starts_at, booking.ends_at, now))


@dataclass(frozen=True)
class TrainQuote:
    """What a train confirmation for this booking and manifest would bind, asked without issuing
    one: the same gate 5 and the same price, in a read-only transaction; and what past runs on
    blocks like this one delivered (`history`), which the price does not depend on."""

    booking: bookings.Booking
    cost_cents: int
    budget: budget.BudgetState
    history: BlockHistory
    run_plan: RunPlan  # the plan gate 5 checked against the window: what `ito plan` shows
    window_left_s: int

    def to_dict(self) -> dict:
        return {"booking": self.booking.to_dict(), "cost_cents": self.cost_cents, "budget": self.budget.to_dict(),
                "history": self.history.to_dict(), "plan": self.run_plan.to_dict(),
                "time": {"planned_wall_seconds": round(self.run_plan.wall_seconds, 3),
                         "window_left_seconds": self.window_left_s,
                         "post_training_included": self.run_plan.post_training_included},
                "confirmation_issued": False, "workload_created": False}


def quote_train(ledger: Ledger, policy: ServerPolicy, identity: Identity, booking_id: str,
                verified: VerifiedManifest, requirements: validation.RunRequirements | None = None) -> TrainQuote:
    account_id = identity.tenant
    pairs = entitled_recipe_pairs(ledger, policy, account_id, booking_id, verified, require_started=False)
    with ledger.read() as conn:
        # A quote may be asked before the window begins (planning ahead); confirm and train may not.
        booking, eligible = entitle(conn, ledger, account_id, booking_id, for_update=False, require_started=False)
        pre = validate(conn, policy, account_id, booking, eligible, verified,
                       requirements or validation.RunRequirements(), now=ledger.now(), pairs=pairs,
                       create_storage=False)
        state = budget.state(conn, account_id, verified.digest, verified.manifest.budget)
        history = block_history(conn, booking, account_id)  # pooled only over enough accounts
    return TrainQuote(booking=booking, cost_cents=pre.cost_cents, budget=state, history=history,
                      run_plan=pre.run_plan, window_left_s=pre.window_left_s)


def request_train(ledger: Ledger, policy: ServerPolicy, identity: Identity, booking_id: str,
                  verified: VerifiedManifest, requirements: validation.RunRequirements | None = None
                  ) -> IssuedConfirmation:
    account_id = identity.tenant
    pairs = entitled_recipe_pairs(ledger, policy, account_id, booking_id, verified)
    now = ledger.now()
    with ledger.write() as conn:
        booking, eligible = entitle(conn, ledger, account_id, booking_id, for_update=False)
        pre = validate(conn, policy, account_id, booking, eligible, verified,
                       requirements or validation.RunRequirements(), now=now, pairs=pairs)
        return confirmations.issue(
            conn, now=now, ttl_s=policy.confirmation_ttl_s, account_id=account_id, action=Action.TRAIN,
            cost_cents=pre.cost_cents, booking_id=booking_id,
            booking_revision=pre.eligibility.booking_revision, manifest_digest=verified.digest,
            eligibility_json=pre.eligibility.to_json(), actor=identity.token_id,
        )


def request_cancel(ledger: Ledger, policy: ServerPolicy, identity: Identity, run_id: str) -> IssuedConfirmation:
    """Cancellation costs nothing to confirm; it binds the run, its booking and its manifest."""
    account_id = identity.tenant
    run = runs.get(ledger, run_id, account_id=account_id)
    if run.state in TERMINAL_RUN_STATES:
        raise ItoError(ErrorCode.RUN_FINISHED, f"the run already ended ({run.state.value})")
    with ledger.write() as conn:
        return confirmations.issue(
            conn, now=ledger.now(), ttl_s=policy.confirmation_ttl_s, account_id=account_id,
            action=Action.CANCEL, cost_cents=0, booking_id=run.booking_id,
            manifest_digest=run.manifest_digest, target_run_id=run.run_id, actor=identity.token_id,
        )


def request_release(ledger: Ledger, policy: ServerPolicy, identity: Identity, booking_id: str) -> IssuedConfirmation:
    """Releasing a booking with a cleanup: bound to the booking and its current revision."""
    account_id = identity.tenant
    with ledger.write() as conn:
        # Giving a booking back before its window begins is allowed: nothing trains on it.
        _booking, eligible = entitle(conn, ledger, account_id, booking_id, for_update=False, require_started=False)
        return confirmations.issue(
            conn, now=ledger.now(), ttl_s=policy.confirmation_ttl_s, account_id=account_id,
            action=Action.RELEASE, cost_cents=0, booking_id=booking_id,
            booking_revision=eligible.booking_revision, eligibility_json=eligible.to_json(), actor=identity.token_id,
        )


def request_cleanup(ledger: Ledger, policy: ServerPolicy, identity: Identity) -> IssuedConfirmation:
    """Cleanup is per tenant: it binds the account only, never a booking."""
    with ledger.write() as conn:
        return confirmations.issue(
            conn, now=ledger.now(), ttl_s=policy.confirmation_ttl_s, account_id=identity.tenant,
            action=Action.CLEANUP, cost_cents=0, actor=identity.token_id,
        )
