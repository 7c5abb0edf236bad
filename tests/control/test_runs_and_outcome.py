"""Runs in the ledger, how a finished Dagster run is written back, and the re-verification of a
run before training: exact rows, orderings, scoping and audit events.

The promises: every read is scoped to the calling account; the budget counts what runs of a manifest
spent (gate_failed runs excluded); a failed eval gate is never reported as a cancellation; the
Dagster shell re-verifies the ledger run (tags, attached Dagster run, manifest digest)."""

from __future__ import annotations

import hashlib

import pytest
import sqlalchemy as sa

from gate_world import COST, T0, manifest_bytes, new_run, verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, authorization, bookings, budget, entitlement, runs
from ito_assets.control.ledger import confirmations as confirmations_table
from ito_assets.control.ledger import manifests as manifests_table
from ito_assets.control.ledger import runs as runs_table
from ito_assets.control.outcome import record_outcome
from ito_assets.control.states import TERMINAL_RUN_STATES, RunState

OTHER_MANIFEST = manifest_bytes(budget__cap_cents=200000)


def code_of(call) -> ErrorCode:
    with pytest.raises(ItoError) as info:
        call()
    return info.value.code



def update_run(world, which: str, /, **values) -> None:
    with world.ledger.write() as conn:
        conn.execute(runs_table.update().where(runs_table.c.run_id == which).values(**values))


def rename(world, run: runs.Run, new_id: str) -> runs.Run:
    """Give a run a chosen id, so that ties in an ordering are broken against insertion order."""
    update_run(world, run.run_id, run_id=new_id)
    return runs.get(world.ledger, new_id)


def events(world, kind: str | None = None, subject: str | None = None) -> list[audit.AuditEvent]:
    return [e for e in audit.events(world.ledger, subject=subject, limit=10_000) if kind is None or e.kind == kind]


def run_events(world, run_id: str) -> list[tuple]:
    return [(e.kind, e.actor, e.detail) for e in events(world, subject=run_id) if e.kind.startswith("run_")
            and e.kind != "run_created"]


def drive(world, run: runs.Run, state: RunState) -> None:
    """Bring a fresh (queued, unattached) run to `state` along allowed transitions."""
    if state is RunState.QUEUED:
        return
    runs.attach_dagster_run(world.ledger, run.run_id, f"dagster-{run.run_id[-6:]}")
    path = {RunState.RUNNING: [RunState.RUNNING], RunState.CANCELLING: [RunState.RUNNING, RunState.CANCELLING],
            RunState.SUCCEEDED: [RunState.RUNNING, RunState.SUCCEEDED]}.get(state, [state])
    for step in path:
        runs.set_state(world.ledger, run.run_id, step)


# ---------------------------------------------------------------- reads


def test_public_view_is_exact_and_keeps_the_server_path_out(world) -> None:
    world.clock.now = T0 + 3
    run = new_run(world, key="train-key-0001")
    view = run.to_dict()
    assert view == {
        "run_id": run.run_id, "booking_id": world.booking_id, "manifest_sha256": verified().digest,
        "idempotency_key": "train-key-0001", "state": "queued", "state_reason": None, "dagster_run_id": None,
        "cost_cents": COST, "created_at": T0 + 3, "updated_at": T0 + 3, "finished_at": None, "cleaned_at": None,
        "started_at": None, "terminal": False,
    }
    assert run.checkpoint_dir not in str(view)
    world.clock.now = T0 + 9
    runs.set_state(world.ledger, run.run_id, RunState.FAILED, reason="boom")
    view = runs.get(world.ledger, run.run_id).to_dict()
    assert (view["state"], view["state_reason"], view["finished_at"], view["updated_at"], view["terminal"]) == (
        "failed", "boom", T0 + 9, T0 + 9, True)


def test_from_row_ignores_columns_it_does_not_know(world) -> None:
    run = new_run(world)
    with world.ledger.read() as conn:
        row = dict(conn.execute(sa.select(runs_table).where(runs_table.c.run_id == run.run_id)).mappings().one())
    assert runs.from_row({**row, "extra": 1}) == run
    assert runs.from_row(row).state is RunState.QUEUED


