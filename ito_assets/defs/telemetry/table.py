"""The warehouse table `training_telemetry`: one row per stage and one for the whole run (stage
'run'), replaced per manifest partition; the post-training stages (sft, dpo, rlvr) have rows of
their own. Figures from `ito_assets.runtime.record.goodput`."""

import time
from pathlib import Path

from ito_assets.data.warehouse import connect
from ito_assets.manifest.schema import POST_TRAINING_ORDER
from ito_assets.runtime.record import events
from ito_assets.runtime.record.goodput import summarize_run, summarize_stage

TABLE = "training_telemetry"
_COLUMNS = ("goodput", "allocated_seconds", "device_hours", "productive_seconds", "badput_startup_seconds",
            "badput_checkpoint_seconds", "badput_recovery_seconds", "badput_wasted_step_seconds",
            "badput_evaluation_seconds", "badput_idle_seconds", "badput_other_seconds", "posttraining_seconds",
            "num_steps", "num_wasted_steps",
            "planned_interruptions_per_1000_device_hours", "unplanned_interruptions_per_1000_device_hours",
            "num_checkpoints", "checkpoint_bytes", "checkpoint_bandwidth_bytes_per_second",
            "allocated_device_seconds", "productive_device_seconds", "unheld_device_seconds")


def rows_for_run(partition_key: str, stage_dirs: dict[str, Path], *, num_booked_devices: int = 0) -> list[dict]:
    """A row per stage and the run's last, its goodput weighed at the booked block's GPUs
    (`summarize_run`; 0: the most a stage held)."""
    logs = {stage: events.read_groups(folder) for stage, folder in stage_dirs.items()}
    rows = [{"partition_key": partition_key, "stage": stage,
             **summarize_stage(groups, posttraining=stage in POST_TRAINING_ORDER).as_row()}
            for stage, groups in logs.items()]
    run = summarize_run(logs, num_booked_devices=num_booked_devices).as_row()
    return rows + [{"partition_key": partition_key, "stage": "run", **run}]


def write(warehouse: Path, partition_key: str, rows: list[dict]) -> None:
    warehouse.parent.mkdir(parents=True, exist_ok=True)
    columns = ", ".join(f"{c} DOUBLE" for c in _COLUMNS)
    names = ["partition_key", "stage", *_COLUMNS, "computed_at"]
    with connect(warehouse) as connection:
        connection.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (partition_key VARCHAR, stage VARCHAR, {columns}, "
                           "computed_at DOUBLE)")
        for column in _COLUMNS:  # a table written by an earlier release lacks the newer figures
            connection.execute(f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS {column} DOUBLE")
        connection.execute(f"DELETE FROM {TABLE} WHERE partition_key = ?", [partition_key])
        parameters = ", ".join("?" for _ in names)
        now = time.time()
        connection.executemany(f"INSERT INTO {TABLE} ({', '.join(names)}) VALUES ({parameters})",
                               [[r["partition_key"], r["stage"], *(float(r[c]) for c in _COLUMNS), now] for r in rows])
