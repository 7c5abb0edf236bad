"""Cancellation as a caller leans on it: every refusal answers its documented code and leaves its
own audit event (as a refused train does), a replay answers the same, two threads with one key
cancel once, the budget counts a run once whatever is asked of it, and a run on a revoked
booking can still be cancelled. A refused cleanup is audited the same way."""

from __future__ import annotations


import pytest

from gate_world import at_once, new_run
from test_lifecycle_boundaries import (cancel_ref, cleanup_ref, clean, code_of, do_cancel, events, finish,
                                       key_record, run_row, untouched)
from ito_assets.errors import ErrorCode
from ito_assets.control import bookings, budget, cleanup, confirm_request, runs
from ito_assets.control.states import RunState


def _refusals(world, kind: str = "run_cancel_refused") -> list[tuple]:
    return [(e.code, e.subject, e.account_id, e.detail.get("idempotency_key")) for e in events(world, kind)]


def test_every_refused_cancel_answers_its_code_and_is_audited(world) -> None:
    run = new_run(world)
    me = world.account.account_id
    other = new_run(world, booking_id=world.booking())
    mismatched = cancel_ref(world, other.run_id)
    rival_ref = cancel_ref(world, new_run(world, account=world.other,
                                          booking_id=world.booking(account=world.other)).run_id, world.other)
    unapproved = confirm_request.request_cancel(world.ledger, world.policy, world.account, run.run_id).ref
    expiring = cancel_ref(world, run.run_id)
    cases = [
        (lambda: do_cancel(world, run.run_id, mismatched, "cancel-key-0001"), ErrorCode.CONFIRMATION_MISMATCH),
        (lambda: do_cancel(world, run.run_id, rival_ref, "cancel-key-0002"), ErrorCode.CONFIRMATION_INVALID),
        (lambda: do_cancel(world, run.run_id, unapproved, "cancel-key-0003"), ErrorCode.CONFIRMATION_NOT_APPROVED),
        (lambda: do_cancel(world, run.run_id, "cfr_" + "0" * 26, "cancel-key-0004"), ErrorCode.CONFIRMATION_INVALID),
    ]
    for call, code in cases:
        assert code_of(call) is code
    world.clock.now += world.policy.confirmation_ttl_s
    assert code_of(lambda: do_cancel(world, run.run_id, expiring, "cancel-key-0005")) is ErrorCode.CONFIRMATION_EXPIRED
    assert run_row(world, run.run_id)["state"] == "queued" and untouched(world, mismatched)
    assert all(key_record(world, f"cancel-key-000{i}") is None for i in range(1, 6))
    assert _refusals(world) == [
        ("CONFIRMATION_MISMATCH", run.run_id, me, "cancel-key-0001"),
        ("CONFIRMATION_INVALID", run.run_id, me, "cancel-key-0002"),
        ("CONFIRMATION_NOT_APPROVED", run.run_id, me, "cancel-key-0003"),
        ("CONFIRMATION_INVALID", run.run_id, me, "cancel-key-0004"),
        ("CONFIRMATION_EXPIRED", run.run_id, me, "cancel-key-0005"),
    ]
    assert events(world, "run_cancel_requested") == []


def test_refusals_after_the_run_ended_or_of_another_account_are_audited_too(world) -> None:
    run = new_run(world)
    ref = cancel_ref(world, run.run_id)
    done = do_cancel(world, run.run_id, ref, "cancel-key-0001")
    assert done.run.state is RunState.CANCELLED
    assert code_of(lambda: do_cancel(world, run.run_id, ref, "cancel-key-0002")) is ErrorCode.CONFIRMATION_CONSUMED
    live = new_run(world)
    assert code_of(lambda: do_cancel(world, live.run_id, cancel_ref(world, live.run_id), "cancel-key-0001")) \
        is ErrorCode.IDEMPOTENCY_KEY_REUSED
    rival_run = new_run(world, account=world.other, booking_id=world.booking(account=world.other))
    assert code_of(lambda: do_cancel(world, rival_run.run_id, cancel_ref(world, live.run_id), "cancel-key-0003")) \
        is ErrorCode.RUN_NOT_FOUND
    assert code_of(lambda: do_cancel(world, "../../etc/passwd", ref, "cancel-key-0004")) is ErrorCode.RUN_NOT_FOUND
    finished = new_run(world, booking_id=world.booking())
    late_ref = cancel_ref(world, finished.run_id)
    finish(world, finished)
    assert code_of(lambda: do_cancel(world, finished.run_id, late_ref, "cancel-key-0005")) is ErrorCode.RUN_FINISHED
    me = world.account.account_id
    assert _refusals(world) == [
        ("CONFIRMATION_CONSUMED", run.run_id, me, "cancel-key-0002"),
        ("IDEMPOTENCY_KEY_REUSED", live.run_id, me, "cancel-key-0001"),
        ("RUN_NOT_FOUND", rival_run.run_id, me, "cancel-key-0003"),
        ("RUN_NOT_FOUND", None, me, "cancel-key-0004"),  # caller text never reaches the trail
        ("RUN_FINISHED", finished.run_id, me, "cancel-key-0005"),
    ]
    # The replay of the first key is still the first answer, and leaves no new event.
    seen = len(events(world, "run_cancel_requested")) + len(events(world, "run_cancel_refused"))
    again = do_cancel(world, run.run_id, "cfr_" + "0" * 26, "cancel-key-0001")
    assert again.replayed is True and again.run.state is RunState.CANCELLED
    assert len(events(world, "run_cancel_requested")) + len(events(world, "run_cancel_refused")) == seen


