"""What compute costs, in integer US cents, from the booking's price per GPU-hour: the one
pricing rule, used by the planner for the compute a run needs and by the gates for the booked
block a confirmation binds.

Exact rational arithmetic, rounded up to the next cent: a price quoted to a person is never
below what is charged, and no float error can move a figure across a cent.
"""

from __future__ import annotations

import math
from fractions import Fraction

SECONDS_PER_HOUR = 3600


def gpu_hours(num_gpus: int, seconds: float) -> float:
    if num_gpus < 1:
        raise ValueError("num_gpus must be positive")
    if seconds < 0:
        raise ValueError("seconds must be >= 0")
    return num_gpus * seconds / SECONDS_PER_HOUR


def cost_cents(num_gpus: int, seconds: float, price_cents_per_gpu_hour: int) -> int:
    if price_cents_per_gpu_hour < 0:
        raise ValueError("price_cents_per_gpu_hour must be >= 0")
    if num_gpus < 1:
        raise ValueError("num_gpus must be positive")
    if seconds < 0:
        raise ValueError("seconds must be >= 0")
    # A float's shortest round-tripping decimal (0.1, not 0.1000000000000000055...), exactly.
    exact_seconds = Fraction(seconds) if isinstance(seconds, int) else Fraction(repr(float(seconds)))
    return math.ceil(num_gpus * exact_seconds * price_cents_per_gpu_hour / SECONDS_PER_HOUR)

