"""The budget gate at its exact boundaries: what a booking costs to the cent, the maximum incremental
cost and the manifest's cap over one booking and several, and that a refusal leaves nothing behind."""

from __future__ import annotations

import sqlalchemy as sa
import pytest

from gate_world import COST, TERMS, T0, manifest_bytes, verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import cost, create_run
from ito_assets.control.bookings import Booking
from ito_assets.control.states import BookingState
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.ledger import confirmations as confirmations_table
from ito_assets.control.ledger import runs as runs_table
from ito_assets.manifest.schema import Budget


def booking_of(*, price: int, num_gpus: int, duration_s: int) -> Booking:
    return Booking(booking_id="bkg_x", account_id="acct_x", state=BookingState.COMPLETED, revision=1,
                   created_at=T0, updated_at=T0,
                   **{**TERMS, "num_gpus": num_gpus, "num_nodes": 1, "price_per_gpu_hour_cents": price,
                      "starts_at": T0, "ends_at": T0 + duration_s})


@pytest.mark.parametrize(("price", "num_gpus", "duration_s", "cents"), [
    (100, 8, 3600, 800),        # a whole hour: exact
    (1, 1, 3600, 1),            # exactly one cent
    (1, 1, 3601, 2),            # a second more: rounded up, never down
    (1, 1, 1, 1),               # the smallest block still costs a cent
    (1, 1, 3599, 1),
    (7, 3, 1200, 7),            # 7 x 3 x 1200 / 3600 = 7 exactly
    (7, 3, 1201, 8),
    (10**9, 10**4, 10**8, 10**9 * 10**4 * 10**8 // 3600 + 1),  # huge: integer arithmetic, no float
])
def test_a_booking_costs_its_block_rounded_up_to_the_cent(price, num_gpus, duration_s, cents) -> None:
    got = cost.booking_cost_cents(booking_of(price=price, num_gpus=num_gpus, duration_s=duration_s))
    assert got == cents and isinstance(got, int)


def priced(cents_cost: int) -> Booking:
    """A booking whose block costs exactly `cents_cost`: one GPU for one hour at that price."""
    return booking_of(price=cents_cost, num_gpus=1, duration_s=3600)


@pytest.mark.parametrize(("spent", "cap", "allowed"), [
    (0, 1000, True),         # exactly the whole cap
    (1, 1000, False),        # one cent over it
    (400, 1400, True),       # exactly the remainder after earlier runs
    (401, 1400, False),      # one cent over the remainder
    (399, 1400, True),
])
def test_the_cap_admits_exactly_its_remainder(spent, cap, allowed) -> None:
    budget = Budget(cap_cents=cap, max_incremental_cents=1000)
    if allowed:
        assert cost.training_cost_cents(priced(1000), budget, committed_cents=spent) == 1000
    else:
        with pytest.raises(ItoError) as info:
            cost.training_cost_cents(priced(1000), budget, committed_cents=spent)
        assert info.value.code is ErrorCode.BUDGET_EXCEEDED and "budget cap" in info.value.message


@pytest.mark.parametrize(("max_incremental", "allowed"), [(1000, True), (999, False), (1001, True)])
def test_the_maximum_incremental_cost_admits_exactly_itself(max_incremental, allowed) -> None:
    budget = Budget(cap_cents=10_000, max_incremental_cents=max_incremental)
    if allowed:
        assert cost.training_cost_cents(priced(1000), budget, committed_cents=0) == 1000
    else:
        with pytest.raises(ItoError) as info:
            cost.training_cost_cents(priced(1000), budget, committed_cents=0)
        assert info.value.code is ErrorCode.BUDGET_EXCEEDED and "incremental" in info.value.message


# --- the same boundaries through the ledger: confirm request, then train --------------------------

def train(world, ref: str, key: str, manifest):
    request = TrainRequest(booking_id=world.booking_id, verified=manifest, confirmation_ref=ref, idempotency_key=key)
    return create_run.create_run(world.ledger, world.policy, world.account, request)


def counts(world) -> tuple[int, int]:
    """(runs, consumed confirmations) in the ledger."""
    with world.ledger.read() as conn:
        num_runs = conn.execute(sa.select(sa.func.count()).select_from(runs_table)).scalar_one()
        consumed = conn.execute(sa.select(sa.func.count()).select_from(confirmations_table)
                                .where(confirmations_table.c.consumed_at.is_not(None))).scalar_one()
    return num_runs, consumed


def code_of(call) -> ErrorCode:
    with pytest.raises(ItoError) as info:
        call()
    return info.value.code


@pytest.mark.parametrize("num_bookings", [1, 3])
def test_runs_that_spend_exactly_the_cap_are_created_and_one_cent_less_refuses_the_last(world, num_bookings) -> None:
    exact = verified(manifest_bytes(budget__cap_cents=COST * num_bookings, budget__max_incremental_cents=COST))
    for number in range(num_bookings):
        if number:
            world.booking_id = world.booking()
        train(world, world.confirm_train(manifest=exact), f"key-exact-{number:04d}", exact)
    assert counts(world) == (num_bookings, num_bookings)
    world.booking_id = world.booking()
    assert code_of(lambda: world.confirm_train(manifest=exact)) is ErrorCode.BUDGET_EXCEEDED

    cap = COST * num_bookings - 1
    short = verified(manifest_bytes(budget__cap_cents=cap, budget__max_incremental_cents=min(cap, COST)))
    for number in range(num_bookings - 1):
        world.booking_id = world.booking()
        train(world, world.confirm_train(manifest=short), f"key-short-{number:04d}", short)
    world.booking_id = world.booking()
    assert code_of(lambda: world.confirm_train(manifest=short)) is ErrorCode.BUDGET_EXCEEDED
    assert counts(world) == (2 * num_bookings - 1, 2 * num_bookings - 1)


def test_a_confirmation_issued_within_the_cap_is_refused_at_train_once_another_run_spent_it(world) -> None:
    """Both confirmations were within the cap when issued; the first run spends it, so the second
    train is refused by the cap and consumes nothing: no run, the confirmation still unused."""
    capped = verified(manifest_bytes(budget__cap_cents=2 * COST - 1, budget__max_incremental_cents=COST))
    first = world.confirm_train(manifest=capped)
    first_booking = world.booking_id
    world.booking_id = world.booking()
    second = world.confirm_train(manifest=capped)
    second_booking = world.booking_id
    world.booking_id = first_booking
    train(world, first, "key-first-0001", capped)
    world.booking_id = second_booking
    assert code_of(lambda: train(world, second, "key-second-001", capped)) is ErrorCode.BUDGET_EXCEEDED
    assert counts(world) == (1, 1)


def test_gate_failed_runs_give_their_spend_back_to_the_cap(world) -> None:
    capped = verified(manifest_bytes(budget__cap_cents=COST, budget__max_incremental_cents=COST))
    created = train(world, world.confirm_train(manifest=capped), "key-gatefail-1", capped)
    with world.ledger.write() as conn:
        conn.execute(runs_table.update().where(runs_table.c.run_id == created.run.run_id).values(state="gate_failed"))
    world.booking_id = world.booking()
    assert world.confirm_train(manifest=capped)


# --- a run that ended after its training started keeps its cost; one that did not gives it back ---

def _end(world, run_id: str, path: tuple[str, ...]) -> None:
    """Move a run along `path` through the state machine, as the Dagster shell reports it;
    "trained" is a stage launching its workers (`runs.mark_training_started`)."""
    from ito_assets.control import runs
    from ito_assets.control.states import RunState

    for state in path:
        world.clock.now += 1
        if state == "trained":
            runs.mark_training_started(world.ledger, run_id)
        else:
            runs.set_state(world.ledger, run_id, RunState(state), reason="EVAL_GATE_FAILED" if state == "gate_failed" else None)


# (path to its end, cap in runs, whether a third run fits): a run whose training started keeps its
# cost however it ends; a run no stage of which launched gives it back.
GATE_FAILED_AFTER = [
    (("running", "trained", "gate_failed"), 2, False),                # an eval gate after pretraining: cap exactly two runs
    (("running", "trained", "gate_failed"), 3, True),                 # one run's room more: the third fits
    (("running", "trained", "cancelling", "gate_failed"), 2, False),  # cancel asked while training, then a gate
    (("running", "gate_failed"), 2, True),                            # running, but the data decision or plan refused
    (("gate_failed",), 2, True),                                      # refused before running: cost given back
    (("cancelling", "gate_failed"), 2, True),                         # cancel asked while queued, never started
    (("cancelled",), 2, True),                                        # cancelled while queued: nothing trained
    (("running", "cancelling", "cancelled"), 2, True),                # cancelled before its first stage launched
    (("running", "trained", "cancelling", "cancelled"), 2, False),    # cancelled while training: spent
    (("failed",), 2, True),                                           # a fault before any stage launched
    (("running", "trained", "failed"), 2, False),                     # a fault while training: spent
    (("running", "trained", "succeeded"), 2, False),
]


@pytest.mark.parametrize(("path", "cap_runs", "third_fits"), GATE_FAILED_AFTER,
                         ids=["-".join(p) + f"-cap{c}" for p, c, _ in GATE_FAILED_AFTER])
def test_a_run_that_started_keeps_its_cost_whatever_its_end_and_one_that_did_not_gives_it_back(world, path, cap_runs,
                                                                                                third_fits) -> None:
    from ito_assets.control import budget

    capped = verified(manifest_bytes(budget__cap_cents=cap_runs * COST, budget__max_incremental_cents=COST))
    first = train(world, world.confirm_train(manifest=capped), "key-started-01", capped).run
    world.booking_id = world.booking()
    train(world, world.confirm_train(manifest=capped), "key-started-02", capped)
    _end(world, first.run_id, path)
    started = "trained" in path
    with world.ledger.read() as conn:
        state = budget.state(conn, world.account.account_id, capped.digest, capped.manifest.budget)
    assert (state.spent_cents, state.reserved_cents, state.num_runs) == (
        (COST, COST, 2) if started else (0, COST, 1))
    world.booking_id = world.booking()
    if third_fits:
        train(world, world.confirm_train(manifest=capped), "key-started-03", capped)
        assert counts(world) == (3, 3)
    else:
        assert code_of(lambda: world.confirm_train(manifest=capped)) is ErrorCode.BUDGET_EXCEEDED
        assert counts(world) == (2, 2)


def test_a_confirmation_issued_before_the_started_run_gate_failed_is_refused_at_train(world) -> None:
    """The cap is summed again under the budget lock at train: a run that gate-failed after starting
    still counts there, so a confirmation issued while the cap had room cannot overspend it."""
    capped = verified(manifest_bytes(budget__cap_cents=2 * COST, budget__max_incremental_cents=COST))
    first = train(world, world.confirm_train(manifest=capped), "key-before-001", capped).run
    bookings_and_refs = []
    for _ in range(2):  # both issued while one run was committed: each had room then
        world.booking_id = world.booking()
        bookings_and_refs.append((world.booking_id, world.confirm_train(manifest=capped)))
    (second_booking, second_ref), (third_booking, third_ref) = bookings_and_refs
    world.booking_id = second_booking
    train(world, second_ref, "key-before-002", capped)
    _end(world, first.run_id, ("running", "trained", "gate_failed"))
    world.booking_id = third_booking
    assert code_of(lambda: train(world, third_ref, "key-before-003", capped)) is ErrorCode.BUDGET_EXCEEDED
    assert counts(world) == (2, 2)


def test_started_at_is_set_when_a_stage_launches_and_never_moved(world) -> None:
    from ito_assets.control import audit, runs

    run = train(world, world.confirm_train(), "key-startedat1", verified()).run
    assert run.started_at is None and run.to_dict()["started_at"] is None
    world.clock.now = T0 + 10
    assert runs.set_state(world.ledger, run.run_id, runs.RunState.RUNNING).started_at is None  # gates may still refuse
    world.clock.now = T0 + 15
    assert runs.mark_training_started(world.ledger, run.run_id).started_at == T0 + 15
    world.clock.now = T0 + 20
    assert runs.mark_training_started(world.ledger, run.run_id).started_at == T0 + 15  # a later stage keeps it
    assert runs.set_state(world.ledger, run.run_id, runs.RunState.CANCELLING).started_at == T0 + 15
    world.clock.now = T0 + 30
    done = runs.set_state(world.ledger, run.run_id, runs.RunState.GATE_FAILED, reason="EVAL_GATE_FAILED")
    assert (done.started_at, runs.get(world.ledger, run.run_id).started_at) == (T0 + 15, T0 + 15)
    marks = [e for e in audit.events(world.ledger, subject=run.run_id) if e.kind == "run_training_started"]
    assert [e.at for e in marks] == [T0 + 15]  # audited once