def test_an_invalid_key_is_refused_before_anything_is_written(world) -> None:
    run = new_run(world)
    assert code_of(lambda: do_cancel(world, run.run_id, cancel_ref(world, run.run_id), "ghp_" + "a" * 36)) \
        is ErrorCode.IDEMPOTENCY_KEY_INVALID
    assert _refusals(world) == []


def test_two_threads_with_one_key_cancel_once_and_answer_alike(world) -> None:
    run = new_run(world)
    runs.attach_dagster_run(world.ledger, run.run_id, "dagster-1")
    ref = cancel_ref(world, run.run_id)
    answers = at_once(*[lambda: do_cancel(world, run.run_id, ref, "cancel-key-0001")] * 2)
    assert sorted(a.replayed for a in answers) == [False, True]
    assert {a.run.state for a in answers} == {RunState.CANCELLING}
    assert len(events(world, "run_cancel_requested")) == 1 and len(events(world, "run_cancelling")) == 1
    assert _refusals(world) == []


@pytest.mark.parametrize("launched", [False, True])
def test_the_budget_counts_a_cancelled_run_once_however_often_it_is_cancelled(world, launched) -> None:
    run = new_run(world)
    if launched:
        runs.attach_dagster_run(world.ledger, run.run_id, "dagster-1")
    do_cancel(world, run.run_id, cancel_ref(world, run.run_id), "cancel-key-0001")
    do_cancel(world, run.run_id, "cfr_" + "0" * 26, "cancel-key-0001")
    if launched:  # cancelling: a second key with its own confirmation is recorded, not counted again
        do_cancel(world, run.run_id, cancel_ref(world, run.run_id), "cancel-key-0002")
    with world.ledger.read() as conn:
        spent, reserved, count = budget.committed(conn, world.account.account_id, run.manifest_digest)
    if launched:  # cancelling, still active: its cost reserved once
        assert (spent, reserved, count) == (0, run.cost_cents, 1)
    else:  # cancelled before any stage launched: it trained nothing, so its cost is given back
        assert (spent, reserved, count) == (0, 0, 0)


def test_a_run_on_a_revoked_booking_can_still_be_cancelled(world) -> None:
    run = new_run(world)
    ref = cancel_ref(world, run.run_id)
    bookings.transition(world.ledger, world.booking_id, "revoke", actor=world.desk.token_id)
    done = do_cancel(world, run.run_id, ref, "cancel-key-0001")
    assert done.run.state is RunState.CANCELLED and _refusals(world) == []


def test_a_refused_cleanup_is_audited(world) -> None:
    rival_ref = cleanup_ref(world, world.other)
    assert code_of(lambda: clean(world, rival_ref, "clean-key-0001")) is ErrorCode.CONFIRMATION_INVALID
    release = cleanup.Release(booking_id="not-a-booking", confirmation_ref=rival_ref)
    assert code_of(lambda: clean(world, cleanup_ref(world), "clean-key-0002", release=release)) \
        is ErrorCode.BOOKING_NOT_FOUND
    me = world.account.account_id
    assert _refusals(world, "tenant_cleanup_refused") == [
        ("CONFIRMATION_INVALID", me, me, "clean-key-0001"), ("BOOKING_NOT_FOUND", me, me, "clean-key-0002")]
    assert [e.detail["release_booking_id"] for e in events(world, "tenant_cleanup_refused")] == [None, None]
    assert events(world, "tenant_cleaned") == []
