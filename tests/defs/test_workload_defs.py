"""A run created through the gates is launched once, re-authorized before its first step, and
its end is written back to the ledger (succeeded, or gate_failed with the gate's code)."""

from __future__ import annotations

import time

import pytest

from definitions import build_definitions
from control.gate_world import Clock, make_policy, make_world, verified
from ito_assets.control import bookings, confirm_request, create_run, runs
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.ledger import open_ledger
from ito_assets.control.states import RunState
from ito_assets.local_run import RunSummary, evaluate_sensor


@pytest.fixture
def world_and_defs(installation, tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    now = int(time.time())
    ledger = open_ledger(url, clock=Clock(now))
    world = make_world(ledger, make_policy(tmp_path), Clock(now))
    world.booking_id = world.booking(starts_at=now - 3600, ends_at=now + 3600)
    # The workload shell alone: the training stages need prepared data (tested in tests/runtime).
    defs = build_definitions(installation.settings.with_overrides(ledger_url=url, executor="in_process"),
                             domains=("manifest", "workload"))
    yield world, defs
    ledger.dispose()


def _create(world, key="train-key-0001"):
    request = TrainRequest(booking_id=world.booking_id, verified=verified(),
                           confirmation_ref=world.confirm_train(world.booking_id), idempotency_key=key)
    return create_run.create_run(world.ledger, world.policy, world.account, request).run


def _tick(defs, instance, name="confirmed_run_sensor") -> RunSummary:
    summary = RunSummary()
    evaluate_sensor(defs, instance, name, summary)
    return summary


def test_a_queued_run_is_launched_once_and_reported(world_and_defs, instance):
    world, defs = world_and_defs
    run = _create(world)
    first = _tick(defs, instance)
    assert first.num_runs_launched == 1 and first.num_runs_failed == 0
    assert "run_authorization:run_still_authorized" in " ".join(first.checks_passed)
    ledger_run = runs.get(world.ledger, run.run_id)
    assert ledger_run.state is RunState.SUCCEEDED and ledger_run.dagster_run_id
    (dagster_run,) = instance.get_runs()
    assert dagster_run.run_id == ledger_run.dagster_run_id
    assert dagster_run.tags["dagster/run_key"] == run.run_id
    assert dagster_run.tags["ito/manifest_digest"] == run.manifest_digest
    assert dagster_run.tags["ito/idempotency_key"] == "train-key-0001"
    assert _tick(defs, instance).num_runs_launched == 0  # no longer pending: never a second launch


def test_a_revoked_booking_stops_the_run_as_gate_failed(world_and_defs, instance):
    world, defs = world_and_defs
    run = _create(world)
    bookings.transition(world.ledger, world.booking_id, "revoke", actor=None)
    summary = _tick(defs, instance)
    assert summary.num_runs_failed == 1
    assert any("run_still_authorized" in name for name in summary.checks_failed)
    ledger_run = runs.get(world.ledger, run.run_id)
    assert ledger_run.state is RunState.GATE_FAILED and ledger_run.state_reason == "BOOKING_REVOKED"


def test_cancellation_of_a_finished_dagster_run_is_recorded(world_and_defs, instance):
    world, defs = world_and_defs
    run = _create(world)
    runs.attach_dagster_run(world.ledger, run.run_id, "not-a-dagster-run")
    runs.set_state(world.ledger, run.run_id, RunState.RUNNING)
    ref = confirm_request.request_cancel(world.ledger, world.policy, world.account, run.run_id).ref
    world.approve(ref)
    from ito_assets.control import cancel

    cancel.cancel_run(world.ledger, world.account, run.run_id, confirmation_ref=ref, idempotency_key="cancel-0001")
    assert runs.get(world.ledger, run.run_id).state is RunState.CANCELLING
    _tick(defs, instance, "cancellation_sensor")
    assert runs.get(world.ledger, run.run_id).state is RunState.CANCELLED


def test_the_dagster_event_log_reaches_ito_logs(world_and_defs, instance):
    from ito_assets.control import telemetry

    world, defs = world_and_defs
    run = _create(world)
    _tick(defs, instance)
    text = "\n".join(line.message for line in telemetry.logs(world.ledger, run.run_id, limit=500))
    assert "STEP_SUCCESS run_authorization" in text and "RUN_SUCCESS" in text


def test_a_run_with_a_damaged_digest_does_not_hold_back_the_others(world_and_defs, instance):
    world, defs = world_and_defs
    good = _create(world, key="train-key-0001")
    now = int(time.time())
    world.booking_id = world.booking(starts_at=now - 3600, ends_at=now + 3600)  # one run per booking
    damaged = _create(world, key="train-key-0002")
    raw = world.ledger.engine.raw_connection()
    try:  # a row no code path writes: the digest is not sha256 hex any more
        cursor = raw.cursor()
        cursor.execute("PRAGMA foreign_keys=OFF")
        cursor.execute("UPDATE runs SET manifest_digest = 'sha256:not-hex' WHERE run_id = ?", (damaged.run_id,))
        raw.commit()
        cursor.close()
    finally:
        raw.close()
    assert _tick(defs, instance).num_runs_launched == 1
    assert runs.get(world.ledger, good.run_id).state is RunState.SUCCEEDED
    assert runs.get(world.ledger, damaged.run_id).state is RunState.QUEUED
