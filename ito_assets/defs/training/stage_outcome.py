"""What a stage asset shows in the UI about the outcome it hands downstream
(`ito_assets.runtime.stage.run.StageCheckpoint`): its final checkpoint, evals, eval-gate verdict,
attempts, goodput, the loss chart against the gate and the layout it ran, read from the files the
runtime wrote."""

from pathlib import Path

import dagster as dg

from ito_assets import charts
from ito_assets.defs.metadata_values import chart, table
from ito_assets.runtime.checkpoint import registry
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.record.goodput import summarize_stage
from ito_assets.runtime.stage.calibration import RATIO_DIGITS
from ito_assets.runtime.stage.eval_gate import Direction, EvalGatePolicy
from ito_assets.runtime.stage.run import StageCheckpoint


def training_losses(stage_dir: Path) -> tuple[list[int], list[float]]:
    """Loss by step; a step redone after a restart keeps its last loss."""
    latest = {e.step: e.loss for e in events.read(stage_dir) if e.kind is EventKind.STEP and e.loss is not None}
    steps = sorted(latest)
    return steps, [latest[s] for s in steps]


def gate_marks(gate: dict, policy: EvalGatePolicy | None) -> list[dict]:
    """Each gated metric of the verdict against its threshold, in the metric's unit and in noise
    bands: the band the verdict measured (`noise.Band`), else the policy's seed band; the policy
    gives the direction (without it only the verdict is drawn)."""
    metrics = {m.name: m for m in policy.metrics} if policy is not None else {}
    marks = []
    for check in gate.get("checks", []):
        metric = metrics.get(check["metric"])
        mark = {"metric": check["metric"], "value": check["value"], "reference": check["previous"],
                "compared_with": gate.get("compared_with", "reference"), "passed": check["passed"]}
        if metric is not None:
            band = check.get("band", {}).get("total") or metric.noise_band
            # passes when value is at or beyond previous -+ required, in the metric's direction
            sign = -1.0 if metric.direction is Direction.LOWER_IS_BETTER else 1.0
            mark.update(threshold=check["previous"] + sign * check["required"], band=band,
                        margin_bands=(check["improvement"] - check["required"]) / band)
        marks.append(mark)
    return marks


def outcome_metadata(outcome: StageCheckpoint, policy: EvalGatePolicy | None = None) -> dict:
    """`policy`: the eval-gate policy that judged the stage, for its thresholds' noise bands."""
    stage_dir = Path(outcome.stage_dir)
    telemetry = summarize_stage(events.read_groups(stage_dir))
    checkpoints = registry.read(stage_dir)
    steps, losses = training_losses(stage_dir)
    metadata = {
        "final_checkpoint": dg.MetadataValue.path(outcome.final_checkpoint),
        "metadata_sha256": outcome.metadata_sha256,
        "num_steps": outcome.num_steps,
        "num_attempts": outcome.num_attempts,
        # the stage's eval battery (losses in nats), numeric: plotted across partitions
        **{name: round(value, LOSS_DIGITS) for name, value in sorted(outcome.eval.items())},
        "gate_passed": outcome.gate_passed,
        "gate": gate_table(outcome.gate),
        "goodput": round(telemetry.goodput, 4),
        "num_checkpoints": len(checkpoints),
        "checkpoint_blocking_s": round(telemetry.checkpoint_blocking_seconds, 2),
        "checkpoint_bandwidth_mb_per_s": round(telemetry.checkpoint_bandwidth_bytes_per_second / 1e6, 1),
        "loss_chart": chart(f"{outcome.stage} loss and eval gate", charts.stage_loss_chart(
            outcome.stage, steps, losses, gate_marks(outcome.gate, policy))),
        **_layout_metadata(outcome.layout),
        **_calibration_metadata(outcome.calibration),
    }
    if losses:
        metadata["final_train_loss"] = round(losses[-1], LOSS_DIGITS)  # numeric: plotted across partitions
    return metadata


# Losses in nats to 4 decimals: the gates' noise bands are ~0.02, so the 5th decimal means nothing.
LOSS_DIGITS = 4
GATE_COLUMNS = [("metric", "string"), ("value", "number"), ("reference", "number"), ("gain", "number"),
                ("required gain", "number"), ("band", "number"), ("band from", "string"), ("passed", "bool")]


def gate_table(gate: dict) -> dg.TableMetadataValue:
    """The verdict's checks, a row per gated metric: its value, the reference it was judged
    against (`compared_with`), the gain and the gain required, the noise band that sized it."""
    rows = [{"metric": c["metric"], "value": round(c["value"], LOSS_DIGITS), "reference": round(c["previous"], LOSS_DIGITS),
             "gain": round(c["improvement"], LOSS_DIGITS), "required gain": round(c["required"], LOSS_DIGITS),
             "band": round(c["band"]["total"], LOSS_DIGITS) if c.get("band") else None,
             "band from": c.get("band", {}).get("method"), "passed": c["passed"]} for c in gate.get("checks", [])]
    return table(GATE_COLUMNS, rows)


def _calibration_metadata(calibration: dict) -> dict:
    """Predicted against measured step time and peak memory per device (`calibration.Calibration`)."""
    if not calibration:
        return {}
    return {"predicted_step_s": round(calibration["predicted_step_s"], 4),
            "measured_step_s": round(calibration["measured_step_s"], 4),
            "step_time_ratio": round(calibration["step_time_ratio"], RATIO_DIGITS),
            "predicted_peak_memory_bytes": calibration["predicted_peak_memory_bytes"],
            "measured_peak_memory_bytes": calibration["measured_peak_memory_bytes"],
            "peak_memory_source": calibration["peak_memory_source"], "price_model_device": calibration["device"]}


LAYOUT_COLUMNS = [("field", "string"), ("value", "string")]
LAYOUT_FALLBACK_COLUMNS = [("field", "string"), ("planned", "string"), ("ran", "string"), ("why", "string")]


def _layout_metadata(layout: dict) -> dict:
    """The layout the worker ran and every field that differs from the plan's, with its reason."""
    if not layout:
        return {}
    rows = [{"field": f["field"], "planned": str(f["planned"]), "ran": str(f["ran"]), "why": f["reason"]}
            for f in layout["fallbacks"]]
    ran = [{"field": name, "value": str(value)} for name, value in layout["ran"].items()]
    return {"layout_ran": table(LAYOUT_COLUMNS, ran), "num_layout_fallbacks": len(layout["fallbacks"]),
            "layout_fallbacks": table(LAYOUT_FALLBACK_COLUMNS, rows)}