def test_reads_are_scoped_to_the_account(world) -> None:
    ours = new_run(world, key="train-key-0001")
    theirs = new_run(world, account=world.other, booking_id=world.booking(account=world.other), key="train-key-0001")
    assert runs.get(world.ledger, ours.run_id, account_id=world.account.account_id) == ours
    assert runs.get(world.ledger, ours.run_id) == ours  # the Dagster shell's unscoped view
    assert code_of(lambda: runs.get(world.ledger, ours.run_id, account_id=world.other.account_id)) \
        is ErrorCode.RUN_NOT_FOUND
    assert code_of(lambda: runs.get(world.ledger, "run_" + "0" * 26)) is ErrorCode.RUN_NOT_FOUND
    assert code_of(lambda: runs.get(world.ledger, "run_" + "0" * 26, account_id=world.account.account_id)) \
        is ErrorCode.RUN_NOT_FOUND
    assert runs.by_key(world.ledger, world.account.account_id, "train-key-0001") == ours
    assert runs.by_key(world.ledger, world.other.account_id, "train-key-0001") == theirs
    assert code_of(lambda: runs.by_key(world.ledger, world.account.account_id, "train-key-0002")) \
        is ErrorCode.RUN_NOT_FOUND
    with world.ledger.read() as conn:
        assert runs.load(conn, "run_" + "0" * 26) is None
        assert runs.load(conn, ours.run_id, for_update=True) == ours


def test_count_active_counts_the_bookings_active_runs_only(world) -> None:
    counts = {}
    for state in RunState:
        booking_id = world.booking()
        run = new_run(world, booking_id=booking_id)
        drive(world, run, state)
        with world.ledger.read() as conn:
            counts[state] = runs.count_active(conn, booking_id)
    assert counts == {s: int(s in (RunState.QUEUED, RunState.RUNNING, RunState.CANCELLING)) for s in RunState}
    with world.ledger.read() as conn:
        assert runs.count_active(conn, world.booking_id) == 0


def test_committed_sums_the_manifests_runs_except_ended_unstarted_split_by_ended_and_active(world) -> None:
    """Every run that trained counts, ended (spent) or active (reserved); the gate_failed one and
    the cancelled one that never started training give their cost back."""
    digest = verified().digest
    with world.ledger.read() as conn:
        assert budget.committed(conn, world.account.account_id, digest) == (0, 0, 0)
    made = {}
    for state, cost, started in [(RunState.FAILED, 1, True), (RunState.GATE_FAILED, 10, False),
                                 (RunState.SUCCEEDED, 100, True), (RunState.CANCELLED, 1000, True),
                                 (RunState.CANCELLED, 20_000, False), (RunState.QUEUED, 10_000, False)]:
        run = new_run(world, booking_id=world.booking())
        drive(world, run, state)
        update_run(world, run.run_id, cost_cents=cost, started_at=T0 if started else None)
        made[state] = run
    other_manifest = new_run(world, booking_id=world.booking(), content=OTHER_MANIFEST)
    update_run(world, other_manifest.run_id, cost_cents=100_000)
    rival = new_run(world, account=world.other, booking_id=world.booking(account=world.other))
    update_run(world, rival.run_id, cost_cents=1_000_000)
    with world.ledger.read() as conn:
        assert budget.committed(conn, world.account.account_id, digest) == (1_101, 10_000, 4)
        assert budget.committed(conn, world.account.account_id, verified(OTHER_MANIFEST).digest) == (0, 100_000, 1)
        assert budget.committed(conn, world.other.account_id, digest) == (0, 1_000_000, 1)
        assert budget.committed(conn, world.other.account_id, verified(OTHER_MANIFEST).digest) == (0, 0, 0)


