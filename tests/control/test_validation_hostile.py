"""Gate 5's time check at its edges: plans that are fractional, huge, or not a number at all."""

from __future__ import annotations

import math

import pytest

from ito_assets.control.validation import require_within_window, window_left_s
from ito_assets.errors import ErrorCode, ItoError

T0 = 1_700_000_000


def refusal(planned: float, *, left: int) -> ItoError | None:
    try:
        require_within_window(planned, starts_at=T0, ends_at=T0 + left, num_gpus=8, now=T0)
    except ItoError as error:
        return error
    return None


@pytest.mark.parametrize("planned", [math.nan, -math.nan, math.inf])
def test_a_plan_of_no_finite_time_is_refused_with_the_gates_code(planned: float) -> None:
    error = refusal(planned, left=10**9)
    assert error is not None and error.code is ErrorCode.CAPACITY_UNAVAILABLE and not error.retryable
    assert "no finite time" in error.message and "(1,000,000,000 s) left" in error.message


@pytest.mark.parametrize("planned", [100.5, 100.000001, 2.0**53, 2.0**60, 1e20])
def test_the_ceiling_of_the_plan_fits_and_one_second_less_refuses(planned: float) -> None:
    need = math.ceil(planned)
    assert refusal(planned, left=need) is None and refusal(planned, left=need + 1) is None
    error = refusal(planned, left=need - 1)
    assert error is not None and error.code is ErrorCode.CAPACITY_UNAVAILABLE
    assert f"({need:,} s)" in error.message and f"({need - 1:,} s) left" in error.message


def test_a_window_that_ends_now_has_nothing_left_and_refuses_any_plan() -> None:
    assert window_left_s(T0 - 60, T0, T0) == 0
    with pytest.raises(ItoError) as refused:
        require_within_window(0.001, starts_at=T0 - 60, ends_at=T0, num_gpus=1, now=T0)
    assert refused.value.code is ErrorCode.CAPACITY_UNAVAILABLE


def test_a_window_ahead_counts_from_its_start_not_from_now() -> None:
    assert window_left_s(T0 + 3600, T0 + 3700, T0) == 100
    assert require_within_window(100.0, starts_at=T0 + 3600, ends_at=T0 + 3700, num_gpus=1, now=T0) == 100
    assert refusal(100.0, left=99) is not None
