"""The money paths under hostile timing: what the cap holds when a run that gave its cost back is
started late, a confirmation that expires while its train waits for a lock, a failure after the
reservation, and a refusal whose audit write fails."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gate_world import COST, manifest_bytes, verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, bookings, budget, confirmations, create_run, intake, runs
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.ledger import budgets as budgets_table
from ito_assets.control.ledger import confirmations as confirmations_table
from ito_assets.control.ledger import idempotency_keys, manifests
from ito_assets.control.ledger import runs as runs_table
from ito_assets.control.states import RunState


def _train(world, manifest, key: str, ref: str | None = None):
    request = TrainRequest(booking_id=world.booking_id, verified=manifest,
                           confirmation_ref=ref or world.confirm_train(manifest=manifest), idempotency_key=key)
    return create_run.create_run(world.ledger, world.policy, world.account, request)


def _code_of(call) -> ErrorCode:
    with pytest.raises(ItoError) as info:
        call()
    return info.value.code


def _committed(world, manifest) -> int:
    with world.ledger.read() as conn:
        return budget.state(conn, world.account.account_id, manifest.digest, manifest.manifest.budget).committed_cents


def _expiry(world, ref: str) -> int:
    with world.ledger.read() as conn:
        return confirmations.resolve(conn, ref, account_id=None).expires_at


def _rows(world, table) -> int:
    with world.ledger.read() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()


@pytest.mark.parametrize("end", [RunState.FAILED, RunState.GATE_FAILED, RunState.CANCELLED])
def test_a_run_that_ended_unstarted_cannot_start_later_and_charge_the_cap_twice(world, end) -> None:
    capped = verified(manifest_bytes(budget__cap_cents=COST, budget__max_incremental_cents=COST))
    first = _train(world, capped, "late-start-01").run
    moving = RunState.CANCELLING if end is RunState.CANCELLED else RunState.RUNNING
    runs.set_state(world.ledger, first.run_id, moving)
    runs.set_state(world.ledger, first.run_id, end)  # ended before any stage launched: its cost went back
    world.booking_id = world.booking()
    _train(world, capped, "late-start-02")  # takes the cost the first gave back
    assert _code_of(lambda: runs.mark_training_started(world.ledger, first.run_id)) is ErrorCode.RUN_FINISHED
    assert runs.get(world.ledger, first.run_id).started_at is None
    assert _committed(world, capped) == COST


def _lock_held_past_expiry(world, monkeypatch, module, name: str, ref: str) -> None:
    """The request arrives a second before `ref` expires; the row lock `module.name` takes (with
    for_update) is held by another writer until the expiry second has come."""
    expires = _expiry(world, ref)
    world.clock.now = expires - 1
    original = getattr(module, name)

    def held(*args, **kwargs):
        found = original(*args, **kwargs)
        if kwargs.get("for_update"):
            world.clock.now = expires
        return found
    monkeypatch.setattr(module, name, held)


def test_a_confirmation_that_expires_while_its_train_waits_for_the_booking_lock_is_refused(world, monkeypatch) -> None:
    ref = world.confirm_train()
    _lock_held_past_expiry(world, monkeypatch, bookings, "load", ref)
    assert _code_of(lambda: _train(world, verified(), "lock-wait-01", ref)) is ErrorCode.CONFIRMATION_EXPIRED
    assert _rows(world, runs_table) == 0


def test_a_confirmation_that_expires_while_its_train_waits_for_the_confirmation_lock_is_refused(world, monkeypatch) -> None:
    """A twin holds the confirmation's row (the same ref on another booking, or the desk approving
    it) until its expiry second: the train's clock is read after that lock, not before."""
    ref = world.confirm_train()
    _lock_held_past_expiry(world, monkeypatch, confirmations, "resolve", ref)
    assert _code_of(lambda: _train(world, verified(), "lock-wait-02", ref)) is ErrorCode.CONFIRMATION_EXPIRED
    assert _rows(world, runs_table) == 0


