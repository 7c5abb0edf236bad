"""Gate 1: only a completed, unexpired booking of the caller's own account entitles."""

from __future__ import annotations

import pytest

from gate_world import T0, verified
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
    confirm_request.request_train(world.ledger, world.policy, world.account, world.booking_id, verified())
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
