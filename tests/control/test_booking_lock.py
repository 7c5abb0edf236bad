"""On PostgreSQL, what serializes two trains on one booking is the booking's row lock, taken
FOR UPDATE by the creating transaction (SQLite has one writer and needs none). A run's foreign key
alone only takes FOR KEY SHARE on the booking, which two trains can hold at once; so the test
holds FOR NO KEY UPDATE, which conflicts with FOR UPDATE but not with a key share: a train that
takes the lock waits and answers IDEMPOTENCY_KEY_IN_FLIGHT, creating nothing."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from gate_world import PG_URL, Clock, make_policy, make_world, postgres_reason, verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import cancel, confirm_request, create_run, ids
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.ledger import bookings, confirmations, open_ledger, runs

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_world(tmp_path):
    reason = postgres_reason()
    if reason:
        pytest.skip(reason)
    schema = f"t_{uuid.uuid4().hex[:16]}"
    clock = Clock()
    ledger = open_ledger(PG_URL, schema=schema, clock=clock, lock_timeout_s=0.3)
    yield make_world(ledger, make_policy(tmp_path), clock)
    ledger.dispose()
    admin = open_ledger(PG_URL, create=False)
    with admin.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    admin.dispose()


def test_a_train_waits_for_the_booking_row_lock_and_creates_nothing_while_it_is_held(pg_world) -> None:
    world = pg_world
    ref = world.confirm_train()
    request = TrainRequest(booking_id=world.booking_id, verified=verified(), confirmation_ref=ref,
                           idempotency_key="key-locked-0001")
    with world.ledger.engine.connect() as holder, holder.begin():
        # key_share=True renders FOR NO KEY UPDATE on PostgreSQL.
        holder.execute(sa.select(bookings).where(bookings.c.booking_id == world.booking_id)
                       .with_for_update(key_share=True))
        with pytest.raises(ItoError) as info:
            create_run.create_run(world.ledger, world.policy, world.account, request)
        assert info.value.code is ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT
    with world.ledger.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(runs)).scalar_one() == 0
    # Once the lock is released the same request goes through.
    assert not create_run.create_run(world.ledger, world.policy, world.account, request).replayed


def test_a_request_naming_another_requests_confirmation_is_refused_without_waiting_on_its_lock(pg_world) -> None:
    """A train or a cancel that names the account's cleanup confirmation while that cleanup holds
    it: refused as a mismatch at once. It used to lock the row first and wait; where the cleanup
    then wanted the booking or the runs the request held, PostgreSQL broke the deadlock by failing
    one of them with an error no code answered (INTERNAL_ERROR over HTTP)."""
    world = pg_world
    run = create_run.create_run(world.ledger, world.policy, world.account, TrainRequest(
        booking_id=world.booking_id, verified=verified(), confirmation_ref=world.confirm_train(),
        idempotency_key="key-mismatch-01")).run
    cleanup = confirm_request.request_cleanup(world.ledger, world.policy, world.account).ref
    with world.ledger.engine.connect() as holder, holder.begin():
        holder.execute(sa.select(confirmations).where(confirmations.c.ref_hash == ids.secret_hash(cleanup))
                       .with_for_update())
        train = TrainRequest(booking_id=world.booking_id, verified=verified(), confirmation_ref=cleanup,
                             idempotency_key="key-mismatch-02")
        with pytest.raises(ItoError) as info:
            create_run.create_run(world.ledger, world.policy, world.account, train)
        assert info.value.code is ErrorCode.CONFIRMATION_MISMATCH
        with pytest.raises(ItoError) as info:
            cancel.cancel_run(world.ledger, world.account, run.run_id, confirmation_ref=cleanup,
                              idempotency_key="key-mismatch-03")
        assert info.value.code is ErrorCode.CONFIRMATION_MISMATCH
