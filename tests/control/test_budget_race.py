"""The budget cap holds when many trains of one manifest race, on one booking or on one each.

Every caller holds its own approved confirmation and its own key, all issued before any run
exists (so each was priced against an empty budget). The cap fits exactly FIT runs; every other
caller must be told BUDGET_EXCEEDED: never a run past the cap, never IDEMPOTENCY_KEY_IN_FLIGHT
to a caller whose key nobody else used. The codes are counted as create_run answers them, before
any client retry could hide one.

`make test` races 16 callers once per back end and layout; `make test-long` runs 16 and 64
callers, 20 trials each.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import sqlalchemy as sa

from gate_world import COST, manifest_bytes, verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import budget, create_run, runs
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.ledger import runs as runs_table
from ito_assets.control.states import RunState

FIT = 3


def _manifest(trial: int):
    # A different cap per trial gives a different digest, hence a fresh budget, in the same ledger;
    # FIT * COST + trial still fits exactly FIT runs of COST.
    cap = FIT * COST + trial
    return verified(manifest_bytes(budget__cap_cents=cap, budget__max_incremental_cents=COST))


def _race(world, manifest, bookings: list[str]) -> list:
    refs = [world.confirm_train(booking_id, manifest) for booking_id in bookings]
    barrier = threading.Barrier(len(bookings))

    def call(index: int):
        request = TrainRequest(booking_id=bookings[index], verified=manifest, confirmation_ref=refs[index],
                               idempotency_key=f"race-{manifest.digest[7:15]}-{index:04d}")
        barrier.wait()
        try:
            return create_run.create_run(world.ledger, world.policy, world.account, request)
        except ItoError as error:
            return error.code

    with ThreadPoolExecutor(max_workers=len(bookings)) as pool:
        return list(pool.map(call, range(len(bookings))))


def _trial(world, trial: int, callers: int, *, shared_booking: bool) -> None:
    manifest = _manifest(trial)
    bookings = [world.booking_id] * callers if shared_booking else [world.booking() for _ in range(callers)]
    answers = _race(world, manifest, bookings)
    created = [a for a in answers if not isinstance(a, ErrorCode)]
    codes = Counter(a for a in answers if isinstance(a, ErrorCode))
    assert len(created) == FIT and not any(c.replayed for c in created), codes
    assert codes == Counter({ErrorCode.BUDGET_EXCEEDED: callers - FIT})
    with world.ledger.read() as conn:
        state = budget.state(conn, world.account.account_id, manifest.digest, manifest.manifest.budget)
        rows = conn.execute(sa.select(sa.func.count()).select_from(runs_table).where(
            runs_table.c.manifest_digest == manifest.digest)).scalar_one()
    assert rows == FIT and state.committed_cents == FIT * COST <= state.cap_cents
    for made in created:  # free the booking's capacity for the next trial; the spend stays
        runs.set_state(world.ledger, made.run.run_id, RunState.RUNNING)
        runs.set_state(world.ledger, made.run.run_id, RunState.SUCCEEDED)


def _open_world(world, callers: int):
    world.policy = replace(world.policy, max_concurrent_runs_per_booking=callers)
    return world


@pytest.mark.parametrize("shared_booking", [False, True], ids=["booking-per-caller", "one-booking"])
def test_sixteen_trains_against_one_cap(world, shared_booking) -> None:
    _trial(_open_world(world, 16), 0, 16, shared_booking=shared_booking)


@pytest.mark.long
@pytest.mark.parametrize("callers", [16, 64])
@pytest.mark.parametrize("shared_booking", [False, True], ids=["booking-per-caller", "one-booking"])
def test_twenty_trials_against_one_cap(world, callers, shared_booking) -> None:
    _open_world(world, callers)
    for trial in range(20):
        _trial(world, trial, callers, shared_booking=shared_booking)


@pytest.fixture
def repeatable_read_world(tmp_path):
    """A world whose Postgres role reads REPEATABLE READ by default (a site's setting, on its
    database or role): the ledger must not take that default."""
    import uuid

    import psycopg

    from gate_world import Clock, make_policy, make_world, postgres_reason
    from ito_assets.control.ledger import open_ledger

    if postgres_reason():
        pytest.skip(postgres_reason())
    role, schema = f"ito_rr_{uuid.uuid4().hex[:12]}", f"t_{uuid.uuid4().hex[:16]}"
    admin = psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True)
    admin.execute(f"CREATE ROLE {role} LOGIN")
    admin.execute(f"ALTER ROLE {role} SET default_transaction_isolation = 'repeatable read'")
    admin.execute(f"GRANT CREATE ON DATABASE test TO {role}")
    ledger = None
    try:
        with psycopg.connect(f"postgresql://{role}@127.0.0.1:5432/test") as raw:  # the role's default holds
            assert raw.execute("SHOW transaction_isolation").fetchone()[0] == "repeatable read"
        clock = Clock()
        ledger = open_ledger(f"postgresql+psycopg://{role}@127.0.0.1:5432/test", schema=schema, clock=clock)
        yield make_world(ledger, make_policy(tmp_path), clock)
    finally:
        if ledger is not None:
            ledger.dispose()
        admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.execute(f"REVOKE CREATE ON DATABASE test FROM {role}")
        admin.execute(f"DROP OWNED BY {role}")
        admin.execute(f"DROP ROLE {role}")
        admin.close()


@pytest.mark.postgres
def test_the_cap_holds_where_the_database_defaults_to_repeatable_read(repeatable_read_world, monkeypatch) -> None:
    """Two trains of one manifest on two bookings, the cap fitting one: the second waits for the
    manifest's lock while the first holds it, then must see the first's run. Under a snapshot
    taken at its first statement it did not, and both were created."""
    world = repeatable_read_world
    with world.ledger.write() as conn:
        assert conn.exec_driver_sql("SHOW transaction_isolation").scalar_one() == "read committed"
    capped = verified(manifest_bytes(budget__cap_cents=COST, budget__max_incremental_cents=COST))
    original = budget.lock

    def slow_lock(*args, **kwargs):  # the holder keeps the lock long enough for the other to queue
        original(*args, **kwargs)
        time.sleep(0.5)
    monkeypatch.setattr(budget, "lock", slow_lock)
    answers = _race(world, capped, [world.booking(), world.booking()])
    assert Counter(type(a).__name__ if not isinstance(a, ErrorCode) else a.value for a in answers) == Counter(
        {"Created": 1, "BUDGET_EXCEEDED": 1})
