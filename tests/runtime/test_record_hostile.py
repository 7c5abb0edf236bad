"""The event log and the checkpoint registry read back after a killed writer, a full disk or a
hand edit: a bad line is skipped alone, the lines after it still count, and the desk's figures stay
finite, never negative and goodput within [0, 1]."""

from __future__ import annotations

import errno
import io
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ito_assets.errors import disk_full
from ito_assets.runtime.checkpoint import registry
from ito_assets.runtime.checkpoint.registry import CheckpointRecord
from ito_assets.runtime.record import events, storage
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


@pytest.mark.parametrize(("field", "value", "kept"), [
    ("step", 2**63 - 1, True), ("step", 2**63, False), ("step", -(2**63), True), ("step", -(2**63) - 1, False),
    ("attempt", 2**63, False), ("num_bytes", 2**64, False),
])
def test_an_integer_past_the_ledgers_64_bits_is_a_bad_line(tmp_path, field, value, kept):
    """The ledger's step and size columns are 64-bit: a line past them, kept, failed the stage's
    whole publication (every metric of it lost) after its compute was spent."""
    _log(tmp_path)
    line = {"kind": "step", "at": 60.0, "step": 3, "seconds": 1.0, field: value}
    _raw(tmp_path, json.dumps(line).encode() + b"\n" + _step(4, at=60.0).to_json().encode() + b"\n")
    assert _steps(tmp_path) == ([1, value, 4] if field == "step" and kept else [1, 4])


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


# --- a killed writer or a full disk mid-append ----------------------------------------------------------


def test_a_line_torn_by_a_killed_writer_does_not_swallow_the_next_append(tmp_path):
    _log(tmp_path)
    _raw(tmp_path, _step(2, at=55.0).to_json().encode()[:20])  # the writer died mid-line
    events.append(tmp_path, _step(3, at=60.0), by_worker=True)
    assert _steps(tmp_path) == [1, 3]


def _disk_fills_after(monkeypatch, count: int) -> None:
    """os.write takes `count` more bytes, returns short, then raises ENOSPC, as a filling disk does."""
    real, left = os.write, [count]

    def write(descriptor, data):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        taken = real(descriptor, bytes(data)[: left[0]])
        left[0] -= taken
        return taken
    monkeypatch.setattr(os, "write", write)


def test_an_append_cut_short_by_a_full_disk_raises_enospc_and_loses_no_later_line(tmp_path, monkeypatch):
    _log(tmp_path)
    with monkeypatch.context() as patch:
        _disk_fills_after(patch, 20)
        with pytest.raises(OSError) as raised:
            events.append(tmp_path, _step(2, at=55.0), by_worker=True)
    assert raised.value.errno == errno.ENOSPC and disk_full(raised.value)
    events.append(tmp_path, _step(3, at=60.0), by_worker=True)  # space again
    assert _steps(tmp_path) == [1, 3]


def test_an_append_past_the_file_size_limit_raises_and_the_next_line_is_read(tmp_path):
    """RLIMIT_FSIZE in a child: the kernel's own short write, then EFBIG."""
    script = textwrap.dedent(f"""
        import resource, signal
        from pathlib import Path
        from ito_assets.runtime.record import events
        from ito_assets.runtime.record.events import Event, EventKind
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        folder = Path({str(tmp_path)!r})
        step = lambda n: Event(kind=EventKind.STEP, at=float(n), step=n, seconds=1.0)
        events.append(folder, step(1), by_worker=True)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, ((folder / {WORKER_FILE!r}).stat().st_size + 20, hard))
        try:
            events.append(folder, step(2), by_worker=True)
            print("returned")
        except OSError as error:
            print("raised", error.errno)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        events.append(folder, step(3), by_worker=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["raised", str(errno.EFBIG)]
    assert _steps(tmp_path) == [1, 3]


def test_an_atomic_write_on_a_full_disk_leaves_neither_the_file_nor_its_temporary(tmp_path, monkeypatch):
    def no_space(descriptor):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError):
        storage.write_atomic(tmp_path / "result.json", b"{}")
    assert list(tmp_path.iterdir()) == []


def test_an_array_is_saved_straight_to_its_file_as_its_bytes_would_be(tmp_path):
    rows = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    buffer = io.BytesIO()
    np.save(buffer, rows)
    storage.write_atomic(tmp_path / "bytes.npy", buffer.getvalue())
    storage.write_atomic(tmp_path / "saved.npy", lambda handle: np.save(handle, rows))
    assert (tmp_path / "saved.npy").read_bytes() == (tmp_path / "bytes.npy").read_bytes()


def test_a_writer_that_fails_halfway_leaves_neither_the_file_nor_its_temporary(tmp_path):
    def halfway(handle):
        handle.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(OSError):
        storage.write_atomic(tmp_path / "rows.npy", halfway)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("size, read", [(0, True), (15, True), (16, True), (17, False)])
def test_a_small_file_is_read_whole_up_to_its_bound_and_not_past_it(tmp_path, size, read):
    (tmp_path / "beat.json").write_bytes(b"x" * size)
    assert storage.read_regular_file(tmp_path / "beat.json", 16) == (b"x" * size if read else None)


def test_what_is_no_regular_file_is_never_read(tmp_path):
    (tmp_path / "real.json").write_bytes(b"{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    (tmp_path / "folder.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")  # an open or a read of it would wait for a writer
    for name in ("link.json", "folder.json", "fifo.json", "gone.json"):
        assert storage.read_regular_file(tmp_path / name, 16) is None
    assert storage.read_regular_file(tmp_path / "real.json", 16) == b"{}"
