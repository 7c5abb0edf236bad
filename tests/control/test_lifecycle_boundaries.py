"""Boundaries of cleanup and cancellation in the core: exact reports, rows left in the ledger,
files removed and kept, audit events and the idempotency record each mutation leaves behind.

The promises: cancellation and cleanup are separate mutations with their own confirmation and
idempotency bounds; cleanup is per tenant, observable, and never releases or modifies a booking
unless that release was explicitly confirmed."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import pytest
import sqlalchemy as sa

from gate_world import T0, new_run
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import (audit, bookings, cancel, cleanup, confirm_request, idempotency, ids,
                              runs, telemetry)
from ito_assets.control.fingerprint import cleanup_fingerprint, request_fingerprint
from ito_assets.control.ledger import confirmations as confirmations_table
from ito_assets.control.ledger import run_checkpoints
from ito_assets.control.ledger import runs as runs_table
from ito_assets.control.states import BookingState, RunState

# ---------------------------------------------------------------- helpers


def error_of(call) -> ItoError:
    with pytest.raises(ItoError) as info:
        call()
    return info.value


def code_of(call) -> ErrorCode:
    return error_of(call).code



def cleanup_ref(world, account=None) -> str:
    ref = confirm_request.request_cleanup(world.ledger, world.policy, account or world.account).ref
    world.approve(ref)
    return ref


def cancel_ref(world, run_id: str, account=None) -> str:
    ref = confirm_request.request_cancel(world.ledger, world.policy, account or world.account, run_id).ref
    world.approve(ref)
    return ref


def release_ref(world, booking_id: str, account=None, *, approve: bool = True) -> str:
    ref = confirm_request.request_release(world.ledger, world.policy, account or world.account, booking_id).ref
    if approve:
        world.approve(ref)
    return ref


def clean(world, ref: str, key: str, *, account=None, release: cleanup.Release | None = None) -> dict:
    return cleanup.cleanup_tenant(world.ledger, world.policy, account or world.account, confirmation_ref=ref,
                                  idempotency_key=key, release=release)


def do_cancel(world, run_id: str, ref: str, key: str, account=None) -> cancel.Cancelled:
    return cancel.cancel_run(world.ledger, account or world.account, run_id, confirmation_ref=ref,
                             idempotency_key=key)


def confirmation_row(world, ref: str) -> dict:
    with world.ledger.read() as conn:
        return dict(conn.execute(sa.select(confirmations_table).where(
            confirmations_table.c.ref_hash == ids.secret_hash(ref))).mappings().one())


def run_row(world, run_id: str) -> dict:
    with world.ledger.read() as conn:
        return dict(conn.execute(sa.select(runs_table).where(runs_table.c.run_id == run_id)).mappings().one())


def key_record(world, key: str, account=None):
    with world.ledger.read() as conn:
        return idempotency.lookup(conn, (account or world.account).account_id, key)


def events(world, kind: str) -> list[audit.AuditEvent]:
    return [e for e in audit.events(world.ledger, limit=10_000) if e.kind == kind]


def write_file(path: str, size: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(b"x" * size)


def finish(world, run: runs.Run, state: RunState = RunState.FAILED) -> None:
    runs.set_state(world.ledger, run.run_id, state, reason="test")


def untouched(world, ref: str) -> bool:
    row = confirmation_row(world, ref)
    return (row["consumed_at"], row["consumed_by_run"], row["consumed_by_key"]) == (None, None, None)


# ---------------------------------------------------------------- cleanup: what it removes and reports


def test_cleanup_report_rows_files_and_audit_are_exact(world, tmp_path) -> None:
    first = new_run(world)
    write_file(os.path.join(first.checkpoint_dir, "step-10.pt"), 100)
    write_file(os.path.join(first.checkpoint_dir, "nested", "deeper", "step-20.pt"), 50)
    write_file(os.path.join(first.checkpoint_dir, "empty.pt"), 0)
    # Links inside a run's folder are removed and counted as links (a link to a folder too), and
    # never followed or removed through.
    outside = tmp_path / "outside"
    write_file(str(outside / "big.bin"), 10_000)
    os.symlink(outside, os.path.join(first.checkpoint_dir, "dir-link"))
    os.symlink(outside / "big.bin", os.path.join(first.checkpoint_dir, "file-link"))
    link_size = sum(os.lstat(os.path.join(first.checkpoint_dir, name)).st_size for name in ("dir-link", "file-link"))
    for step in (10, 20, 30):
        telemetry.record_checkpoint(world.ledger, first.run_id, step=step, path=f"step-{step}.pt", size_bytes=1)
    with world.ledger.write() as conn:  # one checkpoint was already pruned earlier, at T0 - 5
        conn.execute(run_checkpoints.update().where(run_checkpoints.c.run_id == first.run_id,
                                                    run_checkpoints.c.step == 30).values(removed_at=T0 - 5))
    finish(world, first)
    second = new_run(world)  # same booking, once the first no longer holds it; no folder on disk
    finish(world, second, RunState.GATE_FAILED)
    queued = new_run(world, booking_id=world.booking())  # still active: kept
    write_file(os.path.join(queued.checkpoint_dir, "step-1.pt"), 7)
    rival = new_run(world, account=world.other, booking_id=world.booking(account=world.other))
    write_file(os.path.join(rival.checkpoint_dir, "step-1.pt"), 9)
    finish(world, rival)

    world.clock.now = T0 + 17
    ref = cleanup_ref(world)
    report = clean(world, ref, "clean-key-0001")

    expected_runs = sorted([
        {"run_id": first.run_id, "num_files_removed": 5, "num_bytes_removed": 150 + link_size,
         "num_checkpoints_removed": 2},
        {"run_id": second.run_id, "num_files_removed": 0, "num_bytes_removed": 0, "num_checkpoints_removed": 0},
    ], key=lambda r: r["run_id"])
    expected = {"account_id": world.account.account_id, "idempotency_key": "clean-key-0001",
                "num_runs_cleaned": 2, "num_bytes_removed": 150 + link_size, "runs": expected_runs,
                "runs_kept": [], "bookings_changed": [], "cleaned_at": T0 + 17}
    assert report == {**expected, "replayed": False}
    # Files: the finished run's folder is gone, the link targets and every other folder are kept.
    assert not os.path.lexists(first.checkpoint_dir)
    assert (outside / "big.bin").stat().st_size == 10_000
    assert os.path.getsize(os.path.join(queued.checkpoint_dir, "step-1.pt")) == 7
    assert os.path.getsize(os.path.join(rival.checkpoint_dir, "step-1.pt")) == 9
    # Rows: cleaned runs are stamped, the others are not; checkpoints removed now, the old one kept.
    for run in (first, second):
        row = run_row(world, run.run_id)
        assert (row["cleaned_at"], row["updated_at"]) == (T0 + 17, T0 + 17)
    assert run_row(world, queued.run_id)["cleaned_at"] is None
    assert run_row(world, rival.run_id)["cleaned_at"] is None
    assert run_row(world, first.run_id)["state"] == "failed"  # cleanup never changes a run's state
    with world.ledger.read() as conn:
        removed = dict(conn.execute(sa.select(run_checkpoints.c.step, run_checkpoints.c.removed_at).where(
            run_checkpoints.c.run_id == first.run_id)).all())
    assert removed == {10: T0 + 17, 20: T0 + 17, 30: T0 - 5}
    # Bookings are never touched by a plain cleanup.
    assert bookings.get(world.ledger, world.booking_id).state is BookingState.COMPLETED
    assert events(world, "booking_released") == []
    # The confirmation is consumed by this key; the key records the report for replays.
    row = confirmation_row(world, ref)
    assert (row["consumed_at"], row["consumed_by_run"], row["consumed_by_key"]) == (T0 + 17, None, "clean-key-0001")
    record = key_record(world, "clean-key-0001")
    assert (record.action, record.run_id, record.created_at) == ("cleanup", None, T0 + 17)
    assert record.fingerprint == cleanup_fingerprint(None)
    assert record.result == expected
    (event,) = events(world, "tenant_cleaned")
    assert (event.actor, event.account_id, event.subject, event.code, event.at) == (
        world.account.token_id, world.account.account_id, world.account.account_id, None, T0 + 17)
    assert event.detail == {"confirmation_id": row["confirmation_id"], "idempotency_key": "clean-key-0001",
                            "num_runs_cleaned": 2, "run_ids": [r["run_id"] for r in expected_runs]}

    # The same key replays the first report exactly, whatever the reference and the clock.
    world.clock.now = T0 + 99
    assert clean(world, "cfr_" + "0" * 26, "clean-key-0001") == {**expected, "replayed": True}
    assert len(events(world, "tenant_cleaned")) == 1
    # A new cleanup finds nothing left: cleaned runs are not cleaned twice.
    again = clean(world, cleanup_ref(world), "clean-key-0002")
    assert again == {"account_id": world.account.account_id, "idempotency_key": "clean-key-0002",
                     "num_runs_cleaned": 0, "num_bytes_removed": 0, "runs": [], "runs_kept": [],
                     "bookings_changed": [], "cleaned_at": T0 + 99, "replayed": False}
    assert run_row(world, first.run_id)["cleaned_at"] == T0 + 17


def test_cleanup_reports_runs_in_run_id_order(world) -> None:
    made = []
    for _ in range(3):
        run = new_run(world)
        finish(world, run)
        made.append(run)
    # Rename the runs so that their insertion order is the reverse of their id order.
    with world.ledger.write() as conn:
        for index, run in enumerate(made):
            conn.execute(runs_table.update().where(runs_table.c.run_id == run.run_id)
                         .values(run_id=f"run_{'zyx'[index]}{'0' * 25}"))
    report = clean(world, cleanup_ref(world), "clean-key-0001")
    assert [r["run_id"] for r in report["runs"]] == [f"run_{c}{'0' * 25}" for c in "xyz"]


def test_cleanup_is_per_tenant_and_needs_a_cleanup_confirmation_of_the_caller(world) -> None:
    run = new_run(world)
    write_file(os.path.join(run.checkpoint_dir, "a.pt"), 3)
    finish(world, run)
    rival_ref = cleanup_ref(world, world.other)
    assert code_of(lambda: clean(world, rival_ref, "clean-key-0001")) is ErrorCode.CONFIRMATION_INVALID
    cancel_confirmation = cancel_ref(world, new_run(world, booking_id=world.booking()).run_id)
    assert code_of(lambda: clean(world, cancel_confirmation, "clean-key-0001")) is ErrorCode.CONFIRMATION_MISMATCH
    unapproved = confirm_request.request_cleanup(world.ledger, world.policy, world.account).ref
    assert code_of(lambda: clean(world, unapproved, "clean-key-0001")) is ErrorCode.CONFIRMATION_NOT_APPROVED
    assert os.path.exists(run.checkpoint_dir) and run_row(world, run.run_id)["cleaned_at"] is None
    assert key_record(world, "clean-key-0001") is None and events(world, "tenant_cleaned") == []
    # The rival's cleanup, with its own confirmation, removes nothing of ours.
    report = clean(world, rival_ref, "clean-key-0001", account=world.other)
    assert (report["account_id"], report["num_runs_cleaned"], report["runs"]) == (world.other.account_id, 0, [])
    assert os.path.exists(run.checkpoint_dir)
    # The same key string is the caller's own: ours is still unused.
    assert key_record(world, "clean-key-0001") is None
    assert clean(world, cleanup_ref(world), "clean-key-0001")["num_runs_cleaned"] == 1


def test_a_used_cleanup_confirmation_cannot_clean_again(world) -> None:
    ref = cleanup_ref(world)
    clean(world, ref, "clean-key-0001")
    assert code_of(lambda: clean(world, ref, "clean-key-0002")) is ErrorCode.CONFIRMATION_CONSUMED


@pytest.mark.parametrize("where", ["link-inside", "link-outside", "outside"])
def test_artifacts_outside_the_tenant_area_or_behind_a_link_stop_the_cleanup(world, tmp_path, where) -> None:
    run = new_run(world)
    finish(world, run)
    area = world.policy.tenant_area(world.account.account_id)
    target = str(area / "elsewhere") if where == "link-inside" else str(tmp_path / "foreign")
    write_file(os.path.join(target, "keep.pt"), 5)
    if where == "outside":
        folder = target
        with world.ledger.write() as conn:
            conn.execute(runs_table.update().where(runs_table.c.run_id == run.run_id).values(checkpoint_dir=folder))
    else:
        folder = run.checkpoint_dir
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        os.symlink(target, folder)
    ref = cleanup_ref(world)
    assert code_of(lambda: clean(world, ref, "clean-key-0001")) is ErrorCode.CHECKPOINT_STORAGE_INVALID
    # Nothing was removed, consumed, reserved or recorded.
    assert os.path.lexists(folder) and os.path.getsize(os.path.join(target, "keep.pt")) == 5
    assert untouched(world, ref) and key_record(world, "clean-key-0001") is None
    assert run_row(world, run.run_id)["cleaned_at"] is None and events(world, "tenant_cleaned") == []


def test_cleanup_key_is_bound_to_the_request(world) -> None:
    clean(world, cleanup_ref(world), "clean-key-0001")
    other_booking = world.booking()
    release = cleanup.Release(booking_id=other_booking, confirmation_ref=release_ref(world, other_booking))
    assert code_of(lambda: clean(world, cleanup_ref(world), "clean-key-0001", release=release)) \
        is ErrorCode.IDEMPOTENCY_KEY_REUSED
    run = new_run(world, booking_id=other_booking)
    do_cancel(world, run.run_id, cancel_ref(world, run.run_id), "cancel-key-0001")
    assert code_of(lambda: clean(world, cleanup_ref(world), "cancel-key-0001")) is ErrorCode.IDEMPOTENCY_KEY_REUSED
    assert code_of(lambda: clean(world, cleanup_ref(world), "bad key")) is ErrorCode.IDEMPOTENCY_KEY_INVALID
    # What the client computes to tell this cleanup's answer from another's (a key is the account's own).
    assert cleanup_fingerprint("bkg_1") == request_fingerprint("cleanup", release_booking_id="bkg_1")
    assert cleanup_fingerprint(None) == request_fingerprint("cleanup", release_booking_id=None) != cleanup_fingerprint("b")


def test_a_key_an_earlier_release_recorded_with_the_account_still_replays(world) -> None:
    from ito_assets.control.ledger import idempotency_keys

    first = clean(world, cleanup_ref(world), "clean-key-0001")
    account_id = world.account.account_id
    with world.ledger.write() as conn:  # the fingerprint an earlier release wrote: the account bound in it
        conn.execute(idempotency_keys.update().where(idempotency_keys.c.key == "clean-key-0001").values(
            fingerprint=request_fingerprint("cleanup", account_id=account_id, release_booking_id=None)))
    assert clean(world, "cfr_" + "0" * 26, "clean-key-0001") == {**first, "replayed": True}
    # The lookup by key shows it as the client computes it.
    assert cleanup.answered_fingerprint(key_record(world, "clean-key-0001"), account_id) == cleanup_fingerprint(None)
    other = world.booking()
    release = cleanup.Release(booking_id=other, confirmation_ref=release_ref(world, other))
    assert code_of(lambda: clean(world, cleanup_ref(world), "clean-key-0001", release=release)) \
        is ErrorCode.IDEMPOTENCY_KEY_REUSED


# ---------------------------------------------------------------- cleanup with a release


def test_release_with_cleanup_is_exact_and_consumes_both_confirmations(world) -> None:
    run = new_run(world)
    finish(world, run)
    busy_booking = world.booking()
    busy = new_run(world, booking_id=busy_booking)  # active on another booking: no obstacle
    world.clock.now = T0 + 30
    rel = release_ref(world, world.booking_id)
    ref = cleanup_ref(world)
    release = cleanup.Release(booking_id=world.booking_id, confirmation_ref=rel)
    assert rel not in repr(release) and repr(release) == f"Release(booking_id={world.booking_id!r})"
    report = clean(world, ref, "clean-key-0001", release=release)
    assert report["bookings_changed"] == [{"booking_id": world.booking_id, "state": "released"}]
    assert report["num_runs_cleaned"] == 1 and report["replayed"] is False
    booking = bookings.get(world.ledger, world.booking_id)
    assert (booking.state, booking.updated_at, booking.revision) == (BookingState.RELEASED, T0 + 30, 1)
    assert bookings.get(world.ledger, busy_booking).state is BookingState.COMPLETED
    assert run_row(world, busy.run_id)["state"] == "queued"
    for used in (rel, ref):
        row = confirmation_row(world, used)
        assert (row["consumed_at"], row["consumed_by_run"], row["consumed_by_key"]) == (T0 + 30, None, "clean-key-0001")
    (event,) = events(world, "booking_released")
    assert (event.actor, event.account_id, event.subject, event.code, event.at) == (
        world.account.token_id, world.account.account_id, world.booking_id, None, T0 + 30)
    assert event.detail == {"confirmation_id": confirmation_row(world, rel)["confirmation_id"],
                            "idempotency_key": "clean-key-0001"}
    record = key_record(world, "clean-key-0001")
    assert record.fingerprint == cleanup_fingerprint(world.booking_id)
    account_bound = request_fingerprint("cleanup", account_id=world.account.account_id, release_booking_id=world.booking_id)
    assert cleanup.answered_fingerprint(dataclasses.replace(record, fingerprint=account_bound),
                                        world.account.account_id) == record.fingerprint  # read back from the report
    assert cleanup.answered_fingerprint(dataclasses.replace(record, fingerprint="f" * 64), world.account.account_id) == "f" * 64
    assert record.result["bookings_changed"] == report["bookings_changed"]
    replay = clean(world, "cfr_" + "0" * 26, "clean-key-0001", release=release)
    assert replay == {**report, "replayed": True}
    assert code_of(lambda: clean(world, cleanup_ref(world), "clean-key-0001")) is ErrorCode.IDEMPOTENCY_KEY_REUSED


@pytest.mark.parametrize("state", [RunState.QUEUED, RunState.RUNNING, RunState.CANCELLING])
def test_release_of_a_booking_with_active_runs_is_refused_and_changes_nothing(world, state) -> None:
    run = new_run(world)
    if state is not RunState.QUEUED:
        runs.attach_dagster_run(world.ledger, run.run_id, "dagster-1")
        runs.set_state(world.ledger, run.run_id, RunState.RUNNING)
    if state is RunState.CANCELLING:
        runs.set_state(world.ledger, run.run_id, RunState.CANCELLING)
    rel, ref = release_ref(world, world.booking_id), cleanup_ref(world)
    release = cleanup.Release(booking_id=world.booking_id, confirmation_ref=rel)
    error = error_of(lambda: clean(world, ref, "clean-key-0001", release=release))
    assert (error.code, error.retryable) == (ErrorCode.CAPACITY_UNAVAILABLE, False)
    assert bookings.get(world.ledger, world.booking_id).state is BookingState.COMPLETED
    assert untouched(world, rel) and untouched(world, ref) and key_record(world, "clean-key-0001") is None
    assert events(world, "booking_released") == [] and events(world, "tenant_cleaned") == []


def test_release_needs_the_callers_own_release_confirmation_for_that_booking(world) -> None:
    ref = cleanup_ref(world)
    # Another account's booking is not found, like an unknown one.
    rival_booking = world.booking(account=world.other)
    rival_rel = release_ref(world, rival_booking, world.other)
    assert code_of(lambda: clean(world, ref, "clean-key-0001", release=cleanup.Release(
        booking_id=rival_booking, confirmation_ref=rival_rel))) is ErrorCode.BOOKING_NOT_FOUND
    # Another account's release reference is invalid for us, even for our own booking.
    assert code_of(lambda: clean(world, ref, "clean-key-0001", release=cleanup.Release(
        booking_id=world.booking_id, confirmation_ref=rival_rel))) is ErrorCode.CONFIRMATION_INVALID
    # A cleanup confirmation is not a release confirmation.
    assert code_of(lambda: clean(world, ref, "clean-key-0001", release=cleanup.Release(
        booking_id=world.booking_id, confirmation_ref=cleanup_ref(world)))) is ErrorCode.CONFIRMATION_MISMATCH
    assert bookings.get(world.ledger, rival_booking).state is BookingState.COMPLETED
    assert bookings.get(world.ledger, world.booking_id).state is BookingState.COMPLETED
    assert untouched(world, ref) and untouched(world, rival_rel)


@pytest.mark.parametrize(("change", "code"), [({"network": "eth-100g"}, ErrorCode.NETWORK_MISMATCH),
                                              ({"topology": "2x4-pcie"}, ErrorCode.BOOKING_MISMATCH)])
def test_release_of_an_amended_booking_is_refused(world, change, code) -> None:
    rel, ref = release_ref(world, world.booking_id), cleanup_ref(world)
    bookings.amend(world.ledger, world.booking_id, change, actor=None)
    release = cleanup.Release(booking_id=world.booking_id, confirmation_ref=rel)
    assert code_of(lambda: clean(world, ref, "clean-key-0001", release=release)) is code
    assert bookings.get(world.ledger, world.booking_id).state is BookingState.COMPLETED
    assert untouched(world, rel) and untouched(world, ref)


def test_a_release_confirmation_that_expired_is_refused(world) -> None:
    rel = release_ref(world, world.booking_id)
    world.clock.now = T0 + world.policy.confirmation_ttl_s
    ref = cleanup_ref(world)
    release = cleanup.Release(booking_id=world.booking_id, confirmation_ref=rel)
    assert code_of(lambda: clean(world, ref, "clean-key-0001", release=release)) is ErrorCode.CONFIRMATION_EXPIRED
    assert bookings.get(world.ledger, world.booking_id).state is BookingState.COMPLETED


# ---------------------------------------------------------------- cleanup: losing a race


def _replay_missing_once(monkeypatch, module) -> None:
    """The first look-up of the key misses, as if a twin committed just after it."""
    real, calls = module._replay, []

    def first_misses(*args):
        calls.append(args)
        return None if len(calls) == 1 else real(*args)
    monkeypatch.setattr(module, "_replay", first_misses)


def _lock_timeout() -> sa.exc.OperationalError:
    return sa.exc.OperationalError("BEGIN IMMEDIATE", {}, Exception("database is locked"))


def _key_missing_twice(monkeypatch) -> None:
    """The look-ups before the lock and under it both miss, as if a twin with another
    confirmation committed just after them."""
    real, calls = cleanup._replay_in, []

    def first_two_miss(*args):
        calls.append(args)
        return None if len(calls) <= 2 else real(*args)
    monkeypatch.setattr(cleanup, "_replay_in", first_two_miss)


def test_cleanup_that_loses_the_key_race_replays_the_winner(world, monkeypatch) -> None:
    first = clean(world, cleanup_ref(world), "clean-key-0001")
    _key_missing_twice(monkeypatch)
    ref = cleanup_ref(world)
    again = clean(world, ref, "clean-key-0001")  # the key insert collides: IntegrityError
    assert again == {**first, "replayed": True}
    assert untouched(world, ref)  # the losing transaction rolled back


def test_cleanup_that_times_out_on_the_lock_replays_or_answers_in_flight(world, monkeypatch) -> None:
    def locked(*_args, **_kwargs):
        raise _lock_timeout()
    monkeypatch.setattr(cleanup, "_clean_locked", locked)
    error = error_of(lambda: clean(world, cleanup_ref(world), "clean-key-0001"))
    assert (error.code, error.__cause__, error.__suppress_context__) == (ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT, None, True)
    monkeypatch.undo()
    first = clean(world, cleanup_ref(world), "clean-key-0001")
    _replay_missing_once(monkeypatch, cleanup)
    monkeypatch.setattr(cleanup, "_clean_locked", locked)
    assert clean(world, cleanup_ref(world), "clean-key-0001") == {**first, "replayed": True}


def test_cleanup_that_finds_the_key_under_the_lock_replays_it(world, monkeypatch) -> None:
    ref = cleanup_ref(world)
    first = clean(world, ref, "clean-key-0001")
    # The read before the lock misses (a twin committed just after it); under the lock the key
    # is found and replayed before the twin's (now consumed) confirmation is judged.
    _replay_missing_once(monkeypatch, cleanup)
    assert clean(world, ref, "clean-key-0001") == {**first, "replayed": True}
    assert len(events(world, "tenant_cleaned")) == 1 and events(world, "tenant_cleanup_refused") == []


def test_cleanup_under_the_lock_still_refuses_the_key_for_another_request(world, monkeypatch) -> None:
    ref = cleanup_ref(world)
    clean(world, ref, "clean-key-0001")
    _replay_missing_once(monkeypatch, cleanup)
    release = cleanup.Release(booking_id=world.booking_id, confirmation_ref=release_ref(world, world.booking_id))
    assert code_of(lambda: clean(world, ref, "clean-key-0001", release=release)) is ErrorCode.IDEMPOTENCY_KEY_REUSED
    assert bookings.get(world.ledger, world.booking_id).state is BookingState.COMPLETED


def test_cleanup_twins_with_one_key_and_one_confirmation_both_get_the_report(world, monkeypatch) -> None:
    """Two identical cleanups at once: the second reads the key before the first commits, then
    waits for the lock the first holds (SQLite's write lock, PostgreSQL's confirmation row)."""
    ref = cleanup_ref(world)
    committing, go, twin_read = threading.Event(), threading.Event(), threading.Event()
    real_record, real_replay = audit.record, cleanup._replay

    def held_before_commit(conn, at, kind, **fields):
        real_record(conn, at, kind, **fields)
        if kind == "tenant_cleaned" and not committing.is_set():
            committing.set()
            go.wait(10)

    def read_then_signal(*args):
        answer = real_replay(*args)
        if committing.is_set():
            twin_read.set()
        return answer
    monkeypatch.setattr(audit, "record", held_before_commit)
    monkeypatch.setattr(cleanup, "_replay", read_then_signal)
    answers: dict = {}

    def one(name: str) -> None:
        try:
            answers[name] = clean(world, ref, "clean-key-0001")
        except ItoError as error:
            answers[name] = error.code
    first = threading.Thread(target=one, args=("first",))
    first.start()
    assert committing.wait(10)
    twin = threading.Thread(target=one, args=("twin",))
    twin.start()
    assert twin_read.wait(10)
    time.sleep(0.3)  # the twin is now waiting for the lock the first holds
    go.set()
    first.join(10)
    twin.join(10)
    assert answers["first"]["replayed"] is False
    assert answers["twin"] == {**answers["first"], "replayed": True}
    assert len(events(world, "tenant_cleaned")) == 1


def test_cleanup_reraises_other_database_errors(world, monkeypatch) -> None:
    def broken(*_args, **_kwargs):
        raise sa.exc.OperationalError("SELECT", {}, Exception("disk I/O error"))
    monkeypatch.setattr(cleanup, "_clean_locked", broken)
    with pytest.raises(sa.exc.OperationalError, match="disk I/O error"):
        clean(world, cleanup_ref(world), "clean-key-0001")


def test_cleanup_race_without_a_committed_winner_is_in_flight(world, monkeypatch) -> None:
    def collides(*_args, **_kwargs):
        raise sa.exc.IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))
    monkeypatch.setattr(cleanup, "_clean_locked", collides)
    assert code_of(lambda: clean(world, cleanup_ref(world), "clean-key-0001")) is ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT


# ---------------------------------------------------------------- cancellation


def test_cancel_of_an_unlaunched_run_leaves_exact_rows_and_events(world) -> None:
    run = new_run(world)
    world.clock.now = T0 + 40
    ref = cancel_ref(world, run.run_id)
    done = do_cancel(world, run.run_id, ref, "cancel-key-0001")
    assert done.replayed is False
    assert (done.run.state, done.run.state_reason, done.run.finished_at, done.run.updated_at) == (
        RunState.CANCELLED, "cancelled by the account", T0 + 40, T0 + 40)
    row = run_row(world, run.run_id)
    assert (row["state"], row["state_reason"], row["finished_at"]) == ("cancelled", "cancelled by the account", T0 + 40)
    confirmation = confirmation_row(world, ref)
    assert (confirmation["consumed_at"], confirmation["consumed_by_run"], confirmation["consumed_by_key"]) == (
        T0 + 40, run.run_id, "cancel-key-0001")
    record = key_record(world, "cancel-key-0001")
    assert (record.action, record.run_id, record.result, record.created_at) == ("cancel", run.run_id, None, T0 + 40)
    assert record.fingerprint == request_fingerprint("cancel", run_id=run.run_id)
    (requested,) = events(world, "run_cancel_requested")
    assert (requested.actor, requested.account_id, requested.subject, requested.at) == (
        world.account.token_id, world.account.account_id, run.run_id, T0 + 40)
    assert requested.detail == {"confirmation_id": confirmation["confirmation_id"],
                                "idempotency_key": "cancel-key-0001"}
    (cancelled,) = events(world, "run_cancelled")
    assert (cancelled.actor, cancelled.subject) == (world.account.token_id, run.run_id)
    assert cancelled.detail == {"previous_state": "queued", "reason": "cancelled by the account"}
    assert requested.seq < cancelled.seq
    # The replay answers the run as it is now, and leaves nothing new behind.
    again = do_cancel(world, run.run_id, "cfr_" + "0" * 26, "cancel-key-0001")
    assert again.replayed is True and again.run == runs.get(world.ledger, run.run_id)
    assert len(events(world, "run_cancel_requested")) == 1


@pytest.mark.parametrize("launched", ["queued-attached", "running-unattached", "running-attached"])
def test_cancel_of_a_launched_or_running_run_waits_for_dagster(world, launched) -> None:
    run = new_run(world)
    if launched.endswith("-attached"):
        runs.attach_dagster_run(world.ledger, run.run_id, "dagster-7")
    if launched.startswith("running"):
        runs.set_state(world.ledger, run.run_id, RunState.RUNNING)
    previous = run_row(world, run.run_id)["state"]
    done = do_cancel(world, run.run_id, cancel_ref(world, run.run_id), "cancel-key-0001")
    assert (done.run.state, done.run.state_reason, done.run.finished_at) == (
        RunState.CANCELLING, "cancelled by the account", None)
    assert run_row(world, run.run_id)["state"] == "cancelling"
    (event,) = events(world, "run_cancelling")
    assert event.detail == {"previous_state": previous, "reason": "cancelled by the account"}
    assert events(world, "run_cancelled") == []


def test_cancel_of_a_run_already_cancelling_is_recorded_without_a_transition(world) -> None:
    run = new_run(world)
    runs.attach_dagster_run(world.ledger, run.run_id, "dagster-7")
    do_cancel(world, run.run_id, cancel_ref(world, run.run_id), "cancel-key-0001")
    world.clock.now = T0 + 50
    ref = cancel_ref(world, run.run_id)
    done = do_cancel(world, run.run_id, ref, "cancel-key-0002")
    assert done.replayed is False and done.run == runs.get(world.ledger, run.run_id)
    assert done.run.state is RunState.CANCELLING and done.run.updated_at == T0
    assert confirmation_row(world, ref)["consumed_by_key"] == "cancel-key-0002"
    assert key_record(world, "cancel-key-0002").run_id == run.run_id
    assert len(events(world, "run_cancel_requested")) == 2 and len(events(world, "run_cancelling")) == 1


@pytest.mark.parametrize("state", [RunState.FAILED, RunState.SUCCEEDED, RunState.GATE_FAILED, RunState.CANCELLED])
def test_cancel_of_a_finished_run_is_refused_and_consumes_nothing(world, state) -> None:
    run = new_run(world)
    ref = cancel_ref(world, run.run_id)
    if state is RunState.SUCCEEDED:
        runs.set_state(world.ledger, run.run_id, RunState.RUNNING)
    runs.set_state(world.ledger, run.run_id, state)
    assert code_of(lambda: do_cancel(world, run.run_id, ref, "cancel-key-0001")) is ErrorCode.RUN_FINISHED
    assert untouched(world, ref) and key_record(world, "cancel-key-0001") is None
    assert run_row(world, run.run_id)["state"] == state.value and events(world, "run_cancel_requested") == []


def test_cancel_is_scoped_to_the_account_and_bound_to_the_run(world) -> None:
    run = new_run(world)
    assert code_of(lambda: do_cancel(world, "run_" + "0" * 26, cancel_ref(world, run.run_id), "cancel-key-0001")) \
        is ErrorCode.RUN_NOT_FOUND
    # A confirmation for another run of ours does not cancel this one.
    other = new_run(world, booking_id=world.booking())
    ref_for_other = cancel_ref(world, other.run_id)
    assert code_of(lambda: do_cancel(world, run.run_id, ref_for_other, "cancel-key-0001")) \
        is ErrorCode.CONFIRMATION_MISMATCH
    # The rival cannot cancel our run, not even with our reference and our key.
    ref = cancel_ref(world, run.run_id)
    do_cancel(world, run.run_id, ref, "cancel-key-0001")
    assert code_of(lambda: do_cancel(world, run.run_id, ref, "cancel-key-0001", world.other)) \
        is ErrorCode.RUN_NOT_FOUND
    # Our reference is invalid for the rival's own run.
    rival = new_run(world, account=world.other, booking_id=world.booking(account=world.other))
    ref2 = cancel_ref(world, other.run_id)
    assert code_of(lambda: do_cancel(world, rival.run_id, ref2, "cancel-key-0009", world.other)) \
        is ErrorCode.CONFIRMATION_INVALID
    assert run_row(world, rival.run_id)["state"] == "queued" and untouched(world, ref2)
    assert untouched(world, ref_for_other)


def test_cancel_key_is_bound_to_the_run(world) -> None:
    run = new_run(world)
    do_cancel(world, run.run_id, cancel_ref(world, run.run_id), "cancel-key-0001")
    other = new_run(world, booking_id=world.booking())
    ref = cancel_ref(world, other.run_id)
    assert code_of(lambda: do_cancel(world, other.run_id, ref, "cancel-key-0001")) is ErrorCode.IDEMPOTENCY_KEY_REUSED
    assert untouched(world, ref) and run_row(world, other.run_id)["state"] == "queued"
    clean(world, cleanup_ref(world), "clean-key-0001")
    assert code_of(lambda: do_cancel(world, other.run_id, ref, "clean-key-0001")) is ErrorCode.IDEMPOTENCY_KEY_REUSED
    assert code_of(lambda: do_cancel(world, other.run_id, ref, "short")) is ErrorCode.IDEMPOTENCY_KEY_INVALID


def test_cancel_that_finds_the_key_under_the_lock_replays_it(world, monkeypatch) -> None:
    run = new_run(world)
    ref = cancel_ref(world, run.run_id)
    first = do_cancel(world, run.run_id, ref, "cancel-key-0001")
    assert first.run.state is RunState.CANCELLED
    # The read before the lock misses (a twin committed just after it); under the lock the key
    # is found and replayed before the (now consumed) confirmation or the run's end is looked at.
    _replay_missing_once(monkeypatch, cancel)
    again = do_cancel(world, run.run_id, ref, "cancel-key-0001")
    assert again.replayed is True and again.run == first.run
    assert len(events(world, "run_cancel_requested")) == 1


def test_a_cancel_replay_never_needs_the_write_path(world, monkeypatch) -> None:
    run = new_run(world)
    first = do_cancel(world, run.run_id, cancel_ref(world, run.run_id), "cancel-key-0001")

    def broken(*_args, **_kwargs):
        raise sa.exc.OperationalError("BEGIN IMMEDIATE", {}, Exception("disk I/O error"))
    monkeypatch.setattr(cancel, "_cancel_locked", broken)
    again = do_cancel(world, run.run_id, "cfr_" + "0" * 26, "cancel-key-0001")
    assert again.replayed is True and again.run == first.run


def test_a_cleanup_replay_never_needs_the_write_path(world, monkeypatch) -> None:
    first = clean(world, cleanup_ref(world), "clean-key-0001")

    def broken(*_args, **_kwargs):
        raise sa.exc.OperationalError("BEGIN IMMEDIATE", {}, Exception("disk I/O error"))
    monkeypatch.setattr(cleanup, "_clean_locked", broken)
    assert clean(world, "cfr_" + "0" * 26, "clean-key-0001") == {**first, "replayed": True}


def _price_confirmation(world, ref: str, cost_cents: int) -> None:
    """Defence in depth: a lifecycle confirmation that somehow carries a cost authorizes nothing."""
    with world.ledger.write() as conn:
        conn.execute(confirmations_table.update().where(confirmations_table.c.ref_hash == ids.secret_hash(ref))
                     .values(cost_cents=cost_cents))


def test_lifecycle_confirmations_that_carry_a_cost_are_refused(world) -> None:
    run = new_run(world)
    finish(world, run)
    ref = cleanup_ref(world)
    _price_confirmation(world, ref, 5)
    assert code_of(lambda: clean(world, ref, "clean-key-0001")) is ErrorCode.CONFIRMATION_MISMATCH
    rel = release_ref(world, world.booking_id)
    _price_confirmation(world, rel, 5)
    release = cleanup.Release(booking_id=world.booking_id, confirmation_ref=rel)
    assert code_of(lambda: clean(world, cleanup_ref(world), "clean-key-0001", release=release)) \
        is ErrorCode.CONFIRMATION_MISMATCH
    assert bookings.get(world.ledger, world.booking_id).state is BookingState.COMPLETED
    live = new_run(world, booking_id=world.booking())
    cref = cancel_ref(world, live.run_id)
    _price_confirmation(world, cref, 5)
    assert code_of(lambda: do_cancel(world, live.run_id, cref, "cancel-key-0001")) is ErrorCode.CONFIRMATION_MISMATCH
    assert run_row(world, live.run_id)["state"] == "queued" and run_row(world, run.run_id)["cleaned_at"] is None
    assert untouched(world, ref) and untouched(world, rel) and untouched(world, cref)


def test_cancel_that_loses_the_race_replays_or_answers_in_flight(world, monkeypatch) -> None:
    run = new_run(world)
    ref = cancel_ref(world, run.run_id)

    def locked(*_args, **_kwargs):
        raise _lock_timeout()
    monkeypatch.setattr(cancel, "_cancel_locked", locked)
    error = error_of(lambda: do_cancel(world, run.run_id, ref, "cancel-key-0001"))
    assert (error.code, error.__cause__, error.__suppress_context__) == (ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT, None, True)
    monkeypatch.undo()
    first = do_cancel(world, run.run_id, ref, "cancel-key-0001")

    def collides(*_args, **_kwargs):
        raise sa.exc.IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))
    _replay_missing_once(monkeypatch, cancel)
    monkeypatch.setattr(cancel, "_cancel_locked", collides)
    again = do_cancel(world, run.run_id, ref, "cancel-key-0001")
    assert again.replayed is True and again.run == first.run

    def broken(*_args, **_kwargs):
        raise sa.exc.OperationalError("SELECT", {}, Exception("disk I/O error"))
    monkeypatch.setattr(cancel, "_cancel_locked", broken)
    with pytest.raises(sa.exc.OperationalError, match="disk I/O error"):
        do_cancel(world, run.run_id, ref, "cancel-key-0002")


def test_cancel_and_cleanup_keys_and_confirmations_are_separate(world) -> None:
    run = new_run(world)
    ref = cancel_ref(world, run.run_id)
    assert code_of(lambda: clean(world, ref, "clean-key-0001")) is ErrorCode.CONFIRMATION_MISMATCH
    cref = cleanup_ref(world)
    assert code_of(lambda: do_cancel(world, run.run_id, cref, "cancel-key-0001")) is ErrorCode.CONFIRMATION_MISMATCH
    assert untouched(world, ref) and untouched(world, cref)


def test_cleanup_marks_removed_only_the_checkpoints_of_the_runs_it_cleaned(world) -> None:
    finished = new_run(world)
    telemetry.record_checkpoint(world.ledger, finished.run_id, step=10, path="step-10.pt", size_bytes=1)
    finish(world, finished)
    active = new_run(world, booking_id=world.booking())  # still queued: not cleaned
    telemetry.record_checkpoint(world.ledger, active.run_id, step=10, path="step-10.pt", size_bytes=1)
    clean(world, cleanup_ref(world), "clean-key-0003")
    with world.ledger.read() as conn:
        removed = dict(conn.execute(sa.select(run_checkpoints.c.run_id, run_checkpoints.c.removed_at)).all())
    assert removed[finished.run_id] is not None and removed[active.run_id] is None
