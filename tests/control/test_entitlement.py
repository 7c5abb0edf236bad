"""Gate 1: only a completed, unexpired booking of the caller's own account entitles."""

from __future__ import annotations

import pytest

from gate_world import T0, manifest_bytes, verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import bookings, confirm_request, entitlement


def refused(world, booking_id: str, account=None) -> ErrorCode:
    with pytest.raises(ItoError) as info:
        confirm_request.request_train(world.ledger, world.policy, account or world.account, booking_id, verified())
    return info.value.code


def test_completed_booking_gives_an_eligibility_bound_to_its_terms(world) -> None:
    booking = bookings.get(world.ledger, world.booking_id)
    got = entitlement.eligibility(booking, world.account.account_id, T0)
    assert (got.booking_id, got.account_id, got.region, got.network, got.topology) == (
        world.booking_id, world.account.account_id, "eu-west", "ib-400g", "1x8-nvlink")
    assert got.duration_s == 7200 and got.booking_revision == 1


@pytest.mark.parametrize("verb, code", [("revoke", ErrorCode.BOOKING_REVOKED), ("release", ErrorCode.BOOKING_RELEASED)])
def test_revoked_and_released_bookings_fail_closed(world, verb, code) -> None:
    bookings.transition(world.ledger, world.booking_id, verb, actor=None)
    assert refused(world, world.booking_id) is code


def test_pending_booking_is_incomplete(world) -> None:
    assert refused(world, world.booking(complete=False)) is ErrorCode.BOOKING_INCOMPLETE


def test_booking_expires_at_its_end_to_the_second(world) -> None:
    world.clock.now = T0 + 3600 - 1
    instant = verified(manifest_bytes(post_training=[]))  # a plan of well under the second left
    confirm_request.request_train(world.ledger, world.policy, world.account, world.booking_id, instant)
    world.clock.now = T0 + 3600
    assert refused(world, world.booking_id) is ErrorCode.BOOKING_EXPIRED


def test_unknown_and_foreign_bookings_look_the_same(world) -> None:
    assert refused(world, "bkg_" + "0" * 26) is ErrorCode.BOOKING_NOT_FOUND
    assert refused(world, world.booking_id, account=world.other) is ErrorCode.BOOKING_NOT_FOUND


def test_desk_identity_cannot_request_training(world) -> None:
    assert refused(world, world.booking_id, account=world.desk) is ErrorCode.PERMISSION_DENIED


def test_amendment_moves_the_revision_and_validates_terms(world) -> None:
    amended = bookings.amend(world.ledger, world.booking_id, {"region": "us-east"}, actor=None)
    assert amended.revision == 2 and amended.region == "us-east"
    with pytest.raises(ItoError) as info:
        bookings.amend(world.ledger, world.booking_id, {"ends_at": T0 - 7200}, actor=None)
    assert info.value.code is ErrorCode.USAGE_ERROR
    with pytest.raises(ItoError):
        bookings.amend(world.ledger, world.booking_id, {"num_gpus": 1}, actor=None)


def test_state_transitions_are_checked(world) -> None:
    bookings.transition(world.ledger, world.booking_id, "release", actor=None)
    with pytest.raises(ItoError) as info:
        bookings.transition(world.ledger, world.booking_id, "complete", actor=None)
    assert info.value.code is ErrorCode.BOOKING_RELEASED


# --- the window's start: nothing trains on a booking before it begins (to the second) ------------

START = T0 + 600  # a booking whose window begins ten minutes after the clock's "now"


def _future_booking(world) -> str:
    return world.booking(starts_at=START, ends_at=START + 7200)


@pytest.mark.parametrize("offset, allowed", [(-1, False), (0, True), (1, True)])
def test_confirm_and_train_need_the_window_begun(world, offset, allowed) -> None:
    from ito_assets.control import create_run

    booking_id = _future_booking(world)
    world.clock.now = START + offset
    if not allowed:
        with pytest.raises(ItoError) as info:
            world.confirm_train(booking_id)
        assert info.value.code is ErrorCode.BOOKING_NOT_STARTED and "starts at" in info.value.message
        assert info.value.retryable is False
        return
    ref = world.confirm_train(booking_id)
    request = create_run.TrainRequest(booking_id=booking_id, verified=verified(), confirmation_ref=ref,
                                      idempotency_key="key-window-0001")
    assert create_run.create_run(world.ledger, world.policy, world.account, request).run.booking_id == booking_id


@pytest.mark.parametrize("offset, allowed", [(-1, False), (0, True), (1, True)])
def test_train_rechecks_the_window_under_the_booking_lock(world, offset, allowed) -> None:
    """A confirmation computed once the window began, presented at a clock before it (a booking
    amended is a mismatch; here the clock moves): train itself refuses before starts_at."""
    from ito_assets.control import create_run
    from ito_assets.control.ledger import runs as runs_table

    booking_id = _future_booking(world)
    world.clock.now = START
    ref = world.confirm_train(booking_id)
    world.clock.now = START + offset
    request = create_run.TrainRequest(booking_id=booking_id, verified=verified(), confirmation_ref=ref,
                                      idempotency_key="key-window-0002")
    if allowed:
        assert create_run.create_run(world.ledger, world.policy, world.account, request).run.state.value == "queued"
        return
    with pytest.raises(ItoError) as info:
        create_run.create_run(world.ledger, world.policy, world.account, request)
    assert info.value.code is ErrorCode.BOOKING_NOT_STARTED
    with world.ledger.read() as conn:
        assert conn.execute(runs_table.select()).first() is None


@pytest.mark.parametrize("offset, allowed", [(-1, False), (0, True), (1, True)])
def test_the_training_jobs_reverification_needs_the_window_begun(world, offset, allowed) -> None:
    from gate_world import new_run
    from ito_assets.control import authorization

    booking_id = _future_booking(world)
    world.clock.now = START
    run = new_run(world, booking_id=booking_id)
    world.clock.now = START + offset
    if allowed:
        assert authorization.reverify(world.ledger, run.run_id).run_id == run.run_id
        return
    with pytest.raises(ItoError) as info:
        authorization.reverify(world.ledger, run.run_id)
    assert info.value.code is ErrorCode.BOOKING_NOT_STARTED


def test_a_quote_and_a_release_are_allowed_before_the_window_begins(world) -> None:
    from ito_assets.control import cleanup

    booking_id = _future_booking(world)
    world.clock.now = START - 1
    quote = confirm_request.quote_train(world.ledger, world.policy, world.account, booking_id, verified())
    assert quote.cost_cents > 0 and quote.to_dict()["confirmation_issued"] is False
    issued = confirm_request.request_release(world.ledger, world.policy, world.account, booking_id)
    world.approve(issued.ref)
    cleanup_ref = confirm_request.request_cleanup(world.ledger, world.policy, world.account).ref
    world.approve(cleanup_ref)
    done = cleanup.cleanup_tenant(world.ledger, world.policy, world.account, confirmation_ref=cleanup_ref,
                                  idempotency_key="key-release-0001",
                                  release=cleanup.Release(booking_id=booking_id, confirmation_ref=issued.ref))
    assert [b["booking_id"] for b in done["bookings_changed"]] == [booking_id]