def test_pending_runs_are_the_unlaunched_queued_ones_oldest_first(world) -> None:
    made = []
    for offset in (5, 1, 1, 3):
        world.clock.now = T0 + offset
        made.append(new_run(world, booking_id=world.booking()))
    made[1], made[2] = rename(world, made[1], "run_" + "z" * 26), rename(world, made[2], "run_" + "a" * 26)
    for state in (RunState.RUNNING, RunState.CANCELLED, RunState.GATE_FAILED, RunState.FAILED):
        runs.set_state(world.ledger, new_run(world, booking_id=world.booking()).run_id, state)  # never attached
    attached = new_run(world, booking_id=world.booking())
    runs.attach_dagster_run(world.ledger, attached.run_id, "dagster-attached")
    ties = sorted([made[1].run_id, made[2].run_id])
    expected = [*ties, made[3].run_id, made[0].run_id]
    assert [r.run_id for r in runs.pending_runs(world.ledger)] == expected
    assert [r.run_id for r in runs.pending_runs(world.ledger, limit=2)] == ties
    assert all(r.state is RunState.QUEUED for r in runs.pending_runs(world.ledger))


def test_cancelling_and_launched_active_runs_are_ordered_by_last_change(world) -> None:
    cancelling, launched = [], []
    for offset in (9, 2, 2, 6):
        world.clock.now = T0 + offset
        run = new_run(world, booking_id=world.booking())
        drive(world, run, RunState.CANCELLING)
        cancelling.append(run.run_id)
    cancelling[1] = rename(world, runs.get(world.ledger, cancelling[1]), "run_" + "z" * 26).run_id
    cancelling[2] = rename(world, runs.get(world.ledger, cancelling[2]), "run_" + "a" * 26).run_id
    for offset in (8, 4):
        world.clock.now = T0 + offset
        run = new_run(world, booking_id=world.booking())
        drive(world, run, RunState.RUNNING)
        launched.append(run.run_id)
    world.clock.now = T0 + 7
    queued_attached = new_run(world, booking_id=world.booking())
    runs.attach_dagster_run(world.ledger, queued_attached.run_id, "dagster-q")
    new_run(world, booking_id=world.booking())  # queued, unattached: not launched
    for state in (RunState.SUCCEEDED, RunState.FAILED, RunState.GATE_FAILED):
        drive(world, new_run(world, booking_id=world.booking()), state)
    by_change = [*sorted(cancelling[1:3]), cancelling[3], cancelling[0]]
    assert [r.run_id for r in runs.cancelling_runs(world.ledger)] == by_change
    assert [r.run_id for r in runs.cancelling_runs(world.ledger, limit=3)] == by_change[:3]
    active = [*by_change[:2], launched[1], by_change[2], queued_attached.run_id, launched[0], by_change[3]]
    assert [r.run_id for r in runs.launched_active_runs(world.ledger)] == active
    assert [r.run_id for r in runs.launched_active_runs(world.ledger, limit=4)] == active[:4]


def test_the_sensor_lists_are_bounded_by_default(world) -> None:
    template = run_row_of(world, new_run(world))
    with world.ledger.write() as conn:
        conn.execute(runs_table.insert(), [
            {**template, "run_id": f"run_bulk{i:04d}", "idempotency_key": f"bulk-key-{i:04d}"} for i in range(101)])
    assert len(runs.pending_runs(world.ledger)) == 100
    with world.ledger.write() as conn:
        conn.execute(runs_table.update().values(state="cancelling", dagster_run_id="dagster-bulk"))
    assert len(runs.cancelling_runs(world.ledger)) == 100
    assert len(runs.launched_active_runs(world.ledger)) == 100


@pytest.mark.parametrize("lister,state,attached", [(runs.pending_runs, "queued", None),
                                                    (runs.cancelling_runs, "cancelling", "dagster-bulk"),
                                                    (runs.launched_active_runs, "running", "dagster-bulk")])
