"""One writer per event file: the supervisor's `events.jsonl`, and one file per attempt for that
attempt's rank 0; `read` merges them in time order and still reads a folder written as one file."""

from __future__ import annotations

from pathlib import Path

from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import Event, EventKind


def _step(attempt: int, step: int, at: float) -> Event:
    return Event(kind=EventKind.STEP, at=at, attempt=attempt, step=step, seconds=1.0, loss=2.0)


def test_the_supervisor_and_each_attempts_rank_zero_write_files_of_their_own(tmp_path: Path):
    events.append(tmp_path, _step(0, 1, 10.0), by_worker=True)
    events.append(tmp_path, Event(kind=EventKind.INTERRUPTION, at=11.0, attempt=0, planned=False, seconds=0.5))
    events.append(tmp_path, _step(1, 1, 12.0), by_worker=True)
    events.append(tmp_path, Event(kind=EventKind.RECOVERY, at=12.5, attempt=1, seconds=1.5))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events-attempt-0.jsonl", "events-attempt-1.jsonl", "events.jsonl"]
    assert [(e.kind, e.attempt) for e in events.read(tmp_path)] == [
        (EventKind.STEP, 0), (EventKind.INTERRUPTION, 0), (EventKind.STEP, 1), (EventKind.RECOVERY, 1)]


def test_attempts_past_nine_are_read_and_in_time_order(tmp_path: Path):
    for attempt in (10, 2):
        events.append(tmp_path, _step(attempt, 1, float(attempt)), by_worker=True)
    assert [e.attempt for e in events.read(tmp_path)] == [2, 10]


def test_equal_times_keep_the_supervisor_first_then_attempts_in_order(tmp_path: Path):
    events.append(tmp_path, _step(1, 1, 5.0), by_worker=True)
    events.append(tmp_path, _step(0, 1, 5.0), by_worker=True)
    events.append(tmp_path, Event(kind=EventKind.ALLOCATION, at=5.0, attempt=1, seconds=9.0, num_devices=2))
    assert [(e.kind, e.attempt) for e in events.read(tmp_path)] == [
        (EventKind.ALLOCATION, 1), (EventKind.STEP, 0), (EventKind.STEP, 1)]


def test_a_torn_line_loses_only_itself(tmp_path: Path):
    events.append(tmp_path, _step(0, 1, 1.0), by_worker=True)
    with open(tmp_path / "events-attempt-0.jsonl", "a") as log:
        log.write('{"kind": "step", "at": 2.0, "att')  # killed mid-append
    events.append(tmp_path, Event(kind=EventKind.INTERRUPTION, at=3.0, attempt=0, planned=False))
    assert [e.kind for e in events.read(tmp_path)] == [EventKind.STEP, EventKind.INTERRUPTION]


def test_a_folder_written_as_one_file_still_reads(tmp_path: Path):
    events.append(tmp_path, _step(0, 1, 1.0))  # the supervisor's file, as every writer used it before
    events.append(tmp_path, _step(0, 2, 2.0))
    assert [e.step for e in events.read(tmp_path)] == [1, 2]


def test_unrelated_files_are_not_events(tmp_path: Path):
    events.append(tmp_path, _step(0, 1, 1.0), by_worker=True)
    (tmp_path / "events-attempt-x.jsonl.tmp").write_text("not an event\n")
    (tmp_path / "events-attempt-x.jsonl").write_text(_step(0, 2, 2.0).to_json() + "\n")  # no attempt number
    (tmp_path / "events-attempt-notes.txt").write_text("not an event\n")
    assert len(events.read(tmp_path)) == 1
