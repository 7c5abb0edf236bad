"""The desk's quote states what past runs on blocks like the one quoted delivered: the expected
goodput (time-weighted), the unplanned interruption rate and the effective price per productive
GPU-hour, from the run figures the training telemetry publishes; with no such run, it says so."""

from __future__ import annotations

import pytest

from test_lifecycle import make_run

from ito_assets.control import bookings, history, telemetry
from ito_assets.control.history import block_history, describe



def _publish(world, run_id: str, allocated: float, productive: float, device_hours: float, per_1000: float) -> None:
    row = {"allocated_seconds": allocated, "productive_seconds": productive, "device_hours": device_hours,
           "unplanned_interruptions_per_1000_device_hours": per_1000}
    telemetry.publish(world.ledger, run_id, [], [(0, name, value) for name, value in history.run_figures(row).items()])


def _finished(world, key: str):
    """A run that ended: the booking takes the next one (it runs one at a time)."""
    from ito_assets.control.ledger import runs

    run = make_run(world, key)
    with world.ledger.write() as conn:
        conn.execute(runs.update().where(runs.c.run_id == run.run_id).values(state="succeeded", finished_at=1))
    return run


def _history(world):
    from ito_assets.control.ledger import bookings as table

    with world.ledger.read() as conn:
        row = conn.execute(table.select().where(table.c.booking_id == world.booking_id)).mappings().one()
        terms = bookings.BookingTerms(**{f: row[f] for f in bookings.BookingTerms.__dataclass_fields__})
        return block_history(conn, terms), terms


def test_no_past_run_says_so_and_gives_the_list_price(world):
    found, terms = _history(world)
    assert (found.num_runs, found.expected_goodput, found.effective_price_per_productive_gpu_hour_cents) == (0, None, None)
    assert describe(found).startswith(f"no past run on {terms.num_gpus} x {terms.gpu_type}")


def test_past_runs_are_weighted_by_their_time(world):
    first, second = _finished(world, "history-key-0001"), _finished(world, "history-key-0002")
    _publish(world, first.run_id, allocated=1000, productive=900, device_hours=2.0, per_1000=500.0)  # 1 interruption
    _publish(world, second.run_id, allocated=3000, productive=1500, device_hours=6.0, per_1000=0.0)
    found, terms = _history(world)
    assert found.num_runs == 2
    assert found.expected_goodput == pytest.approx(2400 / 4000)  # not the mean of 0.9 and 0.5
    assert found.unplanned_interruptions_per_1000_device_hours == pytest.approx(1000 * 1 / 8)
    assert found.effective_price_per_productive_gpu_hour_cents == pytest.approx(terms.price_per_gpu_hour_cents / 0.6)
    assert describe(found).startswith("from 2 past run(s) on ") and "expected goodput 60.0%" in describe(found)


def test_the_quote_carries_the_history(world):
    from test_lifecycle import verified
    from ito_assets.control import confirm_request

    run = _finished(world, "history-key-0003")
    _publish(world, run.run_id, allocated=100, productive=25, device_hours=1.0, per_1000=0.0)
    quote = confirm_request.quote_train(world.ledger, world.policy, world.account, world.booking_id, verified())
    assert quote.to_dict()["history"]["expected_goodput"] == pytest.approx(0.25)


def test_a_runs_figures_published_again_replace_its_first_in_the_quote(world):
    """The telemetry materialized again (a stage retried, or read anew): the last figures stand, the
    first stay in the ledger, and publishing the same figures once more adds nothing."""
    run = _finished(world, "history-key-0004")
    _publish(world, run.run_id, allocated=1000, productive=900, device_hours=2.0, per_1000=500.0)
    revise = lambda productive: telemetry.publish(
        world.ledger, run.run_id, [], [(0, history.PRODUCTIVE, productive)], revised=True)
    assert revise(400.0) == (0, 1)
    found, _ = _history(world)
    assert found.num_runs == 1 and found.expected_goodput == pytest.approx(0.4)
    assert revise(400.0) == (0, 0)  # the same value: nothing added
    assert revise(900.0) == (0, 1)  # back to the first value: the last stands again
    assert _history(world)[0].expected_goodput == pytest.approx(0.9)
    stored = [m.value for m in telemetry.every_page(telemetry.metrics, world.ledger, run.run_id) if m.name == history.PRODUCTIVE]
    assert stored == [900.0, 400.0, 900.0]
    # Without `revised` a stage's figures keep their first value.
    assert telemetry.publish(world.ledger, run.run_id, [], [(0, history.PRODUCTIVE, 1.0)]) == (0, 0)