def test_a_sweep_reaches_every_run_a_page_at_a_time_each_once(world, lister, state, attached) -> None:
    # 7 runs, 3 of them sharing one time, read 2 at a time (a tie splits across pages), and a run
    # changed while the sweep runs (its later time brings it round again): each seen once.
    template = run_row_of(world, new_run(world))
    with world.ledger.write() as conn:
        conn.execute(runs_table.delete())
        conn.execute(runs_table.insert(), [
            {**template, "run_id": f"run_page{i:04d}", "idempotency_key": f"page-key-{i:04d}", "state": state,
             "dagster_run_id": attached, "created_at": T0 + min(i, 3), "updated_at": T0 + min(i, 3)} for i in range(7)])
    seen = []
    for run in runs.each(lister, world.ledger, page=2):
        seen.append(run.run_id)
        if run.run_id == "run_page0001":
            update_run(world, run.run_id, created_at=T0 + 9, updated_at=T0 + 9)
    assert seen == [f"run_page{i:04d}" for i in range(7)]
    moved_last = [seen[0], *seen[2:], seen[1]]
    assert [r.run_id for r in runs.each(lister, world.ledger, page=100)] == moved_last


@pytest.mark.parametrize("state", [RunState.CANCELLED, RunState.GATE_FAILED, RunState.FAILED])
def test_a_run_that_ended_before_any_launch_is_not_attached(world, state) -> None:
    # Cancelled while queued (or ended by a sweep): the Dagster run that starts later is refused
    # by its authorization step, and the audit trail never says the run was launched.
    run = new_run(world, booking_id=world.booking())
    runs.set_state(world.ledger, run.run_id, state)
    with pytest.raises(ItoError) as refused:
        runs.attach_dagster_run(world.ledger, run.run_id, "dagster-late")
    assert refused.value.code is ErrorCode.RUN_FINISHED
    ended = runs.get(world.ledger, run.run_id)
    assert (ended.state, ended.dagster_run_id) == (state, None)
    assert events(world, "run_launched", subject=run.run_id) == []
    queued = new_run(world, booking_id=world.booking())  # the bound's other side: queued is attached
    assert runs.attach_dagster_run(world.ledger, queued.run_id, "dagster-q").dagster_run_id == "dagster-q"


def run_row_of(world, run: runs.Run) -> dict:
    with world.ledger.read() as conn:
        return dict(conn.execute(sa.select(runs_table).where(runs_table.c.run_id == run.run_id)).mappings().one())


def test_manifest_bytes_are_the_exact_stored_bytes(world) -> None:
    run = new_run(world)
    assert runs.manifest_bytes(world.ledger, run.manifest_digest) == manifest_bytes()
    assert isinstance(runs.manifest_bytes(world.ledger, run.manifest_digest), bytes)
    assert code_of(lambda: runs.manifest_bytes(world.ledger, "sha256:" + "0" * 64)) is ErrorCode.RUN_NOT_FOUND


# ---------------------------------------------------------------- attach, transition, set_state


def test_attach_is_idempotent_for_the_same_dagster_run_and_refuses_another(world) -> None:
    run = new_run(world)
    bystander = new_run(world, booking_id=world.booking())
    assert code_of(lambda: runs.attach_dagster_run(world.ledger, "run_" + "0" * 26, "dagster-1")) \
        is ErrorCode.RUN_NOT_FOUND
    world.clock.now = T0 + 4
    attached = runs.attach_dagster_run(world.ledger, run.run_id, "dagster-1")
    assert (attached.dagster_run_id, attached.updated_at, attached.state) == ("dagster-1", T0 + 4, RunState.QUEUED)
    (event,) = events(world, "run_launched")
    assert (event.actor, event.account_id, event.subject, event.at, event.detail) == (
        "dagster", world.account.account_id, run.run_id, T0 + 4, {"dagster_run_id": "dagster-1"})
    world.clock.now = T0 + 8
    assert runs.attach_dagster_run(world.ledger, run.run_id, "dagster-1") == attached
    assert len(events(world, "run_launched")) == 1
    assert code_of(lambda: runs.attach_dagster_run(world.ledger, run.run_id, "dagster-2")) is ErrorCode.INTERNAL_ERROR
    assert runs.get(world.ledger, run.run_id) == attached
    assert runs.get(world.ledger, bystander.run_id) == bystander  # only the named run is attached


