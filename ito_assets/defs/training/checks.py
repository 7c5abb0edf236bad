"""Each stage's checks. Blocking: its eval gate (the verdict the stage asset recorded before handing
on its checkpoint); a failed gate stops the rest of the run here and, through the verdict store,
every later run of the same partition (no override exists). A warning: its step time against the
planner's prediction (`ito_assets.runtime.stage.calibration`)."""

import dagster as dg

from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.metadata_values import json_value
from ito_assets.defs.training.assets import long_context_checkpoint, mid_training_checkpoint, pretraining_checkpoint
from ito_assets.defs.training.stage_outcome import LOSS_DIGITS
from ito_assets.errors import ErrorCode
from ito_assets.manifest.schema import STAGE_ORDER
from ito_assets.runtime.stage.calibration import FLAG_FRACTION, RATIO_DIGITS


def _gate_check(stage: str, asset):
    @dg.asset_check(
        name=f"{stage}_eval_gate",
        asset=asset,
        blocking=True,
        partitions_def=manifests_partitions,
        description=f"The {stage} stage's eval battery against the previous stage (or the untrained model) "
        "and the seed noise band; EVAL_GATE_FAILED stops the run.",
    )
    def gate(context: dg.AssetCheckExecutionContext, **checkpoint) -> dg.AssetCheckResult:
        (value,) = checkpoint.values()
        if value is None or value.stage != stage:
            return dg.AssetCheckResult(passed=True, description=f"the manifest has no {stage} stage")
        failed = not value.gate_passed
        checks = {c["metric"]: {k: round(c[k], LOSS_DIGITS) for k in ("value", "previous", "improvement", "required")}
                  for c in value.gate["checks"]}
        return dg.AssetCheckResult(
            passed=not failed,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"{ErrorCode.EVAL_GATE_FAILED.value}: failed against {value.gate['compared_with']}" if failed
            else f"passed against {value.gate['compared_with']}",
            metadata={"error_code": ErrorCode.EVAL_GATE_FAILED.value if failed else "",
                      "compared_with": value.gate["compared_with"], "metrics": json_value(checks)},
        )

    return gate


def _calibration_check(stage: str, asset):
    @dg.asset_check(
        name=f"{stage}_step_time_calibration",
        asset=asset,
        partitions_def=manifests_partitions,
        description=f"A warning, never blocking: the {stage} stage's measured step time is more than "
        f"{FLAG_FRACTION:.0%} off the planner's prediction for the layout it ran, so the price model needs correcting.",
    )
    def calibration(context: dg.AssetCheckExecutionContext, **checkpoint) -> dg.AssetCheckResult:
        (value,) = checkpoint.values()
        return calibration_result(value.calibration if value is not None and value.stage == stage else {})

    return calibration


def calibration_result(figures: dict) -> dg.AssetCheckResult:
    """The ratio is shown as recorded, the figure the flag judged: 1.2504 rounded to 1.25 read as
    "exactly a quarter off" beside a failed check."""
    if not figures:
        return dg.AssetCheckResult(passed=True, description="no steady step was timed (or no such stage)")
    return dg.AssetCheckResult(
        passed=not figures["flagged"],
        severity=dg.AssetCheckSeverity.WARN,
        description=f"measured {figures['measured_step_s']:.4g} s per step against {figures['predicted_step_s']:.4g} s "
        f"predicted on {figures['device']} (ratio {round(figures['step_time_ratio'], RATIO_DIGITS):g})",
        metadata={"step_time_ratio": round(figures["step_time_ratio"], RATIO_DIGITS),
                  "predicted_step_s": round(figures["predicted_step_s"], 4),
                  "measured_step_s": round(figures["measured_step_s"], 4)},
    )


_STAGE_ASSETS = tuple(zip(STAGE_ORDER, (pretraining_checkpoint, mid_training_checkpoint, long_context_checkpoint)))
TRAINING_CHECKS = ([_gate_check(stage, asset) for stage, asset in _STAGE_ASSETS]
                   + [_calibration_check(stage, asset) for stage, asset in _STAGE_ASSETS])
