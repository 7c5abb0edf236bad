"""Capacity in time: a train is confirmed and created only when the manifest's plan on the
booking's own hardware ends inside what is left of the booked window. The block is what is charged,
so a longer plan would be confirmed, charged and then cut off."""

from __future__ import annotations

import math

import pytest

from gate_world import T0, TERMS, manifest_bytes, verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import confirm_request, create_run, validation
from ito_assets.control.bookings import load
from ito_assets.training.run_plan import booked_hardware, plan_run

# proxy-150m on 3B tokens: about 20 minutes on the booking's 8 H100s, so the window decides.
LONG = manifest_bytes(model__size="proxy-150m", training_target__num_tokens=3_000_000_000,
                      training_target__stages__0__num_tokens=2_000_000_000,
                      training_target__stages__1__num_tokens=1_000_000_000)


def code_of(call) -> ErrorCode:
    with pytest.raises(ItoError) as raised:
        call()
    return raised.value.code


def planned_wall_s(content: bytes = LONG) -> float:
    hardware = booked_hardware(gpu_type=TERMS["gpu_type"], topology=TERMS["topology"], network=TERMS["network"], num_nodes=TERMS["num_nodes"],
                               num_gpus=TERMS["num_gpus"], price_per_gpu_hour_cents=TERMS["price_per_gpu_hour_cents"])
    return plan_run(verified(content).manifest, hardware, pair_shapes={}).wall_seconds  # RLVR: no pair file


def test_the_window_left_is_all_of_it_before_it_begins_and_what_remains_after() -> None:
    assert [validation.window_left_s(T0 + 100, T0 + 1100, now) for now in (T0, T0 + 100, T0 + 101, T0 + 1099, T0 + 1100, T0 + 5000)] \
        == [1000, 1000, 999, 1, 0, 0]


def load_booking(world, booking_id: str):
    with world.ledger.read() as conn:
        return load(conn, booking_id)


@pytest.mark.parametrize("spare", [1, 0, -1])
def test_a_plan_fits_a_window_exactly_as_long_and_not_one_second_shorter(world, spare: int) -> None:
    wall = planned_wall_s()
    assert wall != int(wall) and wall > 600  # the boundary below is a whole second inside the plan's length
    booking = load_booking(world, world.booking(ends_at=T0 + math.ceil(wall) + spare))
    manifest = verified(LONG).manifest
    if spare >= 0:
        assert validation.check_plan_fits(manifest, booking, now=T0, pair_shapes={}).wall_seconds == wall
        return
    with pytest.raises(ItoError) as refused:
        validation.check_plan_fits(manifest, booking, now=T0, pair_shapes={})
    assert refused.value.code is ErrorCode.CAPACITY_UNAVAILABLE and not refused.value.retryable
    assert f"({math.ceil(wall):,} s)" in refused.value.message and f"({math.ceil(wall) - 1:,} s) left" in refused.value.message


def test_a_confirmation_is_refused_for_a_window_too_short_and_nothing_is_issued(world) -> None:
    short = world.booking(ends_at=T0 + math.floor(planned_wall_s()))
    assert code_of(lambda: world.confirm_train(short, verified(LONG))) is ErrorCode.CAPACITY_UNAVAILABLE
    assert code_of(lambda: confirm_request.quote_train(world.ledger, world.policy, world.account, short,
                                                       verified(LONG))) is ErrorCode.CAPACITY_UNAVAILABLE
    with world.ledger.read() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM confirmations").scalar() == 0


def test_a_quote_shows_the_plans_time_beside_the_window_left(world) -> None:
    booking = world.booking(ends_at=T0 + 4 * 3600)  # the plan, RLVR's generation and evaluations included: 3 h
    quote = confirm_request.quote_train(world.ledger, world.policy, world.account, booking, verified(LONG))
    assert quote.to_dict()["time"] == {"planned_wall_seconds": round(planned_wall_s(), 3),
                                       "window_left_seconds": 4 * 3600, "post_training_included": True}
    assert quote.to_dict()["plan"]["post_training"] == [p.to_dict() for p in quote.run_plan.post_training]
    assert [p["stage"] for p in quote.to_dict()["plan"]["post_training"]] == ["rlvr"]


def test_a_run_confirmed_in_time_is_not_created_once_the_window_left_is_too_short(world) -> None:
    """Confirmed with the plan fitting; the clock then moves so that it no longer does: the train is
    refused, no run exists and the confirmation stays unconsumed."""
    wall = planned_wall_s()
    booking_id = world.booking(ends_at=T0 + math.ceil(wall))
    ref = world.confirm_train(booking_id, verified(LONG))
    world.clock.now = T0 + 1
    request = create_run.TrainRequest(booking_id=booking_id, verified=verified(LONG), confirmation_ref=ref,
                                      idempotency_key="train-window-moved")
    assert code_of(lambda: create_run.create_run(world.ledger, world.policy, world.account, request)) \
        is ErrorCode.CAPACITY_UNAVAILABLE
    with world.ledger.read() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM runs").scalar() == 0
        assert conn.exec_driver_sql("SELECT count(*) FROM confirmations WHERE consumed_at IS NULL").scalar() == 1


@pytest.mark.parametrize(("terms", "content"), [
    ({"gpu_type": "TPUv5"}, None),  # no GPU the planner can price
    ({"network": "myrinet"}, None),  # no network it knows
    ({"network": "ib-fast"}, None),  # a speed it cannot read
    ({}, manifest_bytes(model__size="gpt-5")),  # no model size it knows
])
def test_a_booking_or_manifest_the_planner_cannot_plan_is_refused_before_confirmation(world, terms, content) -> None:
    booking_id = world.booking(**terms)
    assert code_of(lambda: world.confirm_train(booking_id, verified(content))) is ErrorCode.PLAN_REFUSED