def test_transition_stamps_terminal_states_and_records_who_did_it(world) -> None:
    run = new_run(world)
    bystander = new_run(world, booking_id=world.booking())
    world.clock.now = T0 + 5
    running = runs.set_state(world.ledger, run.run_id, RunState.RUNNING, reason="started", actor="sensor")
    assert (running.state, running.state_reason, running.updated_at, running.finished_at) == (
        RunState.RUNNING, "started", T0 + 5, None)
    assert running == runs.get(world.ledger, run.run_id)
    world.clock.now = T0 + 6
    done = runs.set_state(world.ledger, run.run_id, RunState.SUCCEEDED)
    assert (done.state, done.state_reason, done.updated_at, done.finished_at) == (RunState.SUCCEEDED, None, T0 + 6, T0 + 6)
    assert done == runs.get(world.ledger, run.run_id)
    assert runs.get(world.ledger, bystander.run_id) == bystander  # only the named run moved
    assert run_events(world, run.run_id) == [
        ("run_running", "sensor", {"previous_state": "queued", "reason": "started"}),
        ("run_succeeded", "dagster", {"previous_state": "running", "reason": None}),
    ]
    (succeeded,) = events(world, "run_succeeded")
    assert (succeeded.account_id, succeeded.at, succeeded.code) == (world.account.account_id, T0 + 6, None)


def test_transition_refuses_what_the_state_machine_forbids_and_a_stale_run(world) -> None:
    run = new_run(world)
    assert code_of(lambda: runs.set_state(world.ledger, run.run_id, RunState.SUCCEEDED)) is ErrorCode.USAGE_ERROR
    assert code_of(lambda: runs.set_state(world.ledger, "run_" + "0" * 26, RunState.RUNNING)) \
        is ErrorCode.RUN_NOT_FOUND
    runs.set_state(world.ledger, run.run_id, RunState.RUNNING)
    with pytest.raises(ItoError) as info, world.ledger.write() as conn:
        runs.transition(conn, run, RunState.CANCELLED, now=T0, reason=None, actor=None)  # run is stale (queued)
    assert info.value.code is ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT
    for state in (RunState.QUEUED, RunState.CANCELLED):
        assert code_of(lambda: runs.set_state(world.ledger, run.run_id, state)) is ErrorCode.USAGE_ERROR
    assert runs.get(world.ledger, run.run_id).state is RunState.RUNNING
    assert [e[0] for e in run_events(world, run.run_id)] == ["run_running"]


def test_setting_the_state_a_run_has_is_a_no_op(world) -> None:
    run = new_run(world)
    runs.set_state(world.ledger, run.run_id, RunState.RUNNING)
    world.clock.now = T0 + 30
    same = runs.set_state(world.ledger, run.run_id, RunState.RUNNING, reason="again")
    assert (same.state, same.state_reason, same.updated_at) == (RunState.RUNNING, None, T0)
    assert len(events(world, "run_running")) == 1


# ---------------------------------------------------------------- outcome


@pytest.mark.parametrize("state", sorted(TERMINAL_RUN_STATES, key=lambda s: s.value))
def test_a_repeated_report_leaves_a_finished_run_as_it_is(world, state) -> None:
    run = new_run(world)
    drive(world, run, state)
    before, seen = runs.get(world.ledger, run.run_id), len(events(world))
    world.clock.now = T0 + 60
    for kwargs in ({"succeeded": True}, {"succeeded": False}, {"succeeded": False, "gate_code": "EVAL_GATE_FAILED"}):
        assert record_outcome(world.ledger, run.run_id, **kwargs) == before
    assert len(events(world)) == seen


@pytest.mark.parametrize(("state", "expected"), [
    (RunState.QUEUED, [("run_running", None), ("run_succeeded", None)]),
    (RunState.RUNNING, [("run_succeeded", None)]),
    (RunState.CANCELLING, [("run_succeeded", None)]),
])
def test_a_success_ends_succeeded_whatever_was_requested(world, state, expected) -> None:
    run = new_run(world)
    drive(world, run, state)
    seen = len(run_events(world, run.run_id))
    ended = record_outcome(world.ledger, run.run_id, succeeded=True, reason="ignored")
    assert (ended.state, ended.state_reason) == (RunState.SUCCEEDED, None)
    assert [(kind, detail["reason"]) for kind, _actor, detail in run_events(world, run.run_id)[seen:]] == expected
    assert all(actor == "dagster" for _kind, actor, _detail in run_events(world, run.run_id))


