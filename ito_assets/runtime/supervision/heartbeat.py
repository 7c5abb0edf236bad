"""Worker heartbeats: one small JSON file per rank, rewritten atomically after every step.

A heartbeat says which process (pid, attempt) reached which step at what time. The supervisor
reads them to notice a hung worker (a heartbeat older than the bound while the process lives) and
to know which processes to terminate. Files, not sockets: they survive the worker, cost one
rename per step, and work the same under torchrun, Pipes or a cluster's shared filesystem.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ito_assets.runtime.record.storage import read_regular_file, write_atomic

# Writing more often than this buys nothing: the hang bound is minutes (seconds in tests).
MIN_INTERVAL_SECONDS = 0.2
STORAGE_FAILED = "storage_failed"
# A rank refused its inputs with a code no restart changes (`detail` holds it, one of REFUSAL_CODES):
# a changed eval suite, a reference table that is not finite, RLVR's priced draws spent (a
# restart would draw past the price).
REFUSED = "refused"
REFUSAL_CODES = ("EVAL_SUITE_MISMATCH", "POSTTRAINING_DATA_INVALID", "GENERATION_DRAWS_SPENT")
# Before training, a replica group's ranks, loaded and about to ask for their first quorum; every
# phase but "starting" says the worker got that far.
JOINING = "joining"
# A heartbeat is a few hundred bytes; a larger file is not one and is never read whole.
MAX_BYTES = 64 * 1024


@dataclass(frozen=True, kw_only=True)
class Heartbeat:
    rank: int
    pid: int
    attempt: int
    step: int  # the last step finished; -1 before the first
    # "starting", JOINING (replica groups), "training", "checkpointing", "evaluating", "awaiting_desk",
    # "finished", "stopped", STORAGE_FAILED (the last save could not be written; `detail` holds the
    # storage's code) or REFUSED (an input no restart changes; `detail` holds the code)
    phase: str
    at: float  # Unix seconds
    detail: str = ""

    def __post_init__(self) -> None:
        # A file is read back with these checks: a wrong type must fail here, not in the supervisor.
        if not all(_is_int(v) for v in (self.rank, self.pid, self.attempt, self.step)):
            raise TypeError("rank, pid, attempt and step must be integers")
        if not (isinstance(self.phase, str) and isinstance(self.detail, str)):
            raise TypeError("phase and detail must be strings")
        if isinstance(self.at, bool) or not isinstance(self.at, (int, float)) or not math.isfinite(self.at):
            raise ValueError("at must be a finite number of seconds")  # NaN would never look stale
        if self.rank < 0 or self.pid <= 0 or self.attempt < 0 or self.step < -1:
            raise ValueError("rank and attempt must be >= 0, pid positive and step >= -1")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def heartbeat_path(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.json"


class HeartbeatWriter:
    def __init__(self, folder: Path, *, rank: int, attempt: int):
        self.folder = folder
        self.rank = rank
        self.attempt = attempt
        self._last_written = 0.0
        folder.mkdir(parents=True, exist_ok=True)

    def beat(self, step: int, phase: str, *, force: bool = False, detail: str = "") -> None:
        now = time.time()
        if not force and now - self._last_written < MIN_INTERVAL_SECONDS:
            return
        beat = Heartbeat(rank=self.rank, pid=os.getpid(), attempt=self.attempt, step=step, phase=phase, at=now,
                         detail=detail)
        write_atomic(heartbeat_path(self.folder, self.rank), json.dumps(asdict(beat)).encode(), durable=False)
        self._last_written = now


def read_all(folder: Path, *, attempt: int | None = None) -> dict[int, Heartbeat]:
    """The latest heartbeat of every rank (of `attempt` when given), keyed by rank."""
    beats: dict[int, Heartbeat] = {}
    if not folder.is_dir():
        return beats
    for path in folder.glob("rank*.json"):
        beat = _read(path)
        if beat is not None and (attempt is None or beat.attempt == attempt):
            beats[beat.rank] = beat
    return beats


def _read(path: Path) -> Heartbeat | None:
    """The heartbeat in `path`, or None for anything a writer never leaves there: a link (it could
    speak for a file elsewhere), a FIFO or device (a read would block the supervisor's poll), a file
    too large to be one, JSON that is no heartbeat, or a beat whose rank is not its file's."""
    data = read_regular_file(path, MAX_BYTES)
    if data is None:
        return None  # replaced while reading, a link, a FIFO, too large: the next poll sees the new one
    try:
        beat = Heartbeat(**json.loads(data))
    except (ValueError, TypeError, RecursionError):
        return None
    return beat if path.name == heartbeat_path(path.parent, beat.rank).name else None


class Observer:
    """One attempt's heartbeats with their times on the reader's clock. A worker's clock may differ
    from the supervisor's (another node, a clock set back or forward): taken as written, a beat
    stamped in the future would never look stale and keep a hung rank alive, and one stamped in
    the past would look hung at once. The folder is cleared at each launch, so a beat first seen at
    one read was written after the read before it (the launch, for the first): its time is taken
    within that window, and an unchanged beat keeps the time it was first given.

    A rank in the "training" phase beats once a step: a beat that only renews its time at the same
    step (a step its replica group could not commit, tried again and again) is no progress, and keeps
    the time its step was first seen; the other phases' beats at one step are ticks of a long save,
    evaluation or wait for the desk, each a sign of life."""

    def __init__(self, folder: Path, *, attempt: int, since: float):
        self.folder, self.attempt = folder, attempt
        self._previous = since
        self._seen: dict[int, tuple[Heartbeat, float]] = {}

    def read(self, now: float) -> dict[int, Heartbeat]:
        beats: dict[int, Heartbeat] = {}
        for rank, beat in read_all(self.folder, attempt=self.attempt).items():
            seen, sign = self._seen.get(rank), _progress(beat)
            if seen is None or seen[0] != sign:
                seen = self._seen[rank] = (sign, min(max(beat.at, self._previous), now))
            beats[rank] = replace(beat, at=seen[1])
        self._previous = now
        return beats


def _progress(beat: Heartbeat) -> Heartbeat:
    """What a new beat must change to count as a sign of life (Observer)."""
    return replace(beat, at=0.0) if beat.phase == "training" else beat


def clear(folder: Path) -> None:
    for path in folder.glob("rank*.json"):
        path.unlink(missing_ok=True)
