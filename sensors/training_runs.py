"""A run the canonical API created -> launch the training job; its end -> the ledger; a confirmed
cancellation -> terminate it. Run keys are ledger run ids, so a restarted daemon never launches
a run twice."""

import dagster as dg

from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.resources import LedgerResource
from ito_assets.defs.jobs import training_job
from ito_assets.defs.workload.outcome import report_outcome
from ito_assets.control import run_tags, runs
from ito_assets.errors import ItoError
from ito_assets.control.states import TERMINAL_RUN_STATES, RunState
from ito_assets.digests import Digest


@dg.sensor(
    job=training_job,
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=15,
    description="Launches the training job for each queued ledger run (run key = the ledger run id).",
)
def confirmed_run_sensor(context: dg.SensorEvaluationContext, ledger: LedgerResource) -> dg.SensorResult:
    with ledger.open() as opened:
        pending = runs.pending_runs(opened)
    known = set(context.instance.get_dynamic_partitions(manifests_partitions.name))
    launchable = []
    for run in pending:  # one damaged row must not hold back every other queued run
        try:
            launchable.append((run, Digest(run.manifest_digest).short))
        except ValueError:
            context.log.warning(f"{run.run_id}: its manifest digest in the ledger is malformed; not launched")
    keys = sorted({key for _, key in launchable} - known)
    requests = [dg.RunRequest(run_key=run.run_id, partition_key=key, tags=run_tags.for_run(run))
                for run, key in launchable]
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[manifests_partitions.build_add_request(keys)] if keys else [],
        skip_reason=None if requests else "no queued runs in the ledger",
    )


def _dagster_runs_of(instance: dg.DagsterInstance, run_id: str) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(tags={run_tags.RUN_ID: run_id})))


@dg.sensor(
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=15,
    description="Terminates the Dagster runs of every run whose cancellation was confirmed, and "
    "reconciles runs whose Dagster run ended without its end reaching the ledger.",
)
def cancellation_sensor(context: dg.SensorEvaluationContext, ledger: LedgerResource) -> dg.SkipReason:
    with ledger.open() as opened:
        for run in runs.each(runs.cancelling_runs, opened):
            _one_run(context, run.run_id, lambda run=run: _cancel(context, opened, run))
        _withdraw_queued_runs_of_ended(context, opened)
        # A run-status sensor advances past a run even when writing its end failed (a locked
        # ledger): without this sweep such a run would hold its booking as active forever.
        for run in runs.each(runs.launched_active_runs, opened):
            _one_run(context, run.run_id, lambda run=run: _reconcile_launched(context, opened, run))
        for run in runs.each(runs.pending_runs, opened):
            _one_run(context, run.run_id, lambda run=run: _reconcile_unattached(context, opened, run))
    return dg.SkipReason("cancellations and unreported ends handled")


def _one_run(context: dg.SensorEvaluationContext, run_id: str, act) -> None:
    """One run's trouble (a lock timeout, a row this release cannot write) is logged by its code
    and tried again next tick: raised, it would end the tick before every run after it, and the
    same run first in line would do so again on every tick. The message is not logged: a
    database error's may quote a statement's parameters."""
    try:
        act()
    except Exception as error:  # noqa: BLE001 - isolation is the point
        code = error.code.value if isinstance(error, ItoError) else type(error).__name__
        context.log.warning(f"{run_id}: not handled this tick ({code}); tried again on the next")


# How long a Dagster run may stay canceling after the ledger run's cancellation before the sensor
# marks it canceled: Dagster's own run monitoring default (`cancel_timeout_seconds`, 180 s). The
# embedded instance runs no monitoring, and a run whose worker is gone (killed, its machine
# rebooted) has no process to hear the termination: it stayed canceling, and its ledger run
# cancelling, holding its booking and its reserved budget, for good.
CANCEL_TIMEOUT_S = 180