def test_a_run_that_stopped_early_counts_with_what_its_stages_used(world, tmp_path):
    """Each stage publishes the run's figures as it ends (`publish_run`, from the folders the run's
    stages left): a run that stopped at a failed gate counts in the quote with what it used."""
    from ito_assets.runtime.record import events
    from ito_assets.runtime.record.events import Event, EventKind
    from ito_assets.runtime.record.publish import publish_run
    from ito_assets.runtime.record.storage import RunLayout

    run = _finished(world, "history-key-0005")
    layout = RunLayout(checkpoint_dir=tmp_path, run_dir=tmp_path)
    windows = {layout.run_dir / "pretraining": (100.0, 60), layout.posttraining_dir / "sft": (50.0, 10)}
    for folder, (seconds, steps) in windows.items():
        folder.mkdir(parents=True)
        events.append(folder, Event(kind=EventKind.ALLOCATION, at=1_000.0, seconds=seconds, num_devices=1))
        for step in range(1, steps + 1):
            events.append(folder, Event(kind=EventKind.STEP, at=1_000.0, step=step, seconds=1.0), by_worker=True)
    (layout.run_dir / "not-a-stage").mkdir()
    assert list(layout.stage_dirs()) == ["pretraining", "sft"]
    row = publish_run(world.ledger, run.run_id, layout.stage_dirs())
    assert (row["allocated_seconds"], row["productive_seconds"], row["badput_idle_seconds"]) == (150.0, 70.0, 0.0)
    found, _ = _history(world)
    # Both stages held one of the booking's 8 GPUs: the other 7 were booked and idle.
    assert found.num_runs == 1 and found.expected_goodput == pytest.approx(70 / (150 * 8))
    assert publish_run(world.ledger, run.run_id, layout.stage_dirs()) == row  # nothing new to add
    assert len([m for m in telemetry.every_page(telemetry.metrics, world.ledger, run.run_id)]) == len(history.RUN_FIGURES)


@pytest.mark.parametrize("ended", ["succeeded", "failed", "cancelled", "gate_failed"])
def test_a_run_counts_in_the_quote_once_it_has_ended_however(world, ended):
    """Still queued or running, a run has published its first stages' figures only: the quote
    leaves it out until it ends, then counts what it used."""
    from ito_assets.control.ledger import runs

    run = make_run(world, "history-key-0006")
    _publish(world, run.run_id, allocated=100, productive=10, device_hours=1.0, per_1000=0.0)
    for state in ("queued", "running", "cancelling"):
        with world.ledger.write() as conn:
            conn.execute(runs.update().where(runs.c.run_id == run.run_id).values(state=state))
        assert _history(world)[0].num_runs == 0
    with world.ledger.write() as conn:
        conn.execute(runs.update().where(runs.c.run_id == run.run_id).values(state=ended, finished_at=1))
    found, _ = _history(world)
    assert found.num_runs == 1 and found.expected_goodput == pytest.approx(0.1)


@pytest.mark.parametrize("stored", [float("inf"), float("-inf"), float("nan")])
def test_a_run_whose_last_figure_is_not_a_number_is_left_out_of_the_quote(world, stored):
    """An older release stored non-finite figures (SQLite keeps an infinity; PostgreSQL NaN too), which `ito metrics` shows as null. Summed into the quote, one made
    its JSON impossible (INTERNAL_ERROR for every quote of that block); counted as nothing, it would
    lower the goodput. What that run delivered is unknown: it is left out, the others count."""
    from test_lifecycle import verified
    from ito_assets.api import envelope
    from ito_assets.control import confirm_request
    from ito_assets.control.ledger import run_metrics

    if stored != stored and world.ledger.engine.dialect.name == "sqlite":
        pytest.skip("SQLite stores NaN as NULL, which the NOT NULL column refuses: no such row exists there")
    good, old = _finished(world, "history-key-0007"), _finished(world, "history-key-0008")
    _publish(world, good.run_id, allocated=1000, productive=900, device_hours=2.0, per_1000=0.0)
    _publish(world, old.run_id, allocated=1000, productive=100, device_hours=2.0, per_1000=0.0)
    with world.ledger.write() as conn:  # as the older release wrote it, after its finite figures
        conn.execute(run_metrics.insert().values(run_id=old.run_id, step=0, name=history.PRODUCTIVE, value=stored, at=1))
    found, _ = _history(world)
    assert (found.num_runs, found.expected_goodput) == (1, pytest.approx(0.9))
    quote = confirm_request.quote_train(world.ledger, world.policy, world.account, world.booking_id, verified())
    assert '"expected_goodput": 0.9' in envelope.dumps(envelope.success(quote.to_dict(), live_api_contacted=True))
    # Its figures published again, finite, it counts again.
    telemetry.publish(world.ledger, old.run_id, [], [(0, history.PRODUCTIVE, 100.0)], revised=True)
    assert _history(world)[0].num_runs == 2