@pytest.mark.parametrize("state", [RunState.QUEUED, RunState.RUNNING, RunState.CANCELLING])
def test_a_failed_gate_ends_gate_failed_with_its_code(world, state) -> None:
    run = new_run(world)
    drive(world, run, state)
    ended = record_outcome(world.ledger, run.run_id, succeeded=False, gate_code="BOOKING_REVOKED", reason="other")
    assert (ended.state, ended.state_reason) == (RunState.GATE_FAILED, "BOOKING_REVOKED")
    assert runs.get(world.ledger, run.run_id) == ended
    assert events(world, "run_cancelled") == []


@pytest.mark.parametrize(("state", "reason", "expected"), [
    (RunState.CANCELLING, None, (RunState.CANCELLED, "cancelled by request")),
    (RunState.CANCELLING, "killed", (RunState.CANCELLED, "cancelled by request")),
    (RunState.RUNNING, None, (RunState.FAILED, "the Dagster run failed")),
    (RunState.RUNNING, "", (RunState.FAILED, "the Dagster run failed")),
    (RunState.RUNNING, "OOM at step 10", (RunState.FAILED, "OOM at step 10")),
    (RunState.QUEUED, "never started", (RunState.FAILED, "never started")),
])
def test_any_other_end_is_cancelled_when_requested_or_failed(world, state, reason, expected) -> None:
    run = new_run(world)
    drive(world, run, state)
    ended = record_outcome(world.ledger, run.run_id, succeeded=False, reason=reason)
    assert (ended.state, ended.state_reason) == expected
    assert runs.get(world.ledger, run.run_id) == ended


def test_outcome_of_an_unknown_run_is_not_found(world) -> None:
    assert code_of(lambda: record_outcome(world.ledger, "run_" + "0" * 26, succeeded=True)) is ErrorCode.RUN_NOT_FOUND


# ---------------------------------------------------------------- re-verification


def test_reverify_answers_the_exact_authorization_and_tags(world) -> None:
    run = new_run(world, key="train-key-0001")
    for state in (RunState.QUEUED, RunState.RUNNING):
        drive(world, run, state)
        auth = authorization.reverify(world.ledger, run.run_id)
        booking = bookings.get(world.ledger, world.booking_id)
        assert auth == authorization.Authorization(
            run_id=run.run_id, account_id=world.account.account_id, booking_id=world.booking_id,
            manifest_digest=run.manifest_digest, idempotency_key="train-key-0001",
            confirmation_id=run.confirmation_id, cost_cents=COST, checkpoint_dir=run.checkpoint_dir,
            eligibility=entitlement.eligibility(booking, world.account.account_id, T0),
            price_per_gpu_hour_cents=booking.price_per_gpu_hour_cents, started_at=None, verified_at=T0,
            manifest=auth.manifest)
        assert auth.price_per_gpu_hour_cents == 100  # the booking's, what the job's plan is priced with
        assert auth.manifest.data == manifest_bytes() and auth.manifest.digest == run.manifest_digest
    assert auth.tags() == {"ito/run_id": run.run_id, "ito/account_id": world.account.account_id,
                           "ito/booking_id": world.booking_id, "ito/manifest_digest": run.manifest_digest,
                           "ito/idempotency_key": "train-key-0001"}


@pytest.mark.parametrize("state", [RunState.CANCELLING, *sorted(TERMINAL_RUN_STATES, key=lambda s: s.value)])
def test_reverify_refuses_a_run_that_is_no_longer_queued_or_running(world, state) -> None:
    run = new_run(world)
    drive(world, run, state)
    assert code_of(lambda: authorization.reverify(world.ledger, run.run_id)) is ErrorCode.RUN_FINISHED


