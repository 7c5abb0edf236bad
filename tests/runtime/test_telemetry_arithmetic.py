"""Desk telemetry computed exactly from a constructed event log (whole numbers: exact in floats)."""

from __future__ import annotations

import pytest

from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import Event, EventKind
from ito_assets.runtime.record.goodput import summarize


def _log() -> list[Event]:
    e = lambda kind, **f: Event(kind=kind, at=0.0, **f)
    log = [
        e(EventKind.ALLOCATION, seconds=3600, num_devices=2),  # 2 device-hours
        e(EventKind.STARTUP, attempt=0, seconds=100),
        e(EventKind.RESUME, attempt=0, step=-1),
        *[e(EventKind.STEP, attempt=0, step=s, seconds=10) for s in range(1, 16)],  # 11-15 are redone
        e(EventKind.CHECKPOINT, attempt=0, step=10, seconds=2, total_seconds=20, num_bytes=1000),
        e(EventKind.INTERRUPTION, attempt=0, planned=False, seconds=30),
        e(EventKind.STARTUP, attempt=1, seconds=50),  # inside the recovery, not start-up badput
        e(EventKind.RECOVERY, attempt=1, seconds=120),
        e(EventKind.RESUME, attempt=1, step=10),
        *[e(EventKind.STEP, attempt=1, step=s, seconds=10) for s in range(11, 31)],
        e(EventKind.CHECKPOINT, attempt=1, step=20, seconds=3, total_seconds=30, num_bytes=1000),
        e(EventKind.CHECKPOINT, attempt=1, step=30, seconds=5, total_seconds=50, num_bytes=2000),
        e(EventKind.INTERRUPTION, attempt=1, planned=True, seconds=1),
        e(EventKind.EVALUATION, attempt=1, seconds=40),
    ]
    return log


def test_goodput_and_badput_split():
    t = summarize(_log())
    assert t.productive_seconds == 100 + 200 and t.num_steps == 30 and t.num_wasted_steps == 5
    assert t.goodput == 300 / 3600
    assert (t.startup_seconds, t.checkpoint_blocking_seconds, t.recovery_seconds, t.wasted_step_seconds,
            t.evaluation_seconds) == (100, 10, 30 + 120 + 1, 50, 40)  # recovery: each failure's detection too
    assert t.other_seconds == 3600 - (300 + 100 + 10 + 151 + 50 + 40) == 2949


def test_interruption_rate_per_1000_device_hours():
    t = summarize(_log())
    assert t.device_hours == 2.0
    assert t.interruptions_per_1000_device_hours(planned=False) == 500.0
    assert t.interruptions_per_1000_device_hours(planned=True) == 500.0


def test_checkpoint_bandwidth_and_blocking_seconds():
    t = summarize(_log())
    assert (t.num_checkpoints, t.checkpoint_bytes, t.checkpoint_total_seconds) == (3, 4000, 100)
    assert t.checkpoint_bandwidth_bytes_per_second == 40.0
    row = t.as_row()
    assert row["badput_checkpoint_seconds"] == 10 and row["goodput"] == 300 / 3600


def test_a_step_is_wasted_only_when_a_later_attempt_went_back_before_it():
    e = lambda kind, **f: Event(kind=kind, at=0.0, **f)
    log = [e(EventKind.ALLOCATION, seconds=100, num_devices=1), e(EventKind.RESUME, attempt=0, step=-1),
           *[e(EventKind.STEP, attempt=0, step=s, seconds=1) for s in (1, 2, 3)],
           e(EventKind.RESUME, attempt=1, step=3),  # resumed exactly where it stopped: nothing redone
           e(EventKind.STEP, attempt=1, step=4, seconds=1)]
    t = summarize(log)
    assert (t.num_steps, t.num_wasted_steps, t.goodput) == (4, 0, 0.04)


def test_the_log_round_trips_through_its_file_and_refuses_bad_events(tmp_path):
    for event in _log():
        events.append(tmp_path, event)
    assert summarize(events.read(tmp_path)) == summarize(_log())
    with pytest.raises(ValueError, match="planned"):
        Event(kind=EventKind.INTERRUPTION, at=0.0)
    with pytest.raises(ValueError, match="step"):
        Event(kind=EventKind.STEP, at=0.0, seconds=1)
