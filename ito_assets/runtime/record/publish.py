"""A finished stage's figures into the ledger, where `ito checkpoints` and `ito metrics` read them.

Checkpoints: every registry record whose folder is still a whole checkpoint (pruned and set-aside
ones are not listed), one per folder: the record of the save that is there now. Metrics, named
`<stage>/<metric>`: the loss every `LOG_EVERY_STEPS` steps (the last attempt's value where a step
was redone), the stage's eval, its goodput and its predicted and measured step time with their
ratio. Publishing twice adds nothing: rows already in the ledger for the run are skipped.
The run's figures (`publish_run`) are computed again from the whole log each time: a changed
value is added and the last one stands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import sqlalchemy as sa

from ito_assets.control import history
from ito_assets.control import telemetry as ledger_telemetry
from ito_assets.control.ledger import Ledger, bookings, runs
from ito_assets.runtime.record import events
from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.checkpoint import registry
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.record.goodput import summarize_run, summarize_stage

LOG_EVERY_STEPS = 10  # the worker's Pipes reporting interval (torchtitan's default log_freq)


def stage_metrics(stage: str, stage_dir: Path, evaluation: dict[str, float]) -> list[tuple[int, str, float]]:
    log = events.read(stage_dir)
    losses = {e.step: e.loss for e in log if e.kind is EventKind.STEP and e.loss is not None}
    last = max(losses, default=0)
    found = [(step, f"{stage}/loss", loss) for step, loss in sorted(losses.items())
             if step % LOG_EVERY_STEPS == 0 or step == last]
    found += [(last, f"{stage}/{name}", value) for name, value in sorted(evaluation.items())]
    found.append((last, f"{stage}/goodput", summarize_stage(events.read_groups(stage_dir)).goodput))
    return found


def publish_stage(ledger: Ledger, run_id: str, stage: str, stage_dir: Path, evaluation: dict[str, float],
                  figures: dict[str, float] | None = None) -> tuple[int, int]:
    """Returns (checkpoints added, metrics added); a checkpoint is known by (step, path, sha256):
    a step saved again with other bytes (a restart rewound past it) is listed again, and its
    earlier row marked removed. `figures`: more of the stage's figures at its last step (the
    predicted and measured step time)."""
    finished = [ledger_telemetry.FinishedCheckpoint(step=record.step, path=record.path, size_bytes=record.num_bytes,
                                                    sha256=record.metadata_sha256)
                for record in _current_records(stage_dir)]
    found = stage_metrics(stage, stage_dir, evaluation)
    last = max((step for step, _, _ in found), default=0)
    found += [(last, f"{stage}/{name}", value) for name, value in sorted((figures or {}).items())]
    return ledger_telemetry.publish(ledger, run_id, finished, found, same_checkpoint=("step", "path", "sha256"))


def publish_run(ledger: Ledger, run_id: str, stage_dirs: Mapping[str, Path], *,
                num_booked_devices: int | None = None) -> dict[str, float]:
    """The run's figures (`history.RUN_FIGURES`, from every replica group's log of every stage in
    `stage_dirs`) into the ledger, where the desk's quotes read them. Published at each stage's
    end, whether it succeeded or not, and by the run's telemetry: the last stands, so a run that
    stopped at a failed gate or a failed stage counts in the quotes with what it used. Its
    goodput is weighed at its booked block's GPUs (`num_booked_devices`; None: the ledger's
    booking of the run). Returns the run's row (`Telemetry.as_row`)."""
    if num_booked_devices is None:
        num_booked_devices = booked_devices(ledger, run_id)
    logs = {stage: events.read_groups(folder) for stage, folder in stage_dirs.items()}
    row = summarize_run(logs, num_booked_devices=num_booked_devices).as_row()
    ledger_telemetry.publish(ledger, run_id, [], [(0, name, value) for name, value in history.run_figures(row).items()],
                             revised=True)
    return row


def booked_devices(ledger: Ledger, run_id: str) -> int:
    """The GPUs of the block the run was booked on; 0 for a run the ledger does not know."""
    query = (sa.select(bookings.c.num_gpus).join(runs, runs.c.booking_id == bookings.c.booking_id)
             .where(runs.c.run_id == run_id))
    with ledger.read() as conn:
        return int(conn.execute(query).scalar() or 0)


def _current_records(stage_dir: Path) -> list[registry.CheckpointRecord]:
    """One record per folder still whole: the last, of the save that is there now. A step saved
    again after a restart resumed before it has a record of each save, and the earlier one names
    bytes that no longer exist (a save clears its folder first and is recorded after its marker)."""
    whole = {str(p) for p in markers.candidates(stage_dir) if markers.intact(p)}
    current = {record.path: record for record in registry.read(stage_dir) if record.path in whole}
    return sorted(current.values(), key=lambda record: record.step)