def test_reverify_of_an_unknown_run_is_not_found(world) -> None:
    assert code_of(lambda: authorization.reverify(world.ledger, "run_" + "0" * 26)) is ErrorCode.RUN_NOT_FOUND


def test_reverify_reads_the_booking_at_the_current_time(world) -> None:
    run = new_run(world)
    world.clock.now = T0 + 3599
    assert authorization.reverify(world.ledger, run.run_id).run_id == run.run_id
    world.clock.now = T0 + 3600  # the booking's window ends
    assert code_of(lambda: authorization.reverify(world.ledger, run.run_id)) is ErrorCode.BOOKING_EXPIRED
    world.clock.now = T0
    bookings.transition(world.ledger, world.booking_id, "release", actor=None)
    assert code_of(lambda: authorization.reverify(world.ledger, run.run_id)) is ErrorCode.BOOKING_RELEASED


def test_reverify_refuses_an_amended_booking(world) -> None:
    run = new_run(world)
    bookings.amend(world.ledger, world.booking_id, {"topology": "2x4-pcie"}, actor=None)
    assert code_of(lambda: authorization.reverify(world.ledger, run.run_id)) is ErrorCode.BOOKING_MISMATCH


@pytest.mark.parametrize("tamper", ["missing", "other-run", "other-account"])
def test_reverify_needs_the_confirmation_this_run_consumed(world, tamper) -> None:
    run = new_run(world)
    with world.ledger.write() as conn:
        if tamper == "missing":
            conn.execute(runs_table.update().where(runs_table.c.run_id == run.run_id)
                         .values(confirmation_id="cfm_" + "0" * 26))
        else:
            values = ({"consumed_by_run": "run_" + "0" * 26} if tamper == "other-run"
                      else {"account_id": world.other.account_id})
            conn.execute(confirmations_table.update().where(
                confirmations_table.c.confirmation_id == run.confirmation_id).values(**values))
    assert code_of(lambda: authorization.reverify(world.ledger, run.run_id)) is ErrorCode.CONFIRMATION_INVALID


def test_reverify_refuses_a_manifest_that_no_longer_hashes_to_its_digest(world) -> None:
    run = new_run(world)
    with world.ledger.write() as conn:
        conn.execute(manifests_table.update().where(manifests_table.c.digest == run.manifest_digest)
                     .values(content=manifest_bytes() + b" "))
    assert code_of(lambda: authorization.reverify(world.ledger, run.run_id)) is ErrorCode.MANIFEST_DIGEST_MISMATCH


def test_a_budget_is_never_read_from_stored_bytes_that_no_longer_hash_to_their_digest(world) -> None:
    run = new_run(world)
    with world.ledger.read() as conn:
        assert budget.states_for(conn, run.account_id)[0].cap_cents > 0
    with world.ledger.write() as conn:
        conn.execute(manifests_table.update().where(manifests_table.c.digest == run.manifest_digest)
                     .values(content=manifest_bytes(budget__cap_cents=10**12)))
    with world.ledger.read() as conn:
        assert code_of(lambda: budget.states_for(conn, run.account_id)) is ErrorCode.MANIFEST_DIGEST_MISMATCH
    assert code_of(lambda: runs.manifest_bytes(world.ledger, run.manifest_digest)) is ErrorCode.MANIFEST_DIGEST_MISMATCH


def test_reverify_refuses_a_run_whose_manifest_is_gone(world) -> None:
    if not world.ledger.is_sqlite:
        pytest.skip("removing a referenced manifest needs SQLite's foreign_keys pragma")
    run = new_run(world)
    raw = world.ledger.engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("PRAGMA foreign_keys=OFF")
        cursor.execute("DELETE FROM manifests WHERE digest = ?", (run.manifest_digest,))
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()
    finally:
        raw.close()
    assert code_of(lambda: authorization.reverify(world.ledger, run.run_id)) is ErrorCode.MANIFEST_DIGEST_MISMATCH
    assert hashlib.sha256(manifest_bytes()).hexdigest() in run.manifest_digest
