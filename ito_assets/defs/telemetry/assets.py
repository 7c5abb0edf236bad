"""`training_telemetry`: the desk's figures of the run, read from the event log of every stage that
trained, after the last post-training stage. One row per stage and one for the run go to the
warehouse table (`table`), the run's figures to the ledger, where the desk's quotes read what runs
on such a block delivered (`ito_assets.control.history`). The logs are read from the stage folders
of the ledger run the Dagster run is tagged with, in the folder the server approved for it."""

from pathlib import Path

import dagster as dg

from ito_assets.control import run_tags, runs
from ito_assets.defs import owners
from ito_assets.defs.failures import failure
from ito_assets.defs.manifest.partitions import TRAINED_ONE_OF_TWO, manifests_partitions
from ito_assets.defs.resources import ItoSettingsResource, LedgerResource, WAREHOUSE_POOL
from ito_assets.defs.telemetry import table
from ito_assets.defs.telemetry.metadata import goodput_metadata, step_time_metadata
from ito_assets.errors import ItoError
from ito_assets.manifest.schema import POST_TRAINING_ORDER, STAGE_ORDER
from ito_assets.runtime.record.publish import booked_devices, publish_run
from ito_assets.runtime.record.storage import RunLayout

GROUP = "telemetry"


@dg.asset(
    group_name=GROUP,
    owners=[owners.TRAINING],
    kinds={"duckdb"},
    partitions_def=manifests_partitions,
    pool=WAREHOUSE_POOL,
    ins={f"{name}_checkpoint": dg.AssetIn(f"{name}_checkpoint") for name in (*STAGE_ORDER, *POST_TRAINING_ORDER)},
    description="Desk telemetry of the run, from the runtime event log of every stage, post-training "
    "included: goodput with badput by cause, the post-training stages' share of the allocation, "
    "interruptions per 1,000 device-hours (planned, unplanned), checkpoint bandwidth and blocking seconds; "
    "one row per stage and one for the run in the warehouse table `training_telemetry`; charts of goodput "
    "by cause and of each pretraining stage's predicted against measured step time." + TRAINED_ONE_OF_TWO,
)
def training_telemetry(context: dg.AssetExecutionContext, ito: ItoSettingsResource, ledger: LedgerResource,
                       **stage_outputs):
    run_id = run_tags.run_id_of(context.run.tags) if context.has_tag(run_tags.RUN_ID) else None
    rows, metadata = run_telemetry(context.log, ito, ledger, context.partition_key, run_id, trained_stages(stage_outputs))
    context.add_output_metadata(metadata)
    return rows


def run_telemetry(log, ito: ItoSettingsResource, ledger: LedgerResource, partition_key: str, run_id: str | None,
                  trained: dict) -> tuple[list[dict], dict]:
    """The warehouse rows (written) and the UI's metadata of the ledger run `run_id`, its figures
    published to the ledger; None: a materialization by hand, of the stages' own records, nothing
    published. `trained`: `trained_stages` of the stage inputs."""
    if run_id is None:
        stage_dirs, num_booked_devices = {stage: Path(output.stage_dir) for stage, output in trained.items()}, 0
    else:
        stage_dirs, num_booked_devices = _run_stage_dirs(ledger, run_id)
        trained = _of_run(log, trained, stage_dirs)
    rows = table.rows_for_run(partition_key, stage_dirs, num_booked_devices=num_booked_devices)
    table.write(ito.settings().warehouse_path, partition_key, rows)
    if run_id is not None:
        with ledger.open() as opened:
            publish_run(opened, run_id, stage_dirs, num_booked_devices=num_booked_devices)
    run_row = rows[-1]
    return rows, {
        # numeric, for the Plots view across partitions; badput by cause is the goodput_by_stage table
        "goodput": round(run_row["goodput"], 4), "device_hours": round(run_row["device_hours"], 4),
        "posttraining_s": round(run_row["posttraining_seconds"], 1),
        "unplanned_interruptions_per_1000_device_hours": round(run_row["unplanned_interruptions_per_1000_device_hours"], 2),
        "checkpoint_bandwidth_mb_per_s": round(run_row["checkpoint_bandwidth_bytes_per_second"] / 1e6, 1),
        "stages": ", ".join(stage_dirs),
        **goodput_metadata(rows),
        # the planner prices the pretraining stages; post-training has no predicted step time
        **step_time_metadata({stage: getattr(output, "calibration", {}) for stage, output in trained.items()
                              if stage in STAGE_ORDER}),
    }


def _run_stage_dirs(ledger: LedgerResource, run_id: str) -> tuple[dict[str, Path], int]:
    """The stage folders of the ledger run the Dagster run is tagged with, from the folder the
    server approved for it (as each stage's end publishes them), and its booked GPUs. Not the
    stage inputs' folders: the IO manager keeps one output per asset and manifest partition, so
    two ledger runs of one manifest share it, and the last stage to end wrote it."""
    with ledger.open() as opened:
        try:
            run = runs.get(opened, run_id)
        except ItoError as error:
            raise failure(error) from None
        num_booked_devices = booked_devices(opened, run_id)
    return RunLayout.for_run(Path(run.checkpoint_dir), run_id).stage_dirs(), num_booked_devices


def _of_run(log, trained: dict, stage_dirs: dict[str, Path]) -> dict:
    """The stage inputs that are this run's (their folder is the run's for their stage); another
    run's (of the same manifest, stored over this one's) is left out of the step-time chart."""
    own = {stage: output for stage, output in trained.items()
           if stage in stage_dirs and Path(output.stage_dir).resolve() == stage_dirs[stage].resolve()}
    if foreign := sorted(set(trained) - set(own)):
        log.warning(f"stage records of another run left out of the step-time chart: {', '.join(foreign)}")
    return own


def publish_after_stage(context: dg.AssetExecutionContext, ledger: LedgerResource, run_id: str, layout: RunLayout) -> None:
    """The run's figures so far into the ledger at a stage's end, whether it succeeded or not: a
    run that stops at a failed stage or gate never reaches `training_telemetry`, and the desk's
    quotes would count only the runs that went well. A ledger that cannot take them is logged,
    never raised over the stage's own outcome."""
    try:
        with ledger.open() as opened:
            publish_run(opened, run_id, layout.stage_dirs())
    except Exception as error:  # the stage's outcome stands; its figures wait for the next publication
        context.log.warning(f"the run's telemetry so far was not published ({type(error).__name__}); "
                            "the next stage or `training_telemetry` publishes it")


def trained_stages(outputs: dict) -> dict:
    """stage -> its output, for each stage that trained, in the run's order. A stage the manifest
    leaves out hands on what it was given (None, or an earlier stage's record): it is skipped, so
    that no stage is counted twice."""
    trained = {}
    for stage in (*STAGE_ORDER, *POST_TRAINING_ORDER):  # Dagster hands the inputs over sorted by name
        output = outputs.get(f"{stage}_checkpoint")
        if output is not None and getattr(output, "stage", None) == stage:
            trained[stage] = output
    return trained


TELEMETRY_ASSETS = [training_telemetry]
