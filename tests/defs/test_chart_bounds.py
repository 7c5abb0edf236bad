"""Charts draw rather than raise at the edges of their numbers: a negative or non-finite step
time or flag band, an unbounded detectable effect, values near a double's range."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("matplotlib")

from ito_assets import charts  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("predicted", "flag"), [
    (-5e-324, 0.25), (0.0, 0.25), (5e-324, 0.25),  # below, at and above the least duration
    (-1.0, 0.25), (math.inf, 0.25), (math.nan, 0.25),
    (1.0, -0.25), (1.0, math.inf), (1.0, math.nan), (1e300, 1e300),
])
@pytest.mark.filterwarnings("ignore:Tight layout not applied")  # labels of 1e300 s are wide
def test_the_step_time_chart_draws_any_times_and_band(predicted, flag):
    png = charts.step_time_chart({"pretraining": (predicted, 1.0, True), "mid_training": (1.0, predicted, False)}, flag)
    assert png.startswith(PNG_SIGNATURE)


@pytest.mark.parametrize(("difference", "mde"), [
    (0.1, math.inf), (0.1, -math.inf), (0.1, math.nan), (0.1, -0.05), (0.1, 1e308),
    (1e308, 0.05), (-1e308, None),
])
def test_the_effect_chart_draws_any_detectable_effect(difference, mde):
    png = charts.effect_chart(difference, -math.inf, math.inf, "GO", unit="nats", minimum_detectable_effect=mde)
    assert png.startswith(PNG_SIGNATURE)
