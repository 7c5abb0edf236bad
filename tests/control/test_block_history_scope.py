"""The quote's history: goodput in device-seconds at the block's GPUs (an earlier release's runs
counted by their seconds), pooled over other accounts only once runs of three accounts count and
no rival holds nearly all of what the asker does not know, never an infinity, and a goodput even where no run recorded its device-hours."""

from __future__ import annotations

import pytest

from gate_world import make_identity, new_run, verified
from ito_assets.api import envelope
from ito_assets.control import bookings, confirm_request, history, identity, telemetry
from ito_assets.control.history import HistoryScope, block_history, describe
from ito_assets.control.ledger import runs
from ito_assets.control.states import Role


def _ended(world, account=None, key: str | None = None) -> str:
    """A run that ended, on a booking of its own account (a booking runs one run at a time)."""
    account = account or world.account
    booking = world.booking_id if account is world.account else world.booking(account)
    run = new_run(world, booking_id=booking, account=account, key=key)
    with world.ledger.write() as conn:
        conn.execute(runs.update().where(runs.c.run_id == run.run_id).values(state="succeeded", finished_at=1))
    return run.run_id


def _publish(world, run_id: str, **figures: float) -> None:
    """Figures by their ledger name without `run/`: allocated_seconds=..., device_hours=..."""
    telemetry.publish(world.ledger, run_id, [], [(0, f"run/{name}", value) for name, value in figures.items()])


def _history(world, account_id: str | None = None):
    terms = bookings.get(world.ledger, world.booking_id)
    with world.ledger.read() as conn:
        return block_history(conn, terms, account_id)


def _tenant(world, name: str):
    account = identity.create_account(world.ledger, name, actor=world.desk.token_id)
    return make_identity(world.ledger, Role.ACCOUNT, account.account_id)


NEW = dict(allocated_seconds=3000.0, productive_seconds=3000.0, device_hours=10_000 / 3600, unplanned_interruptions=0.0,
           allocated_device_seconds=24_000.0, productive_device_seconds=10_000.0)


def test_goodput_is_the_device_seconds_share_and_an_older_release_run_counts_by_its_seconds(world):
    """Pretraining on all 8 GPUs, SFT and DPO on one: every second productive, 42 % of the GPU
    time booked. A run published before device-seconds counts its seconds' share at the 8 GPUs."""
    new, old = _ended(world, key="dev-seconds-0001"), _ended(world, key="dev-seconds-0002")
    _publish(world, new, **NEW)
    assert _history(world).expected_goodput == pytest.approx(10_000 / 24_000)  # the seconds said 100 %
    _publish(world, old, allocated_seconds=1000.0, productive_seconds=500.0, device_hours=8000 / 3600,
             unplanned_interruptions=0.0)
    found = _history(world)
    assert found.num_runs == 2 and found.expected_goodput == pytest.approx((10_000 + 4000) / (24_000 + 8000))
    assert found.effective_price_per_productive_gpu_hour_cents == pytest.approx(100 / found.expected_goodput)


@pytest.mark.parametrize(("num_accounts", "scope"), [(1, "account"), (2, "account"), (3, "pooled"), (4, "pooled")])
def test_an_accounts_quote_pools_other_accounts_only_from_three(world, num_accounts, scope):
    """Below three accounts, the asker would take its own runs out of the pooled sums and read the
    others' exactly: its quote then states its own runs alone. The desk's view is always pooled."""
    others = [world.other, *(_tenant(world, f"tenant-{i}") for i in range(num_accounts - 2))][: num_accounts - 1]
    mine = _ended(world, key="own-run-000001")
    _publish(world, mine, allocated_seconds=100.0, productive_seconds=50.0, device_hours=800 / 3600,
             unplanned_interruptions=0.0, allocated_device_seconds=800.0, productive_device_seconds=400.0)
    for number, other in enumerate(others):
        run = _ended(world, other, key=f"other-run-{number:05d}")
        _publish(world, run, allocated_seconds=100.0, productive_seconds=20.0, device_hours=800 / 3600,
                 unplanned_interruptions=1.0, allocated_device_seconds=800.0, productive_device_seconds=160.0)
    found = _history(world, world.account.account_id)
    assert found.scope == scope
    if scope == "account":
        assert (found.num_runs, found.expected_goodput, found.unplanned_interruptions_per_1000_device_hours) == (
            1, pytest.approx(0.5), 0.0)
        assert "of this account" in describe(found)
    else:
        assert found.num_runs == num_accounts
        exact = (400 + 160 * len(others)) / (800 * num_accounts)
        assert found.expected_goodput == round(exact, 2)  # an account reads pooled figures rounded
    desk = _history(world)
    assert desk.scope == "pooled" and desk.num_runs == num_accounts
    if scope == "pooled":
        assert desk.expected_goodput == pytest.approx(exact)  # the desk, exactly


