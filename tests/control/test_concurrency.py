"""Atomicity is the database's job: 64 concurrent requests, on SQLite and on PostgreSQL.

Threads share one engine (a connection each), as the server's thread pool does; the SQLite
path serializes on BEGIN IMMEDIATE, the PostgreSQL path on the booking row lock and the
unique constraints. No Python lock anywhere.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
import threading

import sqlalchemy as sa

from gate_world import verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import create_run
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.ledger import confirmations, runs as runs_table

NUM_CALLERS = 64


def _race(world, refs_and_keys: list[tuple[str, str]]) -> list:
    manifest = verified()
    barrier = threading.Barrier(len(refs_and_keys))

    def call(ref_key):
        ref, key = ref_key
        barrier.wait()
        try:
            return create_run.create_run(world.ledger, world.policy, world.account, TrainRequest(
                booking_id=world.booking_id, verified=manifest, confirmation_ref=ref, idempotency_key=key))
        except ItoError as error:
            return error.code

    with ThreadPoolExecutor(max_workers=len(refs_and_keys)) as pool:
        return list(pool.map(call, refs_and_keys))


def _count(world, table, *where) -> int:
    with world.ledger.read() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one()


def test_same_key_from_64_callers_creates_exactly_one_run(world) -> None:
    ref = world.confirm_train()
    results = _race(world, [(ref, "same-key-0001")] * NUM_CALLERS)
    run_ids = {r.run.run_id for r in results if not isinstance(r, ErrorCode)}
    errors = [r for r in results if isinstance(r, ErrorCode)]
    # A caller may be told "in flight" (retryable) but never gets a second run.
    assert set(errors) <= {ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT}
    assert len(run_ids) == 1 and _count(world, runs_table) == 1
    assert sum(1 for r in results if not isinstance(r, ErrorCode) and not r.replayed) == 1


def test_one_confirmation_under_64_keys_is_consumed_exactly_once(world) -> None:
    world.policy = replace(world.policy, max_concurrent_runs_per_booking=NUM_CALLERS)
    ref = world.confirm_train()
    results = _race(world, [(ref, f"key-{i:08d}") for i in range(NUM_CALLERS)])
    created = [r for r in results if not isinstance(r, ErrorCode)]
    assert len(created) == 1 and _count(world, runs_table) == 1
    assert set(r for r in results if isinstance(r, ErrorCode)) <= {ErrorCode.CONFIRMATION_CONSUMED,
                                                                    ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT}
    assert _count(world, confirmations, confirmations.c.consumed_at.is_not(None)) == 1
