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