def _three_accounts(world, mine: float, rival: tuple[float, float], third: tuple[float, float]) -> None:
    """The asker's run (`mine` device-seconds) and one run each of two other accounts, given as
    (allocated device-seconds, device-hours); every run half productive."""
    for number, (account, (seconds, hours)) in enumerate([(world.account, (mine, 1.0)), (world.other, rival),
                                                         (_tenant(world, "tenant-third"), third)]):
        run = _ended(world, account, key=f"share-run-{number:05d}")
        _publish(world, run, allocated_seconds=seconds / 8, productive_seconds=seconds / 16, device_hours=hours,
                 unplanned_interruptions=0.0, allocated_device_seconds=seconds, productive_device_seconds=seconds / 2)


@pytest.mark.parametrize(("third", "scope"), [(99.0, "account"), (100.0, "pooled"), (101.0, "pooled")])
def test_three_accounts_pool_only_where_the_third_holds_a_tenth_of_the_largest_rivals_device_seconds(
        world, third, scope):
    """The p% rule at 10 %: the asker less its own runs would read a rival's goodput whole where
    the third account's runs are a sliver beside the rival's, three accounts or not."""
    _three_accounts(world, 500.0, (1000.0, 1.0), (third, 1.0))
    found = _history(world, world.account.account_id)
    assert found.scope == scope and found.num_runs == (3 if scope == "pooled" else 1)
    if scope == "account":
        assert "none holding nearly all of the others'" in describe(found)
    assert _history(world).scope == "pooled"  # the desk's view


def test_an_account_reads_the_pool_rounded_so_its_quotes_do_not_difference_to_a_rivals_run(world):
    """Exact pooled figures before and after a run of the asker's own (whose figures it knows)
    give the pool's sums, and from them each rival run that ends between two later quotes: an
    account reads goodput to a point and the interruption rate to a tenth; the desk reads them exact."""
    for number, (account, productive, unplanned) in enumerate([(world.account, 500.0, 0.0), (world.other, 777.0, 1.0),
                                                                (_tenant(world, "tenant-x"), 333.0, 2.0)]):
        run = _ended(world, account, key=f"coarse-run-{number:04d}")
        _publish(world, run, allocated_seconds=125.0, productive_seconds=productive / 8, device_hours=0.3,
                 unplanned_interruptions=unplanned, allocated_device_seconds=1000.0, productive_device_seconds=productive)
    desk, mine = _history(world), _history(world, world.account.account_id)
    assert desk.expected_goodput == pytest.approx(1610 / 3000) and mine.expected_goodput == 0.54
    assert desk.unplanned_interruptions_per_1000_device_hours == pytest.approx(3000 / 0.9)
    assert mine.unplanned_interruptions_per_1000_device_hours == 3333.3
    assert mine.effective_price_per_productive_gpu_hour_cents == pytest.approx(100 / 0.54)


def test_figures_that_add_up_past_a_doubles_range_give_no_history_not_an_error(world):
    """Each finite, their sum not: math.fsum raises there, which was an internal error."""
    for number in range(2):
        run = _ended(world, key=f"huge-figures-{number:03d}")
        _publish(world, run, allocated_seconds=1e308, productive_seconds=1e308, device_hours=1e308,
                 unplanned_interruptions=0.0, allocated_device_seconds=1e308, productive_device_seconds=1e308)
    found = _history(world)
    assert found.num_runs == 0 and found.expected_goodput is None


