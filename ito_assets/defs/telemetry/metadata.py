"""What `training_telemetry` shows in the UI: goodput and badput by cause per stage and for the run
(a chart and a table of the warehouse rows), and each stage's predicted against measured step time."""

from __future__ import annotations

from ito_assets import charts
from ito_assets.defs.metadata_values import chart, table
from ito_assets.runtime.stage.calibration import FLAG_FRACTION, RATIO_DIGITS

GOODPUT_COLUMNS = [("stage", "string"), ("goodput %", "float"), ("device hours", "float"),
                   *((f"{cause} s", "float") for cause in ("productive", *charts.BADPUT_CAUSES)),
                   ("post-training s", "float"), ("unplanned interruptions /1000 device-h", "float")]
STEP_TIME_COLUMNS = [("stage", "string"), ("predicted s/step", "float"), ("measured s/step", "float"),
                     ("measured/predicted", "float"), ("flagged", "bool")]


def goodput_metadata(rows: list[dict]) -> dict:
    """`rows`: `table.rows_for_run`, the run's row last."""
    records = [{"stage": r["stage"], "goodput %": round(100 * r["goodput"], 1),
                "device hours": round(r["device_hours"], 4), "productive s": round(r["productive_seconds"], 1),
                **{f"{c} s": round(r[f"badput_{c}_seconds"], 1) for c in charts.BADPUT_CAUSES},
                "post-training s": round(r["posttraining_seconds"], 1),
                "unplanned interruptions /1000 device-h":
                    round(r["unplanned_interruptions_per_1000_device_hours"], 2)} for r in rows]
    return {"goodput_chart": chart("goodput and badput by cause", charts.goodput_chart(rows)),
            "goodput_by_stage": table(GOODPUT_COLUMNS, records)}


def step_time_metadata(calibrations: dict[str, dict]) -> dict:
    """`calibrations`: stage -> `Calibration.to_dict`; stages that timed no steady step are absent."""
    timed = {stage: c for stage, c in calibrations.items() if c}
    if not timed:
        return {}  # nothing was timed (too few steps): no chart rather than an empty one
    records = [{"stage": stage, "predicted s/step": round(c["predicted_step_s"], 4),
                "measured s/step": round(c["measured_step_s"], 4), "measured/predicted": round(c["step_time_ratio"], RATIO_DIGITS),
                "flagged": bool(c["flagged"])} for stage, c in timed.items()]
    figures = {stage: (c["predicted_step_s"], c["measured_step_s"], c["flagged"]) for stage, c in timed.items()}
    return {"step_time_chart": chart("predicted and measured step time", charts.step_time_chart(figures, FLAG_FRACTION)),
            "step_time": table(STEP_TIME_COLUMNS, records)}
