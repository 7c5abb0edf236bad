"""Cancel, cleanup, re-verification and telemetry in the core."""

from __future__ import annotations

import os

import pytest

from gate_world import verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import authorization, bookings, cancel, cleanup, confirm_request, create_run, runs, telemetry
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.states import BookingState, RunState


def code_of(call) -> ErrorCode:
    with pytest.raises(ItoError) as info:
        call()
    return info.value.code


def make_run(world, key: str = "train-key-0001"):
    return create_run.create_run(world.ledger, world.policy, world.account, TrainRequest(
        booking_id=world.booking_id, verified=verified(), confirmation_ref=world.confirm_train(),
        idempotency_key=key)).run


def confirm(world, action: str, run_id: str | None = None) -> str:
    if action == "cancel":
        ref = confirm_request.request_cancel(world.ledger, world.policy, world.account, run_id).ref
    else:
        ref = confirm_request.request_cleanup(world.ledger, world.policy, world.account).ref
    world.approve(ref)
    return ref


def test_cancel_of_an_unlaunched_run_is_immediate_and_replayable(world) -> None:
    run = make_run(world)
    ref = confirm(world, "cancel", run.run_id)
    done = cancel.cancel_run(world.ledger, world.account, run.run_id, confirmation_ref=ref,
                             idempotency_key="cancel-key-0001")
    assert done.run.state is RunState.CANCELLED and not done.replayed
    again = cancel.cancel_run(world.ledger, world.account, run.run_id, confirmation_ref=ref,
                              idempotency_key="cancel-key-0001")
    assert again.replayed and again.run.state is RunState.CANCELLED
    assert code_of(lambda: confirm(world, "cancel", run.run_id)) is ErrorCode.RUN_FINISHED


def test_cancel_of_a_launched_run_waits_for_dagster(world) -> None:
    run = make_run(world)
    runs.attach_dagster_run(world.ledger, run.run_id, "dagster-9")
    runs.set_state(world.ledger, run.run_id, RunState.RUNNING)
    ref = confirm(world, "cancel", run.run_id)
    done = cancel.cancel_run(world.ledger, world.account, run.run_id, confirmation_ref=ref,
                             idempotency_key="cancel-key-0001")
    assert done.run.state is RunState.CANCELLING
    assert [r.run_id for r in runs.cancelling_runs(world.ledger)] == [run.run_id]
    assert runs.set_state(world.ledger, run.run_id, RunState.CANCELLED).state is RunState.CANCELLED


def test_cancel_needs_its_own_confirmation(world) -> None:
    run = make_run(world)
    train_ref = confirm(world, "cleanup")  # approved, but for another action
    assert code_of(lambda: cancel.cancel_run(world.ledger, world.account, run.run_id, confirmation_ref=train_ref,
                                             idempotency_key="cancel-key-0001")) is ErrorCode.CONFIRMATION_MISMATCH
    assert code_of(lambda: cancel.cancel_run(world.ledger, world.other, run.run_id, confirmation_ref=train_ref,
                                             idempotency_key="cancel-key-0001")) is ErrorCode.RUN_NOT_FOUND


def test_cleanup_removes_finished_artifacts_only_and_never_a_booking(world) -> None:
    run = make_run(world)
    os.makedirs(run.checkpoint_dir)
    with open(os.path.join(run.checkpoint_dir, "step-10.pt"), "wb") as handle:
        handle.write(b"x" * 100)
    telemetry.record_checkpoint(world.ledger, run.run_id, step=10, path="step-10.pt", size_bytes=100)
    report = cleanup.cleanup_tenant(world.ledger, world.policy, world.account,
                                    confirmation_ref=confirm(world, "cleanup"), idempotency_key="clean-key-0001")
    assert report["num_runs_cleaned"] == 0 and os.path.exists(run.checkpoint_dir)  # still queued
    runs.set_state(world.ledger, run.run_id, RunState.FAILED, reason="test")
    report = cleanup.cleanup_tenant(world.ledger, world.policy, world.account,
                                    confirmation_ref=confirm(world, "cleanup"), idempotency_key="clean-key-0002")
    assert report["num_runs_cleaned"] == 1 and report["num_bytes_removed"] == 100
    assert report["runs"][0]["num_checkpoints_removed"] == 1 and report["bookings_changed"] == []
    assert not os.path.exists(run.checkpoint_dir)
    assert bookings.get(world.ledger, world.booking_id).state is BookingState.COMPLETED
    assert telemetry.checkpoints(world.ledger, run.run_id)[0].removed_at is not None
    replay = cleanup.cleanup_tenant(world.ledger, world.policy, world.account,
                                    confirmation_ref="cfr_" + "0" * 26, idempotency_key="clean-key-0002")
    assert replay["replayed"] and replay["num_runs_cleaned"] == 1


