"""What a stage asset shows in the UI about the outcome it hands downstream
(`ito_assets.runtime.stage.run.StageCheckpoint`): its final checkpoint, evals, eval-gate verdict,
attempts, goodput, loss curve and the layout it ran, read from the files the runtime wrote."""

from pathlib import Path

import dagster as dg

from ito_assets.runtime.checkpoint import registry
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.record.goodput import summarize
from ito_assets.runtime.stage.run import StageCheckpoint


def _loss_table(stage_dir: Path, num_rows: int = 10) -> str:
    losses = sorted((e.step, e.loss) for e in events.read(stage_dir) if e.kind is EventKind.STEP and e.loss is not None)
    latest = dict(losses)  # a step redone after a restart keeps its last loss
    steps = sorted(latest)
    picked = steps[:: max(1, len(steps) // num_rows)] + steps[-1:]
    rows = "\n".join(f"| {s} | {latest[s]:.4f} |" for s in dict.fromkeys(picked))
    return f"| step | loss |\n|---|---|\n{rows}"


def outcome_metadata(outcome: StageCheckpoint) -> dict:
    stage_dir = Path(outcome.stage_dir)
    telemetry = summarize(events.read(stage_dir))
    checkpoints = registry.read(stage_dir)
    return {
        "final_checkpoint": dg.MetadataValue.path(outcome.final_checkpoint),
        "metadata_sha256": outcome.metadata_sha256,
        "num_steps": outcome.num_steps,
        "num_attempts": outcome.num_attempts,
        **{name: value for name, value in sorted(outcome.eval.items())},  # the stage's eval battery
        "gate_passed": outcome.gate_passed,
        "gate": dg.MetadataValue.json(outcome.gate),
        "goodput": telemetry.goodput,
        "num_checkpoints": len(checkpoints),
        "checkpoint_blocking_seconds": telemetry.checkpoint_blocking_seconds,
        "checkpoint_bandwidth_bytes_per_second": telemetry.checkpoint_bandwidth_bytes_per_second,
        "loss_curve": dg.MetadataValue.md(_loss_table(stage_dir)),
        **_layout_metadata(outcome.layout),
        **_calibration_metadata(outcome.calibration),
    }


def _calibration_metadata(calibration: dict) -> dict:
    """Predicted against measured step time and peak memory per device (`calibration.Calibration`)."""
    if not calibration:
        return {}
    return {"predicted_step_s": calibration["predicted_step_s"], "measured_step_s": calibration["measured_step_s"],
            "step_time_ratio": calibration["step_time_ratio"],
            "predicted_peak_memory_bytes": calibration["predicted_peak_memory_bytes"],
            "measured_peak_memory_bytes": calibration["measured_peak_memory_bytes"],
            "peak_memory_source": calibration["peak_memory_source"], "price_model_device": calibration["device"]}


def _layout_metadata(layout: dict) -> dict:
    """The layout the worker ran and every field that differs from the plan's, with its reason."""
    if not layout:
        return {}
    rows = "\n".join(f"| {f['field']} | {f['planned']} | {f['ran']} | {f['reason']} |" for f in layout["fallbacks"])
    return {"layout_ran": dg.MetadataValue.json(layout["ran"]), "num_layout_fallbacks": len(layout["fallbacks"]),
            "layout_fallbacks": dg.MetadataValue.md(f"| field | planned | ran | why |\n|---|---|---|---|\n{rows}")}
