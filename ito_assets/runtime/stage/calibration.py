"""The price model against the run: a stage's predicted step time and peak memory per device beside
the measured ones, for the layout the worker ran on the hardware it ran on.

The prediction is the planner's own (`ito_assets.training.throughput.estimate_step`,
`ito_assets.training.memory.estimate_memory`), so a stage that runs slower than priced shows how
far the budget gates' cost was from the truth. A measured step more than a quarter off its
prediction is flagged: the cost the confirmation quoted is then off by as much, a margin a desk
reads as "correct the price model" rather than as run-to-run noise (the same execution's step
moved by 2-10 % between two runs of `benchmarks/stage_layouts.py`; docs/performance.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ito_assets.training.layout import Layout
from ito_assets.training.memory import estimate_memory
from ito_assets.training.planner import PlanRequest
from ito_assets.training.throughput import estimate_step

FLAG_FRACTION = 0.25
RATIO_DIGITS = 4  # the ratio as recorded; the flag reads the same figure, so 0.75 shown is 0.75 judged


@dataclass(frozen=True, kw_only=True)
class Calibration:
    predicted_step_s: float
    measured_step_s: float
    predicted_peak_memory_bytes: int
    measured_peak_memory_bytes: int
    peak_memory_source: str  # the CUDA allocator's peak, or the process's resident set on CPU
    device: str  # the GpuSpec the prediction priced

    @property
    def step_time_ratio(self) -> float:
        """Measured over predicted: above 1, the stage ran slower than it was priced."""
        return _ratio(self.measured_step_s, self.predicted_step_s)

    @property
    def flagged(self) -> bool:
        """More than a quarter off, judged on the recorded ratio: in binary, 0.075 s against 0.1 s
        is 0.7499999999999999, yet a quarter off exactly. A ratio that is not a number is flagged:
        NaN compares false and would read as on price."""
        ratio = round(self.step_time_ratio, RATIO_DIGITS)
        return not math.isfinite(ratio) or abs(ratio - 1) > FLAG_FRACTION

    def to_dict(self) -> dict:
        return {**vars(self), "step_time_ratio": round(self.step_time_ratio, RATIO_DIGITS),
                "peak_memory_ratio": round(_ratio(self.measured_peak_memory_bytes, self.predicted_peak_memory_bytes),
                                           RATIO_DIGITS),
                "flagged": self.flagged}


def _ratio(measured: float, predicted: float) -> float:
    """NaN when the prediction is no positive figure: the stage is concluded after its verdict is
    recorded, and a division by zero there would stop it before its figures are published."""
    return measured / predicted if predicted > 0 else math.nan


def calibrate(request: PlanRequest, ran: Layout, measured: dict) -> Calibration | None:
    """`request`: the planner's request for the hardware the stage ran on (its model, sequence,
    batch and hardware price the layout that ran). None when the attempt timed no steady step
    (`measured_figures`: too few steps)."""
    if not measured or measured.get("step_seconds") is None:
        return None
    hardware = request.hardware
    step = estimate_step(request.model, ran, sequence_length=request.sequence_length,
                         global_batch_sequences=request.global_batch_sequences, gpu=hardware.gpu,
                         network=hardware.network, gpus_per_node=hardware.gpus_per_node)
    memory = estimate_memory(request.model, ran, request.sequence_length, hardware.gpu)
    return Calibration(predicted_step_s=step.step_s, measured_step_s=float(measured["step_seconds"]),
                       predicted_peak_memory_bytes=memory.total,
                       measured_peak_memory_bytes=int(measured["peak_memory_bytes"]),
                       peak_memory_source=str(measured["peak_memory_source"]), device=hardware.gpu.name)
