"""The event log and the checkpoint registry read back after a killed writer, a full disk or a
hand edit: a bad line is skipped alone, the lines after it still count, and the desk's figures stay
finite, never negative and goodput within [0, 1]."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ito_assets.runtime.checkpoint import registry
from ito_assets.runtime.checkpoint.registry import CheckpointRecord
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import Event, EventKind
from ito_assets.runtime.record.goodput import summarize

WORKER_FILE = "events-attempt-0.jsonl"


def _step(step: int, *, at: float = 50.0, seconds: float = 10.0) -> Event:
    return Event(kind=EventKind.STEP, at=at, step=step, seconds=seconds)


def _log(folder: Path) -> None:
    """An allocation of 100 s (the supervisor's) and one 10 s step (rank 0's)."""
    events.append(folder, Event(kind=EventKind.ALLOCATION, at=100.0, seconds=100.0, num_devices=1))
    events.append(folder, _step(1), by_worker=True)


def _raw(folder: Path, data: bytes, name: str = WORKER_FILE) -> None:
    with open(folder / name, "ab") as handle:
        handle.write(data)


def _steps(folder: Path) -> list[int]:
    return [e.step for e in events.read(folder) if e.kind is EventKind.STEP]


def _assert_sane(folder: Path) -> None:
    row = summarize(events.read(folder)).as_row()
    assert all(math.isfinite(v) and v >= 0 for v in row.values()), row
    assert 0.0 <= row["goodput"] <= 1.0


# --- a bad line is skipped alone ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", [
    b"\xff\xfe not utf-8",
    b"\x00" * 64,
    b"[" * 100_000,  # nesting deeper than the decoder's recursion
    b'"a string, not an object"',
    json.dumps({"kind": "step", "at": "yesterday", "step": 3, "seconds": 1.0}).encode(),
    json.dumps({"kind": "step", "at": 60.0, "step": "3", "seconds": 1.0}).encode(),
    json.dumps({"kind": "step", "at": 60.0, "step": True, "seconds": 1.0}).encode(),
    b'{"kind": "step", "at": 60.0, "step": 3, "seconds": NaN}',
    b'{"kind": "step", "at": 60.0, "step": 3, "seconds": Infinity}',
    b'{"kind": "step", "at": NaN, "step": 3, "seconds": 1.0}',
    b'{"kind": "allocation", "at": 60.0, "seconds": Infinity, "num_devices": 1}',
])
def test_a_bad_event_line_is_skipped_and_the_good_line_after_it_is_kept(tmp_path, bad):
    _log(tmp_path)
    _raw(tmp_path, bad + b"\n" + _step(2, at=60.0).to_json().encode() + b"\n")
    assert _steps(tmp_path) == [1, 2]
    _assert_sane(tmp_path)


def test_a_step_given_as_text_does_not_stop_the_figures(tmp_path):
    _log(tmp_path)
    _raw(tmp_path, json.dumps({"kind": "step", "at": 60.0, "step": "3", "seconds": 1.0}).encode() + b"\n")
    events.append(tmp_path, Event(kind=EventKind.RESUME, at=70.0, attempt=1, step=0), by_worker=True)
    assert summarize(events.read(tmp_path)).num_wasted_steps == 1


def test_a_diverged_steps_nan_loss_is_still_read(tmp_path):
    _log(tmp_path)
    events.append(tmp_path, Event(kind=EventKind.STEP, at=60.0, step=2, seconds=1.0, loss=float("nan")),
                  by_worker=True)
    assert _steps(tmp_path) == [1, 2]


# --- the registry ----------------------------------------------------------------------------------


def _record(step: int) -> CheckpointRecord:
    return CheckpointRecord(step=step, path=f"/x/step-{step:09d}", num_bytes=10, blocking_seconds=0.5,
                            total_seconds=1.0, metadata_sha256="a" * 64, completed_at=1.0)


@pytest.mark.parametrize("bad", [
    b"\xff\xfe not utf-8",
    b"[" * 100_000,
    b"[]",
    json.dumps({**json.loads(_record(7).to_json()), "step": -1}).encode(),
    json.dumps({**json.loads(_record(7).to_json()), "num_bytes": 0}).encode(),
    json.dumps({**json.loads(_record(7).to_json()), "unknown": 1}).encode(),
    json.dumps({**json.loads(_record(7).to_json()), "step": "7"}).encode(),
    json.dumps({**json.loads(_record(7).to_json()), "total_seconds": float("inf")}).encode(),
])
def test_a_bad_registry_line_is_skipped_and_the_records_after_it_are_kept(tmp_path, bad):
    registry.append(tmp_path, _record(5))
    _raw(tmp_path, bad + b"\n", registry.REGISTRY_NAME)
    registry.append(tmp_path, _record(10))
    assert [r.step for r in registry.read(tmp_path)] == [5, 10]


# --- goodput when the allocation is short of what the log accounts for ---------------------------------


def test_a_wall_clock_set_back_never_gives_goodput_above_one_or_a_negative_bucket(tmp_path):
    """The supervisor's allocation is wall-clock seconds; set back by an hour while it ran, it
    holds fewer seconds than the steps it saw."""
    _log(tmp_path)
    events.append(tmp_path, _step(2, at=60.0, seconds=500.0), by_worker=True)
    figures = summarize(events.read(tmp_path))
    assert figures.goodput == 1.0 and figures.other_seconds == 0.0
    assert figures.allocated_seconds == figures.productive_seconds == 510.0
    assert figures.device_hours == pytest.approx(510.0 / 3600)
    _assert_sane(tmp_path)


def test_a_stage_whose_supervisor_died_before_its_allocation_has_no_negative_bucket(tmp_path):
    events.append(tmp_path, _step(1), by_worker=True)
    events.append(tmp_path, Event(kind=EventKind.CHECKPOINT, at=55.0, step=1, seconds=2.0, total_seconds=3.0,
                                  num_bytes=8), by_worker=True)
    figures = summarize(events.read(tmp_path))
    assert figures.allocated_seconds == 12.0 and figures.other_seconds == 0.0
    _assert_sane(tmp_path)