def _cancel(context: dg.SensorEvaluationContext, opened, run: runs.Run) -> None:
    live = [r for r in _dagster_runs_of(context.instance, run.run_id) if not r.is_finished]
    overdue = opened.now() - run.updated_at >= CANCEL_TIMEOUT_S
    for dagster_run in live:  # queued ones too: nothing of a cancelled run starts later
        if overdue and dagster_run.status is dg.DagsterRunStatus.CANCELING:
            context.instance.report_run_canceled(
                dagster_run, message=f"still canceling {CANCEL_TIMEOUT_S} s after {run.run_id} was cancelled: "
                                     "no process ended it")
            context.log.warning(f"marked {dagster_run.run_id} canceled for {run.run_id}: no process ended it "
                                f"within {CANCEL_TIMEOUT_S} s")
            continue
        context.instance.run_coordinator.cancel_run(dagster_run.run_id)
        context.log.info(f"terminating {dagster_run.run_id} for {run.run_id}")
    if live:  # the ends are written on the next tick, once Dagster has them
        return
    attached = context.instance.get_run_by_id(run.dagster_run_id) if run.dagster_run_id else None
    if attached is not None:
        report_outcome(opened, context.instance, attached, run.run_id)
    else:
        runs.set_state(opened, run.run_id, RunState.CANCELLED, reason="cancelled by request")


def _reconcile_launched(context: dg.SensorEvaluationContext, opened, run: runs.Run) -> None:
    attached = context.instance.get_run_by_id(run.dagster_run_id)
    if attached is not None and attached.is_finished and run.state is not RunState.CANCELLING:
        report_outcome(opened, context.instance, attached, run.run_id)


def _reconcile_unattached(context: dg.SensorEvaluationContext, opened, run: runs.Run) -> None:
    """A Dagster run can end before its authorization step attaches it (the ledger was unreachable
    then, or its worker died at start); if its end could not be written either, the ledger run
    stays queued and unattached while its run key is spent, so no sensor launches it again and it
    would hold its booking forever. Its newest Dagster run, once every one has ended, speaks for it."""
    tried = _dagster_runs_of(context.instance, run.run_id)  # newest first
    if tried and all(r.is_finished for r in tried):
        report_outcome(opened, context.instance, tried[0], run.run_id)


def _withdraw_queued_runs_of_ended(context: dg.SensorEvaluationContext, opened) -> None:
    """A run cancelled before its first step ends at once in the ledger (nothing to terminate),
    while the Dagster run the sensor requested may still wait in the run queue: withdraw it, so it
    never starts only to be refused by its authorization step."""
    waiting = context.instance.get_runs(filters=dg.RunsFilter(
        job_name=training_job.name, statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]))
    for dagster_run in waiting:
        run_id = run_tags.run_id_of(dagster_run.tags)
        if run_id is not None:
            _one_run(context, run_id, lambda d=dagster_run, r=run_id: _withdraw_if_ended(context, opened, d, r))


def _withdraw_if_ended(context: dg.SensorEvaluationContext, opened, dagster_run: dg.DagsterRun, run_id: str) -> None:
    try:
        ended = runs.get(opened, run_id).state in TERMINAL_RUN_STATES
    except ItoError:  # not a ledger run: not ours to withdraw
        return
    if not ended:
        return
    if dagster_run.status is dg.DagsterRunStatus.QUEUED:
        context.instance.run_coordinator.cancel_run(dagster_run.run_id)
    else:  # created, not launched: no process to terminate; its run worker will not start steps
        context.instance.report_run_canceled(dagster_run, message=f"{run_id} ended before this run started")
    context.log.info(f"withdrew waiting {dagster_run.run_id}: {run_id} already ended")


def _report(context: dg.RunStatusSensorContext, ledger: LedgerResource) -> None:
    run_id = run_tags.run_id_of(context.dagster_run.tags)
    if run_id:
        with ledger.open() as opened:
            report_outcome(opened, context.instance, context.dagster_run, run_id)


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.SUCCESS, monitored_jobs=[training_job],
    default_status=dg.DefaultSensorStatus.RUNNING, description="A training run succeeded -> the ledger.",
)
def training_succeeded_sensor(context: dg.RunStatusSensorContext, ledger: LedgerResource) -> None:
    _report(context, ledger)


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.FAILURE, monitored_jobs=[training_job],
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="A training run failed or was stopped by a gate -> failed / gate_failed in the ledger.",
)
def training_failed_sensor(context: dg.RunStatusSensorContext, ledger: LedgerResource) -> None:
    _report(context, ledger)


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.CANCELED, monitored_jobs=[training_job],
    default_status=dg.DefaultSensorStatus.RUNNING, description="A training run was terminated -> the ledger.",
)
def training_canceled_sensor(context: dg.RunStatusSensorContext, ledger: LedgerResource) -> None:
    _report(context, ledger)
