"""What a training run is charged, in integer US cents: the whole booked block it runs on
(price per GPU-hour x GPUs x booked hours), which is what the account bought. The window, not the
clock, sets the hours, so the same request always costs the same and a confirmation's cost can be
compared to the cent. The arithmetic is the planner's (training/cost.py), so a plan and a
confirmation priced for the same booking agree.
"""

from __future__ import annotations

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control.bookings import Booking
from ito_assets.manifest.schema import Budget
from ito_assets.training.cost import cost_cents


def booking_cost_cents(booking: Booking) -> int:
    """Rounded up to the next cent: a price quoted to a human is never below what is charged."""
    return cost_cents(booking.num_gpus, booking.duration_s, booking.price_per_gpu_hour_cents)


def training_cost_cents(booking: Booking, budget: Budget, *, committed_cents: int) -> int:
    """The cost a train confirmation binds, refused when above the manifest's maximum incremental
    cost or when it would take what the manifest's runs committed so far above its cap."""
    cost = booking_cost_cents(booking)
    if cost > budget.max_incremental_cents:
        raise ItoError(ErrorCode.BUDGET_EXCEEDED, "the run's cost exceeds the manifest's maximum incremental cost")
    if committed_cents + cost > budget.cap_cents:
        raise ItoError(ErrorCode.BUDGET_EXCEEDED, "the run's cost would exceed the manifest's budget cap")
    return cost