def test_reverify_follows_the_ledger(world) -> None:
    run = make_run(world)
    auth = authorization.reverify(world.ledger, run.run_id)
    assert auth.tags()["ito/run_id"] == run.run_id and auth.cost_cents == run.cost_cents
    bookings.amend(world.ledger, world.booking_id, {"network": "eth-100g"}, actor=None)
    assert code_of(lambda: authorization.reverify(world.ledger, run.run_id)) is ErrorCode.NETWORK_MISMATCH
    bookings.transition(world.ledger, world.booking_id, "revoke", actor=None)
    assert code_of(lambda: authorization.reverify(world.ledger, run.run_id)) is ErrorCode.BOOKING_REVOKED


def test_logs_are_redacted_and_paged(world) -> None:
    run = make_run(world)
    canary = "ghp_CANARYcanary0123456789abcdefghijABCD"
    telemetry.append_log(world.ledger, run.run_id, "INFO", f"cloning with {canary} now")
    telemetry.append_log(world.ledger, run.run_id, "INFO", "Authorization: Bearer abcdefghijklmnopqrstuvwx")
    telemetry.append_log(world.ledger, run.run_id, "INFO", "step 10 loss 2.5")
    page = telemetry.logs(world.ledger, run.run_id, limit=2)
    assert len(page) == 2 and all(canary not in line.message for line in page)
    assert "abcdefghijklmnopqrstuvwx" not in page[1].message
    rest = telemetry.logs(world.ledger, run.run_id, after=page[-1].seq)
    assert [line.message for line in rest] == ["step 10 loss 2.5"]
    # An environment or configuration dump: the names stay, their values do not.
    telemetry.append_log(world.ledger, run.run_id, "ERROR",
                         'env PGPASSWORD=canary1 token_budget=512 {"api_key": "canary 2"}; the password is Canary3')
    dumped = telemetry.logs(world.ledger, run.run_id, after=rest[-1].seq)[0].message
    assert dumped == ('env PGPASSWORD=[REDACTED] token_budget=512 {"api_key": [REDACTED]}; '
                      'the password is [REDACTED]')
    telemetry.record_metric(world.ledger, run.run_id, 10, "loss", 2.5)
    assert telemetry.metrics(world.ledger, run.run_id)[0].value == 2.5


def test_cleanup_releases_a_booking_only_with_its_own_confirmation(world) -> None:
    run = make_run(world)
    runs.set_state(world.ledger, run.run_id, RunState.FAILED, reason="test")
    release_ref = confirm_request.request_release(world.ledger, world.policy, world.account, world.booking_id).ref
    cleanup_ref = confirm(world, "cleanup")
    release = cleanup.Release(booking_id=world.booking_id, confirmation_ref=release_ref)
    unapproved = lambda: cleanup.cleanup_tenant(world.ledger, world.policy, world.account,  # noqa: E731
                                                confirmation_ref=cleanup_ref, idempotency_key="clean-key-0003",
                                                release=release)
    assert code_of(unapproved) is ErrorCode.CONFIRMATION_NOT_APPROVED
    assert bookings.get(world.ledger, world.booking_id).state is BookingState.COMPLETED
    world.approve(release_ref)
    other_booking = cleanup.Release(booking_id=world.booking(), confirmation_ref=release_ref)
    assert code_of(lambda: cleanup.cleanup_tenant(world.ledger, world.policy, world.account,
                                                  confirmation_ref=cleanup_ref, idempotency_key="clean-key-0004",
                                                  release=other_booking)) is ErrorCode.CONFIRMATION_MISMATCH
    report = unapproved()
    assert report["bookings_changed"] == [{"booking_id": world.booking_id, "state": "released"}]
    assert bookings.get(world.ledger, world.booking_id).state is BookingState.RELEASED


def test_a_failed_gate_is_never_reported_as_a_cancellation(world) -> None:
    from ito_assets.control.outcome import record_outcome

    run = make_run(world)
    runs.attach_dagster_run(world.ledger, run.run_id, "dagster-1")
    runs.set_state(world.ledger, run.run_id, RunState.RUNNING)
    runs.set_state(world.ledger, run.run_id, RunState.CANCELLING)
    ended = record_outcome(world.ledger, run.run_id, succeeded=False, gate_code="EVAL_GATE_FAILED")
    assert ended.state is RunState.GATE_FAILED and ended.state_reason == "EVAL_GATE_FAILED"
    again = record_outcome(world.ledger, run.run_id, succeeded=False)  # a repeated report changes nothing
    assert again.state is RunState.GATE_FAILED


def test_a_cancelled_run_that_ended_without_a_gate_is_cancelled(world) -> None:
    from ito_assets.control.outcome import record_outcome

    run = make_run(world)
    runs.attach_dagster_run(world.ledger, run.run_id, "dagster-1")
    runs.set_state(world.ledger, run.run_id, RunState.CANCELLING)
    assert record_outcome(world.ledger, run.run_id, succeeded=False).state is RunState.CANCELLED
    assert runs.launched_active_runs(world.ledger) == []
