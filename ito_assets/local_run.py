"""`make run`: evaluate the sensors in process against the embedded instance, execute what they
request, and print a short summary. The daemon (`make ui`) runs the same sensors and jobs, so the
headless path and the daemon path are one code path; both tag runs with the sensor's run key, so
neither launches work the other already did.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from typing import TextIO

import dagster as dg
from tqdm import tqdm

# Partitioned asset checks are a Dagster preview feature; the warning would drown the summary.
warnings.filterwarnings("ignore", category=dg.PreviewWarning)
from dagster._core.storage.tags import RUN_KEY_TAG, SENSOR_NAME_TAG

from ito_assets.control import run_tags
from ito_assets.defs.in_process_runs import process_tags, wait_for_pool
from ito_assets.defs.resources import WAREHOUSE_POOL
from ito_assets.defs.workload.outcome import report_outcome
from ito_assets.settings import Settings, load_settings

MAIN_MANIFEST = "fixture-small.json"  # the fixture manifest `make run` also trains through the API


# The console shows warnings and errors only; every event is still in the instance for `make ui`.
_QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


@dataclass
class RunSummary:
    num_runs_launched: int = 0
    num_runs_skipped: int = 0
    num_runs_failed: int = 0
    materialized: list[str] = field(default_factory=list)
    checks_passed: list[str] = field(default_factory=list)
    checks_failed: list[str] = field(default_factory=list)
    checks_warned: list[str] = field(default_factory=list)  # failed checks of WARN severity: nothing stopped


def _already_launched(instance: dg.DagsterInstance, sensor_name: str, run_key: str) -> bool:
    runs = instance.get_runs(filters=dg.RunsFilter(tags={SENSOR_NAME_TAG: sensor_name, RUN_KEY_TAG: run_key}), limit=1)
    return bool(runs)


def _record(result: dg.ExecuteInProcessResult, summary: RunSummary, partition: str | None) -> None:
    suffix = f" [{partition}]" if partition else ""
    for event in result.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        summary.materialized.append(
            materialization.asset_key.to_user_string() + (f" [{materialization.partition}]" if materialization.partition else "")
        )
    for evaluation in result.get_asset_check_evaluations():
        name = f"{evaluation.asset_key.to_user_string()}:{evaluation.check_name}{suffix}"
        if evaluation.passed:
            summary.checks_passed.append(name)
        elif evaluation.severity is dg.AssetCheckSeverity.WARN:
            summary.checks_warned.append(name)
        else:
            summary.checks_failed.append(name)
    if not result.success:
        summary.num_runs_failed += 1


def _progress(line: str) -> float:
    """One line as each run starts and ends: `make run` takes minutes, and its summary comes last."""
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)
    return time.monotonic()


class StepBar:
    """In a terminal, a bar over one run's steps (tqdm: done of total, rate, time to go), named after
    the step running and followed by the newest line of its log (the data plane's and the stage
    worker's progress). It reads the run's events from the instance on a thread while the run
    executes in process; where stdout is not a terminal (CI, a pipe) tqdm leaves it off."""

    FINISHED = {dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE,
                dg.DagsterEventType.STEP_SKIPPED}
    POLL_S = 0.5

    def __init__(self, instance: dg.DagsterInstance, run_id: str, num_steps: int, *, file: TextIO | None = None,
                 disable: bool | None = None):
        self.instance, self.run_id, self.cursor = instance, run_id, None
        self.bar = tqdm(total=num_steps, unit="step", file=file or sys.stdout, disable=disable, leave=False,
                        dynamic_ncols=True)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self) -> "StepBar":
        if not self.bar.disable:
            self.thread.start()
        return self

    def __exit__(self, *_) -> None:
        if not self.bar.disable:
            self.stopped.set()
            self.thread.join()
            self.poll()
        self.bar.close()

    def _follow(self) -> None:
        while not self.stopped.wait(self.POLL_S):
            try:
                self.poll()
            except Exception:  # the bar is only a view: a busy event store skips one refresh
                continue

    def poll(self) -> None:
        page = self.instance.get_records_for_run(self.run_id, cursor=self.cursor)
        self.cursor = page.cursor
        for record in page.records:
            entry = record.event_log_entry
            event = entry.dagster_event
            if event is None:
                self.bar.set_postfix_str(entry.user_message[:100], refresh=False)
            elif event.event_type is dg.DagsterEventType.STEP_START:
                self.bar.set_description(event.step_key, refresh=False)
            elif event.event_type in self.FINISHED:
                self.bar.update(1)
        self.bar.refresh()


def evaluate_sensor(defs: dg.Definitions, instance: dg.DagsterInstance, sensor_name: str, summary: RunSummary) -> None:
    """One tick of `sensor_name`, then each requested run in process (skipping used run keys)."""
    sensor = defs.resolve_sensor_def(sensor_name)
    context = dg.build_sensor_context(
        instance=instance, sensor_name=sensor_name, definitions=defs, resources=defs.resources
    )
    result = sensor(context)
    if not isinstance(result, dg.SensorResult):  # a sensor that only acts (cancellations) launches nothing
        return
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    for request in result.run_requests or []:
        if request.run_key and _already_launched(instance, sensor_name, request.run_key):
            summary.num_runs_skipped += 1
            continue
        job = defs.resolve_job_def(request.job_name or sensor.job_name)
        tags = {**request.tags, SENSOR_NAME_TAG: sensor_name, RUN_KEY_TAG: request.run_key, **process_tags()}
        wait_for_pool(instance, WAREHOUSE_POOL, say=_progress)  # where Ctrl-C still stops `make run`
        started = _progress(f"{job.name} for partition {request.partition_key}: running")
        run_id = str(uuid.uuid4())
        with StepBar(instance, run_id, len(job.nodes)):
            run = job.execute_in_process(
                instance=instance,
                partition_key=request.partition_key,
                tags=tags,
                raise_on_error=False,
                run_config=_run_config(job, request.partition_key),
                run_id=run_id,
            )
        summary.num_runs_launched += 1
        done = len(summary.materialized)
        _record(run, summary, request.partition_key)
        _progress(f"{job.name} for partition {request.partition_key}: {'succeeded' if run.success else 'FAILED'} "
                  f"in {time.monotonic() - started:.0f} s, {len(summary.materialized) - done} materializations")
        if run_tags.run_id_of(tags):
            _report_to_ledger(defs, instance, run.dagster_run, run_tags.run_id_of(tags))


def _run_config(job: dg.JobDefinition, partition_key: str | None) -> dict:
    """The job's own default config for the partition (as the daemon would use it), plus a quiet console."""
    partitioned = job.partitioned_config
    base = partitioned.get_run_config_for_partition_key(partition_key) if partitioned and partition_key else {}
    return {**(base or {}), **_QUIET_CONSOLE}


def _report_to_ledger(defs: dg.Definitions, instance: dg.DagsterInstance, dagster_run, run_id: str) -> None:
    """What the run-status sensors do under the daemon: the run's end, written to the ledger."""
    with defs.resources["ledger"].open() as ledger:
        report_outcome(ledger, instance, dagster_run, run_id)


def request_training_run(settings: Settings) -> dict:
    """The API flow of docs/api.md against a real `ito serve`, once per state dir: the desk books, the
    account requests a confirmation, the desk approves, the account trains (a queued run)."""
    from ito_assets.api.server_walkthrough import walk

    marker = settings.state_dir / "walkthrough" / "make-run.json"
    if marker.exists():
        return json.loads(marker.read_text())
    result = walk(settings, str(settings.manifests_dir / MAIN_MANIFEST))
    for step in result.steps:
        print(f"api: {step}")
    marker.write_text(json.dumps(result.ids))
    return result.ids


def _safe_url(url: str) -> str:
    """The ledger URL without its password (a production URL carries one)."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def ledger_run_state(defs: dg.Definitions, run_id: str) -> str:
    from ito_assets.control import runs

    with defs.resources["ledger"].open() as ledger:
        run = runs.get(ledger, run_id)
    return f"{run.state.value}" + (f" ({run.state_reason})" if run.state_reason else "")


def print_summary(summary: RunSummary, settings: Settings) -> None:
    print(f"runs launched: {summary.num_runs_launched}, already done (same run key): {summary.num_runs_skipped}, "
          f"failed: {summary.num_runs_failed}")
    print(f"assets materialized ({len(summary.materialized)}):")
    for name in summary.materialized:
        print(f"  - {name}")
    print(f"checks passed: {len(summary.checks_passed)}, failed: {len(summary.checks_failed)}, "
          f"warnings: {len(summary.checks_warned)}")
    for name in summary.checks_failed:
        print(f"  FAILED {name}")
    for name in summary.checks_warned:
        print(f"  WARNING {name}")
    print(f"Dagster instance: {settings.dagster_home}  (see it with `make ui`)")
    print(f"warehouse: {settings.warehouse_path}{'' if settings.warehouse_path.exists() else ' (not written yet)'}")
    if summary.num_runs_launched == 0 and summary.num_runs_skipped:
        print("nothing new: every reviewed manifest was already processed (`make clean` starts afresh)")


def main() -> int:
    from definitions import build_definitions
    from sensors import SENSOR_ORDER

    settings = load_settings()
    os.environ.setdefault("DAGSTER_HOME", str(settings.dagster_home))
    settings.dagster_home.mkdir(parents=True, exist_ok=True)
    defs = build_definitions(settings)
    summary = RunSummary()
    with dg.DagsterInstance.get() as instance:
        evaluate_sensor(defs, instance, SENSOR_ORDER[0], summary)  # reviewed manifests first
        ids = request_training_run(settings)
        for name in SENSOR_ORDER[1:]:
            evaluate_sensor(defs, instance, name, summary)
    print_summary(summary, settings)
    print(f"ledger: {_safe_url(settings.ledger_url)}; run {ids['run_id']} (key {ids['idempotency_key']}) is "
          f"{ledger_run_state(defs, ids['run_id'])}")
    return 1 if summary.num_runs_failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback
        print("make run: interrupted", file=sys.stderr)
        sys.exit(130)
