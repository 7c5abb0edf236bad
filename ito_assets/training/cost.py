"""What compute costs, in integer US cents, from the booking's price per GPU-hour.

Rounded up to the next cent, as `gates/cost.py` does: a price quoted to a person is never below
what is charged.
"""

from __future__ import annotations

import math

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
    return math.ceil(gpu_hours(num_gpus, seconds) * price_cents_per_gpu_hour - 1e-9)


def flops_cost_cents(flops: float, *, num_gpus: int, peak_flops_per_gpu: float, mfu: float, price_cents_per_gpu_hour: int) -> int:
    """Cost of `flops` model FLOPs on `num_gpus` GPUs running at `mfu` of their peak."""
    if not 0 < mfu <= 1:
        raise ValueError("mfu must be in (0, 1]")
    seconds = flops / (num_gpus * peak_flops_per_gpu * mfu)
    return cost_cents(num_gpus, seconds, price_cents_per_gpu_hour)
