"""Stage eval gates: a stage passes only if its eval battery holds up against the previous stage.

Each gated metric has a direction and a noise band, measured for the run (`noise.band`): the
seed-to-seed standard deviation of the metric at the same budget (DataDecide, Magnusson et al.
2025, judges every comparison against this spread) combined with the eval's own sampling noise,
bootstrapped over the battery's units for the two models compared. Every verdict records the band
it used and both of its parts (a battery of one unit, or of units that all score alike, has no item
noise to measure: its band is then the seed part, and the verdict shows an item band of 0).

- The first stage must beat the untrained model by at least `min_improvement_bands` bands on
  every gated metric: training that did not move the metric beyond noise did nothing.
- A later stage may not regress by more than `max_regression_bands` bands on any gated metric
  against the stage before it (forgetting the general battery while fitting new data).

2 bands: a difference beyond two standard deviations of seed noise, the usual ~95% two-sided
criterion for "not noise". A failed gate is final: the verdict is written once and no argument,
flag or retry turns it into a pass (a gate that can be overridden gates nothing).
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.runtime.record.storage import write_atomic
from ito_assets.runtime.stage import noise
from ito_assets.runtime.stage.noise import Units

MIN_IMPROVEMENT_BANDS = 2.0
MAX_REGRESSION_BANDS = 2.0


class Direction(str, enum.Enum):
    LOWER_IS_BETTER = "lower"
    HIGHER_IS_BETTER = "higher"


@dataclass(frozen=True, kw_only=True)
class GatedMetric:
    name: str
    direction: Direction
    noise_band: float  # the seed-to-seed standard deviation, in the metric's unit (the band's seed part)

    def __post_init__(self) -> None:
        object.__setattr__(self, "direction", Direction(self.direction))
        if not self.name:
            raise ValueError("name must not be empty")
        # An infinite band would allow any regression; NaN compares false and would slip past `> 0`.
        if not (math.isfinite(self.noise_band) and self.noise_band > 0):
            raise ValueError("noise_band must be positive and finite")

    def improvement(self, value: float, previous: float) -> float:
        """Positive when `value` is better than `previous`, in the metric's unit."""
        return previous - value if self.direction is Direction.LOWER_IS_BETTER else value - previous


@dataclass(frozen=True, kw_only=True)
class EvalGatePolicy:
    metrics: tuple[GatedMetric, ...]
    min_improvement_bands: float = MIN_IMPROVEMENT_BANDS
    max_regression_bands: float = MAX_REGRESSION_BANDS

    def __post_init__(self) -> None:
        if not self.metrics:
            raise ValueError("metrics must name at least one gated metric")
        if len({m.name for m in self.metrics}) != len(self.metrics):
            raise ValueError("metrics must have distinct names")
        # NaN is neither < 0 nor >= 0; an infinite regression allowance gates nothing.
        if not all(math.isfinite(b) and b >= 0 for b in (self.min_improvement_bands, self.max_regression_bands)):
            raise ValueError("min_improvement_bands and max_regression_bands must be >= 0 and finite")


@dataclass(frozen=True, kw_only=True)
class MetricCheck:
    metric: str
    value: float
    previous: float
    improvement: float
    required: float  # the least improvement that passes (negative: an allowed regression)
    passed: bool
    band: dict  # noise.Band.to_dict(): the seed and item parts, their total, the method


@dataclass(frozen=True, kw_only=True)
class EvalGateVerdict:
    stage: str
    compared_with: str  # "initial model" or the previous stage's name
    checks: tuple[MetricCheck, ...]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def error_code(self) -> str | None:
        return None if self.passed else ErrorCode.EVAL_GATE_FAILED.value

    def summary(self) -> str:
        failed = [c.metric for c in self.checks if not c.passed]
        return "passed" if not failed else f"failed on {', '.join(failed)} against {self.compared_with}"

    def to_dict(self) -> dict:
        return {"stage": self.stage, "compared_with": self.compared_with, "passed": self.passed,
                "error_code": self.error_code, "checks": [asdict(c) for c in self.checks]}


def judge_stage(stage: str, current: Mapping[str, Units], previous: Mapping[str, float],
                policy: EvalGatePolicy, *, previous_stage: str | None,
                previous_units: Mapping[str, Units] | None = None) -> EvalGateVerdict:
    """`current`: the stage's battery as units; `previous` the reference's metrics, with their
    units when recorded (`previous_units`). `previous_stage` None: the reference is the untrained
    model and the stage must improve on it."""
    checks = []
    for metric in policy.metrics:
        if metric.name not in current or metric.name not in previous:
            raise ValueError(f"metric {metric.name} is missing from the eval results")
        measured = noise.band(metric.noise_band, current[metric.name], (previous_units or {}).get(metric.name))
        required = (policy.min_improvement_bands if previous_stage is None else -policy.max_regression_bands)
        required *= measured.total
        value = current[metric.name].pooled
        gained = metric.improvement(value, previous[metric.name])
        checks.append(MetricCheck(metric=metric.name, value=value, previous=previous[metric.name],
                                  improvement=gained, required=required, passed=_holds(gained, required, value),
                                  band=measured.to_dict()))
    return EvalGateVerdict(stage=stage, compared_with=previous_stage or "initial model", checks=tuple(checks))


def _holds(gained: float, required: float, value: float) -> bool:
    """Only finite figures can pass: a diverged stage (NaN or infinite), a diverged reference (an
    infinite gain over it) or an unmeasurable band (an infinite allowance) supports no verdict."""
    return all(math.isfinite(x) for x in (gained, required, value)) and gained >= required


class VerdictStore:
    """Verdicts of one run, one file per stage, written once."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def _path(self, stage: str) -> Path:
        return self.run_dir / f"gate-{stage}.json"

    def record(self, verdict: EvalGateVerdict) -> EvalGateVerdict:
        existing = self.read(verdict.stage)
        if existing is not None and not _says_passed(existing):
            raise ItoError(ErrorCode.EVAL_GATE_FAILED, f"the {verdict.stage} gate already failed and stays failed")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self._path(verdict.stage), json.dumps(verdict.to_dict(), sort_keys=True).encode())
        return verdict

    def read(self, stage: str) -> dict | None:
        path = self._path(stage)
        return json.loads(path.read_text()) if path.exists() else None

    def ensure_not_failed(self, stages: tuple[str, ...]) -> None:
        """Raise EVAL_GATE_FAILED when any of `stages` has a failed verdict: the run stays stopped."""
        for stage in stages:
            verdict = self.read(stage)
            if verdict is not None and not _says_passed(verdict):
                raise ItoError(ErrorCode.EVAL_GATE_FAILED,
                               f"the {stage} eval gate failed; the run stays stopped (no override exists)")


def _says_passed(verdict: object) -> bool:
    """Only a verdict that says `"passed": true` lets the run go on: a file edited to "false" (a
    truthy string), or one without the key, is no pass."""
    return isinstance(verdict, dict) and verdict.get("passed") is True
