"""Bookings as the desk administers them: the terms' validation at each edge, what every change
records in the audit trail, and listings scoped to one account in a stable order."""

from __future__ import annotations

import pytest

from gate_world import TERMS, T0
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, bookings
from ito_assets.control.bookings import BookingTerms


def terms(**changes) -> BookingTerms:
    return BookingTerms(**{**TERMS, **changes})


@pytest.mark.parametrize(("changes", "valid"), [
    ({"num_gpus": 1, "num_nodes": 1}, True),
    ({"num_gpus": 0}, False),
    ({"num_gpus": -8}, False),
    ({"num_gpus": True, "num_nodes": 1}, False),     # a boolean is no count
    ({"num_gpus": 8.0}, False),
    ({"num_gpus": 8, "num_nodes": 2}, True),
    ({"num_gpus": 8, "num_nodes": 3}, False),         # 8 GPUs do not split over 3 nodes
    ({"num_nodes": 0}, False),
    ({"price_per_gpu_hour_cents": 1}, True),
    ({"price_per_gpu_hour_cents": 0}, False),
    ({"starts_at": T0, "ends_at": T0 + 1}, True),     # the shortest window: one second
    ({"starts_at": T0, "ends_at": T0}, False),
    ({"starts_at": T0, "ends_at": T0 - 1}, False),
    ({"starts_at": 0}, False),
    ({"region": "r" * 64}, True),                     # labels: 1-64 characters
    ({"region": "r" * 65}, False),
    ({"region": "r"}, True),
    ({"region": ""}, False),
    ({"region": "-eu"}, False),                       # must start with a letter or digit
    ({"region": "eu west"}, False),
    ({"network": 400}, False),
    ({"topology": "2x4_pcie:v1.2+a"}, True),
])
def test_booking_terms_at_each_edge(changes, valid) -> None:
    if valid:
        made = terms(**changes)
        assert all(getattr(made, k) == v for k, v in changes.items())
    else:
        with pytest.raises(ItoError) as info:
            terms(**changes)
        assert info.value.code is ErrorCode.USAGE_ERROR


def last_event(world, kind: str) -> audit.AuditEvent:
    return [e for e in audit.events(world.ledger, limit=10_000) if e.kind == kind][-1]


def test_create_complete_amend_and_revoke_are_audited_with_actor_subject_and_terms(world) -> None:
    booking = bookings.create(world.ledger, world.account.account_id, terms(), actor=world.desk.token_id)
    assert booking.booking_id.startswith("bkg_")
    created = last_event(world, "booking_created")
    assert (created.actor, created.account_id, created.subject, created.detail) == (
        world.desk.token_id, world.account.account_id, booking.booking_id, TERMS)

    bookings.transition(world.ledger, booking.booking_id, "complete", actor=world.desk.token_id)
    completed = last_event(world, "booking_completed")
    assert (completed.actor, completed.account_id, completed.subject, completed.detail) == (
        world.desk.token_id, world.account.account_id, booking.booking_id, {"previous_state": "pending"})

    world.clock.now = T0 + 5
    amended = bookings.amend(world.ledger, booking.booking_id, {"region": "us-east"}, actor=world.desk.token_id)
    event = last_event(world, "booking_amended")
    assert (event.actor, event.account_id, event.subject, event.at, event.detail) == (
        world.desk.token_id, world.account.account_id, booking.booking_id, T0 + 5,
        {"revision": 2, "region": "us-east"})
    assert (amended.region, amended.revision, amended.updated_at) == ("us-east", 2, T0 + 5)
    stored = bookings.get(world.ledger, booking.booking_id)
    assert (stored.region, stored.revision, stored.updated_at, stored.created_at) == ("us-east", 2, T0 + 5, T0)

    world.clock.now = T0 + 9
    revoked = bookings.transition(world.ledger, booking.booking_id, "revoke", actor=world.desk.token_id)
    assert (revoked.state.value, revoked.updated_at) == ("revoked", T0 + 9)
    assert bookings.get(world.ledger, booking.booking_id).updated_at == T0 + 9
    assert last_event(world, "booking_revoked").detail == {"previous_state": "completed"}


def test_a_booking_for_no_account_is_refused_and_nothing_is_audited(world) -> None:
    before = len(audit.events(world.ledger, limit=10_000))
    with pytest.raises(ItoError) as info:
        bookings.create(world.ledger, "acct_" + "0" * 26, terms(), actor=world.desk.token_id)
    assert info.value.code is ErrorCode.USAGE_ERROR
    assert len(audit.events(world.ledger, limit=10_000)) == before


@pytest.mark.parametrize("changes", [{}, {"num_gpus": 4}, {"region": "us-east", "account_id": "acct_x"}])
def test_an_amendment_changes_only_the_amendable_terms(world, changes) -> None:
    with pytest.raises(ItoError) as info:
        bookings.amend(world.ledger, world.booking_id, changes, actor=world.desk.token_id)
    assert info.value.code is ErrorCode.USAGE_ERROR
    assert bookings.get(world.ledger, world.booking_id).revision == 1


def test_an_amendment_is_validated_as_a_whole(world) -> None:
    with pytest.raises(ItoError):
        bookings.amend(world.ledger, world.booking_id, {"ends_at": TERMS["starts_at"]}, actor=None)
    assert bookings.get(world.ledger, world.booking_id).ends_at == TERMS["ends_at"]


def test_listings_are_one_accounts_in_creation_order(world) -> None:
    world.clock.now = T0 + 10
    second = world.booking()
    world.clock.now = T0 + 20
    theirs = world.booking(account=world.other)
    world.clock.now = T0 + 30
    third = world.booking()
    mine = [b.booking_id for b in bookings.list_for(world.ledger, world.account.account_id)]
    assert mine == [world.booking_id, second, third]
    assert [b.booking_id for b in bookings.list_for(world.ledger, world.other.account_id)] == [theirs]
    assert [b.booking_id for b in bookings.list_for(world.ledger)] == [world.booking_id, second, theirs, third]


def test_bookings_made_in_the_same_second_list_by_id(world) -> None:
    made = [world.booking() for _ in range(4)] + [world.booking_id]
    assert [b.booking_id for b in bookings.list_for(world.ledger, world.account.account_id)] == sorted(made)


def test_a_booking_as_the_desk_reads_it(world) -> None:
    booking = bookings.get(world.ledger, world.booking_id)
    assert booking.to_dict() == {**TERMS, "booking_id": world.booking_id, "account_id": world.account.account_id,
                                 "state": "completed", "revision": 1, "created_at": T0, "updated_at": T0,
                                 "duration_s": TERMS["ends_at"] - TERMS["starts_at"]}


@pytest.mark.parametrize(("verb", "state", "code"), [
    ("release", "pending", ErrorCode.BOOKING_INCOMPLETE),   # never completed: nothing to release
    ("complete", "revoked", ErrorCode.BOOKING_REVOKED),
    ("revoke", "released", ErrorCode.BOOKING_RELEASED),
])
def test_a_transition_from_the_wrong_state_names_that_state(world, verb, state, code) -> None:
    booking = world.booking(complete=False)
    if state == "revoked":
        bookings.transition(world.ledger, booking, "revoke", actor=None)
    elif state == "released":
        bookings.transition(world.ledger, booking, "complete", actor=None)
        bookings.transition(world.ledger, booking, "release", actor=None)
    with pytest.raises(ItoError) as info:
        bookings.transition(world.ledger, booking, verb, actor=None)
    assert info.value.code is code and bookings.get(world.ledger, booking).state.value == state
