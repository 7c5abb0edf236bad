"""cancellation_sensor with a Dagster run that no process will end (its worker gone, on an
instance without run monitoring): it is terminated, then, once it stayed canceling past Dagster's
cancel timeout, marked canceled, so the ledger run ends instead of holding its booking for good."""

from __future__ import annotations

import uuid

import dagster as dg
import sqlalchemy as sa

from ito_assets.control import cancel, confirm_request, run_tags, runs
from ito_assets.control.ledger import runs as runs_table
from ito_assets.control.states import RunState
from sensors import training_runs
from test_workload_defs import _create, _tick, world_and_defs  # noqa: F401 - the ledger and the workload shell

CANCEL_TIMEOUT_S = getattr(training_runs, "CANCEL_TIMEOUT_S", 180)  # Dagster's cancel_timeout_seconds default


def _orphan(world, instance, run: runs.Run) -> dg.DagsterRun:
    """A Dagster run that started and attached itself, whose worker then died unseen."""
    dagster_run = instance.add_run(dg.DagsterRun(
        job_name="training_job", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED,
        tags={**run_tags.for_run(run), "dagster/run_key": run.run_id}))
    runs.attach_dagster_run(world.ledger, run.run_id, dagster_run.run_id)
    runs.set_state(world.ledger, run.run_id, RunState.RUNNING)
    return dagster_run


def _cancelled_ago(world, run: runs.Run, seconds: int) -> None:
    ref = confirm_request.request_cancel(world.ledger, world.policy, world.account, run.run_id).ref
    world.approve(ref)
    cancel.cancel_run(world.ledger, world.account, run.run_id, confirmation_ref=ref, idempotency_key="cancel-0001")
    with world.ledger.write() as conn:  # the sensor reads its own clock: move the cancellation back
        now = runs.get(world.ledger, run.run_id).updated_at
        conn.execute(sa.update(runs_table).where(runs_table.c.run_id == run.run_id)
                     .values(updated_at=now - seconds))


def test_a_dagster_run_no_process_ends_is_marked_canceled_after_the_timeout(world_and_defs, instance):
    world, defs = world_and_defs
    run = _create(world)
    dagster_run = _orphan(world, instance, run)
    _cancelled_ago(world, run, CANCEL_TIMEOUT_S + 5)
    _tick(defs, instance, "cancellation_sensor")  # asks Dagster to terminate: no process hears it
    assert instance.get_run_by_id(dagster_run.run_id).status is dg.DagsterRunStatus.CANCELING
    _tick(defs, instance, "cancellation_sensor")  # still canceling past the timeout: marked canceled
    assert instance.get_run_by_id(dagster_run.run_id).status is dg.DagsterRunStatus.CANCELED
    _tick(defs, instance, "cancellation_sensor")
    assert runs.get(world.ledger, run.run_id).state is RunState.CANCELLED


def test_within_the_timeout_a_canceling_run_is_left_to_its_process(world_and_defs, instance):
    world, defs = world_and_defs
    run = _create(world)
    dagster_run = _orphan(world, instance, run)
    _cancelled_ago(world, run, 0)
    for _ in range(3):
        _tick(defs, instance, "cancellation_sensor")
    assert instance.get_run_by_id(dagster_run.run_id).status is dg.DagsterRunStatus.CANCELING
    assert runs.get(world.ledger, run.run_id).state is RunState.CANCELLING