def test_a_confirmation_that_expires_while_its_approval_waits_is_not_approved(world, monkeypatch) -> None:
    ref = world.confirm_train(approve=False)
    expires = _expiry(world, ref)
    world.clock.now = expires - 1
    resolved = confirmations.resolve

    def slow_resolve(conn, ref, *, account_id, for_update=False):
        found = resolved(conn, ref, account_id=account_id, for_update=for_update)
        world.clock.now = expires  # the approval waited for the write lock past the expiry second
        return found
    monkeypatch.setattr(confirmations, "resolve", slow_resolve)
    assert _code_of(lambda: world.approve(ref, COST)) is ErrorCode.CONFIRMATION_EXPIRED
    monkeypatch.undo()
    assert confirmations.show(world.ledger, ref).approved_at is None


def test_a_failure_after_the_reservation_consumes_nothing_and_the_retry_succeeds(world, monkeypatch) -> None:
    capped = verified(manifest_bytes(budget__cap_cents=COST, budget__max_incremental_cents=COST))
    ref = world.confirm_train(manifest=capped)

    def broken_store(*_args, **_kwargs):  # after the confirmation is consumed and the key reserved
        raise RuntimeError("disk went away")
    monkeypatch.setattr(intake, "store", broken_store)
    with pytest.raises(RuntimeError):
        _train(world, capped, "midway-fail-01", ref)
    with world.ledger.read() as conn:
        consumed = conn.execute(sa.select(confirmations_table.c.consumed_at)).scalars().all()
    assert consumed == [None]
    assert [_rows(world, t) for t in (runs_table, idempotency_keys, manifests, budgets_table)] == [0, 0, 0, 0]
    assert _committed(world, capped) == 0
    monkeypatch.undo()
    assert _train(world, capped, "midway-fail-01", ref).replayed is False  # the same key and confirmation
    assert _committed(world, capped) == COST


def test_a_refusal_whose_audit_write_fails_keeps_its_own_code(world, monkeypatch) -> None:
    capped = verified(manifest_bytes(budget__cap_cents=COST, budget__max_incremental_cents=COST))
    ref = world.confirm_train(manifest=capped)
    world.booking_id = world.booking()
    _train(world, capped, "audit-fail-01")  # spends the whole cap

    def busy(*_args, **_kwargs):
        raise sa.exc.OperationalError("INSERT INTO audit_events", {}, Exception("database is locked"))
    monkeypatch.setattr(audit, "record_refusal", busy)
    first_booking = confirmations.show(world.ledger, ref).booking_id
    request = TrainRequest(booking_id=first_booking, verified=capped, confirmation_ref=ref,
                           idempotency_key="audit-fail-02")
    call = lambda: create_run.create_run(world.ledger, world.policy, world.account, request)  # noqa: E731
    assert _code_of(call) is ErrorCode.BUDGET_EXCEEDED


@pytest.mark.parametrize("held", ["the run", "the confirmation"])
def test_a_cancel_confirmation_that_expires_while_the_cancel_waits_for_a_lock_is_refused(world, monkeypatch, held) -> None:
    """The cancel locks the run, then its confirmation: a wait for either that outlasts the expiry
    second is read after it."""
    from ito_assets.control import cancel, confirm_request

    run = _train(world, verified(), "cancel-wait-01").run
    ref = confirm_request.request_cancel(world.ledger, world.policy, world.account, run.run_id).ref
    world.approve(ref)
    module, name = (runs, "load") if held == "the run" else (confirmations, "resolve")
    _lock_held_past_expiry(world, monkeypatch, module, name, ref)
    assert _code_of(lambda: cancel.cancel_run(world.ledger, world.account, run.run_id, confirmation_ref=ref,
                                              idempotency_key="cancel-wait-02")) is ErrorCode.CONFIRMATION_EXPIRED
    monkeypatch.undo()
    assert runs.get(world.ledger, run.run_id).state is RunState.QUEUED


def test_a_cleanup_confirmation_that_expires_while_the_cleanup_waits_for_it_is_refused(world, monkeypatch) -> None:
    from ito_assets.control import cleanup, confirm_request

    ref = confirm_request.request_cleanup(world.ledger, world.policy, world.account).ref
    world.approve(ref)
    _lock_held_past_expiry(world, monkeypatch, confirmations, "resolve", ref)
    assert _code_of(lambda: cleanup.cleanup_tenant(world.ledger, world.policy, world.account, confirmation_ref=ref,
                                                   idempotency_key="cleanup-wait-01")) is ErrorCode.CONFIRMATION_EXPIRED
    monkeypatch.undo()
    assert confirmations.show(world.ledger, ref).consumed_at is None
