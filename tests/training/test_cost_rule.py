"""One pricing rule: the planner's compute cost and the gates' booked-block cost are the same
exact, rounded-up arithmetic, so a plan and a confirmation for one booking agree to the cent."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ito_assets.control.bookings import Booking
from ito_assets.control.cost import booking_cost_cents
from ito_assets.control.states import BookingState
from ito_assets.training.cost import cost_cents


def _booking(num_gpus: int, duration_s: int, price: int) -> Booking:
    return Booking(gpu_type="H100", num_gpus=num_gpus, num_nodes=1, topology="t", region="r", network="n",
                   starts_at=1, ends_at=1 + duration_s, price_per_gpu_hour_cents=price, booking_id="bkg_1",
                   account_id="acc_1", state=BookingState.COMPLETED, revision=1, created_at=1, updated_at=1)


@given(num_gpus=st.integers(1, 10**6), duration_s=st.integers(1, 10**12), price=st.integers(1, 10**12))
def test_a_booked_block_costs_what_the_planner_charges_for_its_gpu_seconds(num_gpus, duration_s, price) -> None:
    expected = -(-(num_gpus * duration_s * price) // 3600)  # integer ceiling, no float anywhere
    assert booking_cost_cents(_booking(num_gpus, duration_s, price)) == cost_cents(num_gpus, duration_s, price) == expected


@pytest.mark.parametrize(("seconds", "cents"), [(3599, 1), (3600, 1), (3601, 2), (0, 0), (7200, 2)])
def test_one_gpu_hour_at_one_cent_rounds_up_at_the_boundary(seconds, cents) -> None:
    assert cost_cents(1, seconds, 1) == cents


@pytest.mark.parametrize(("seconds", "cents"), [(0.1, 1), (0.1 + 1e-12, 2), (0.3, 3), (0.1 + 0.2, 4)])
def test_float_seconds_are_priced_by_their_shortest_decimal(seconds, cents) -> None:
    # 0.1 + 0.2 is 0.30000000000000004, a hair above 0.3: charged the next cent, never less.
    assert cost_cents(1, seconds, 36_000) == cents


@pytest.mark.parametrize(("num_gpus", "seconds", "price"), [(0, 1, 1), (1, -1, 1), (1, 1, -1)])
def test_nonsense_inputs_are_refused(num_gpus, seconds, price) -> None:
    with pytest.raises(ValueError):
        cost_cents(num_gpus, seconds, price)