@pytest.mark.parametrize(("third_hours", "scope"), [(0.099, "account"), (0.1, "pooled")])
def test_the_rule_holds_on_device_hours_too(world, third_hours, scope):
    """The interruption rate is weighed by device-hours: a rival holding nearly all of them would
    show its own rate through the pool."""
    _three_accounts(world, 500.0, (1000.0, 1.0), (1000.0, third_hours))
    assert _history(world, world.account.account_id).scope == scope


def test_the_askers_own_runs_never_make_up_the_rest(world):
    """However large the asker's share, it knows it: the rest that hides the largest rival is the
    other accounts' alone."""
    _three_accounts(world, 10**6, (1000.0, 1.0), (50.0, 1.0))
    assert _history(world, world.account.account_id).scope == "account"


def test_the_quote_of_one_tenant_never_shows_a_single_rivals_run(world):
    rival = _ended(world, world.other, key="rival-run-00001")
    _publish(world, rival, allocated_seconds=7200.0, productive_seconds=2520.0, device_hours=16.0,
             unplanned_interruptions=3.0, allocated_device_seconds=57_600.0, productive_device_seconds=20_160.0)
    quote = confirm_request.quote_train(world.ledger, world.policy, world.account, world.booking_id, verified())
    shown = quote.to_dict()["history"]
    assert shown["scope"] == HistoryScope.ACCOUNT.value and shown["num_runs"] == 0
    assert shown["expected_goodput"] is None and shown["unplanned_interruptions_per_1000_device_hours"] is None


@pytest.mark.parametrize(("productive", "priced"), [
    (1e-10, False),  # 1e-310 of the allocation: the price was an infinity, and the answer INTERNAL_ERROR
    (0.00999, False),  # just below the floor
    (0.01, True),  # at it
    (0.5, True),
])
def test_a_goodput_too_small_to_price_gives_no_price_and_a_strict_answer(world, productive, priced):
    run = _ended(world, key="tiny-goodput-01")
    scale = 1e300 if productive == 1e-10 else 1.0
    _publish(world, run, allocated_seconds=scale, productive_seconds=productive, device_hours=1.0,
             unplanned_interruptions=0.0, allocated_device_seconds=scale, productive_device_seconds=productive)
    found = _history(world)
    assert found.num_runs == 1 and found.expected_goodput == pytest.approx(productive / scale)
    effective = found.effective_price_per_productive_gpu_hour_cents
    assert (effective == pytest.approx(100 / productive)) if priced else effective is None
    envelope.dumps(envelope.success({"history": found.to_dict()}, live_api_contacted=True))  # no infinity in it
    assert ("too little productive time to price" in describe(found)) is not priced


def test_runs_without_device_hours_still_give_their_goodput(world):
    """Logs written before they named their devices published 0 device-hours: the goodput stands,
    the interruption rate alone is unknown."""
    run = _ended(world, key="no-dev-hours-01")
    _publish(world, run, allocated_seconds=3600.0, productive_seconds=3000.0, device_hours=0.0,
             unplanned_interruptions=0.0)
    found = _history(world)
    assert found.num_runs == 1 and found.expected_goodput == pytest.approx(3000 / 3600)
    assert found.unplanned_interruptions_per_1000_device_hours is None
    assert found.effective_price_per_productive_gpu_hour_cents == pytest.approx(100 * 3600 / 3000)
    assert describe(found).startswith("from 1 past run(s) on ") and "interruption rate unknown" in describe(found)
    # A run with device-hours beside it: the rate is over those alone.
    other = _ended(world, key="no-dev-hours-02")
    _publish(world, other, allocated_seconds=3600.0, productive_seconds=3600.0, device_hours=8.0,
             unplanned_interruptions=2.0)
    assert _history(world).unplanned_interruptions_per_1000_device_hours == pytest.approx(250.0)


def test_an_older_server_answer_without_a_scope_reads_as_pooled():
    older = {"block": "8 x H100 over 1 node(s)", "num_runs": 2, "list_price_per_gpu_hour_cents": 100,
             "expected_goodput": 0.5, "unplanned_interruptions_per_1000_device_hours": 1.0,
             "effective_price_per_productive_gpu_hour_cents": 200.0}
    found = history.BlockHistory(**older)
    assert found.scope == "pooled" and describe(found).startswith("from 2 past run(s) on 8 x H100")
