"""What a manifest has spent is visible: an account's runs, filtered and paged; each manifest's
budget (cap, spent, reserved, left) from the query the budget gate uses; and a quote that prices
a train exactly as its confirmation will, without issuing one."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gate_world import COST, manifest_bytes, new_run, verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import budget, confirm_request, runs
from ito_assets.control.ledger import audit_events, confirmations
from ito_assets.control.states import RunState

CAP = 10 * COST
OTHER = manifest_bytes(budget__cap_cents=CAP, budget__max_incremental_cents=COST)


def code_of(call) -> ErrorCode:
    with pytest.raises(ItoError) as raised:
        call()
    return raised.value.code


def _end(world, run, state: RunState) -> None:
    """Run, train (a stage launched: its cost stays spent) and end."""
    runs.set_state(world.ledger, run.run_id, RunState.RUNNING)
    runs.mark_training_started(world.ledger, run.run_id)
    runs.set_state(world.ledger, run.run_id, state)


def test_runs_are_listed_oldest_first_filtered_and_paged(world) -> None:
    made = []
    for offset in range(5):
        world.clock.now += 1
        made.append(new_run(world, booking_id=world.booking(), content=OTHER if offset == 4 else None))
    _end(world, made[0], RunState.SUCCEEDED)
    rival = new_run(world, account=world.other, booking_id=world.booking(account=world.other))
    account = world.account.account_id
    ids = lambda listed: [r.run_id for r in listed]  # noqa: E731
    assert ids(runs.list_for(world.ledger, account)) == [r.run_id for r in made]
    assert rival.run_id not in ids(runs.list_for(world.ledger, account))
    assert ids(runs.list_for(world.ledger, account, manifest_digest=verified(OTHER).digest)) == [made[4].run_id]
    assert ids(runs.list_for(world.ledger, account, booking_id=made[2].booking_id)) == [made[2].run_id]
    assert ids(runs.list_for(world.ledger, account, state=RunState.SUCCEEDED)) == [made[0].run_id]
    first = runs.list_for(world.ledger, account, limit=2)
    second = runs.list_for(world.ledger, account, limit=2, after=first[-1].run_id)
    third = runs.list_for(world.ledger, account, limit=2, after=second[-1].run_id)
    assert ids(first + second + third) == [r.run_id for r in made] and len(third) == 1
    assert runs.list_for(world.ledger, account, after=made[-1].run_id) == []


def test_runs_created_in_the_same_second_page_by_run_id(world) -> None:
    made = sorted((new_run(world, booking_id=world.booking()) for _ in range(3)), key=lambda r: r.run_id)
    account = world.account.account_id
    pages = [runs.list_for(world.ledger, account, limit=1)]
    while pages[-1]:
        pages.append(runs.list_for(world.ledger, account, limit=1, after=pages[-1][-1].run_id))
    assert [page[0].run_id for page in pages if page] == [r.run_id for r in made]


@pytest.mark.parametrize(("limit", "ok"), [(0, False), (1, True), (runs.MAX_PAGE, True), (runs.MAX_PAGE + 1, False)])
def test_the_page_size_is_bounded(world, limit, ok) -> None:
    call = lambda: runs.list_for(world.ledger, world.account.account_id, limit=limit)  # noqa: E731
    if ok:
        assert call() == []
    else:
        assert code_of(call) is ErrorCode.USAGE_ERROR


def test_another_accounts_run_is_no_cursor(world) -> None:
    rival = new_run(world, account=world.other, booking_id=world.booking(account=world.other))
    assert code_of(lambda: runs.list_for(world.ledger, world.account.account_id, after=rival.run_id)) \
        is ErrorCode.RUN_NOT_FOUND


def test_a_manifests_budget_is_read_from_the_stored_bytes_and_split_by_state(world) -> None:
    ended, active, stopped = (new_run(world, booking_id=world.booking(), content=OTHER) for _ in range(3))
    _end(world, ended, RunState.SUCCEEDED)
    runs.set_state(world.ledger, stopped.run_id, RunState.GATE_FAILED)
    with world.ledger.read() as conn:
        [state] = budget.states_for(conn, world.account.account_id)
    assert state.to_dict() == {
        "manifest_digest": verified(OTHER).digest, "cap_cents": CAP, "max_incremental_cents": COST,
        "spent_cents": COST, "reserved_cents": COST, "num_runs": 2, "committed_cents": 2 * COST,
        "left_cents": CAP - 2 * COST}
    assert active.state is RunState.QUEUED


def test_budgets_are_per_manifest_and_per_account(world) -> None:
    new_run(world, booking_id=world.booking(), content=OTHER)
    new_run(world, booking_id=world.booking())
    new_run(world, account=world.other, booking_id=world.booking(account=world.other))
    with world.ledger.read() as conn:
        mine = budget.states_for(conn, world.account.account_id)
        named = budget.states_for(conn, world.account.account_id, verified(OTHER).digest)
        theirs = budget.states_for(conn, world.other.account_id)
        assert code_of(lambda: budget.states_for(conn, world.other.account_id, verified(OTHER).digest)) \
            is ErrorCode.RUN_NOT_FOUND
    assert sorted(s.manifest_digest for s in mine) == sorted([verified(OTHER).digest, verified().digest])
    assert [s.cap_cents for s in named] == [CAP] and all(s.committed_cents == COST for s in mine)
    assert [s.num_runs for s in theirs] == [1]


def _counts(world) -> tuple[int, int]:
    with world.ledger.read() as conn:
        return tuple(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                     for t in (confirmations, audit_events))


def test_a_quote_prices_exactly_what_the_confirmation_binds_and_issues_nothing(world) -> None:
    manifest = verified(OTHER)
    new_run(world, booking_id=world.booking(), content=OTHER)
    before = _counts(world)
    quote = confirm_request.quote_train(world.ledger, world.policy, world.account, world.booking_id, manifest)
    assert _counts(world) == before
    issued = confirm_request.request_train(world.ledger, world.policy, world.account, world.booking_id, manifest)
    assert quote.cost_cents == issued.confirmation.cost_cents == COST
    assert quote.to_dict()["budget"]["committed_cents"] == COST and quote.budget.left_cents == CAP - COST
    assert quote.to_dict()["confirmation_issued"] is False and quote.to_dict()["workload_created"] is False
    assert quote.booking.booking_id == world.booking_id


def test_a_quote_refuses_what_the_confirmation_would_refuse(world) -> None:
    tight = verified(manifest_bytes(budget__cap_cents=COST, budget__max_incremental_cents=COST))
    new_run(world, booking_id=world.booking(), content=tight.raw.data)
    quote = lambda: confirm_request.quote_train(world.ledger, world.policy, world.account, world.booking_id, tight)  # noqa: E731
    confirm = lambda: confirm_request.request_train(world.ledger, world.policy, world.account, world.booking_id, tight)  # noqa: E731
    assert code_of(quote) is code_of(confirm) is ErrorCode.BUDGET_EXCEEDED
    assert code_of(lambda: confirm_request.quote_train(world.ledger, world.policy, world.other, world.booking_id,
                                                       tight)) is ErrorCode.BOOKING_NOT_FOUND
