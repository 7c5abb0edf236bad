"""Worker heartbeats: one small JSON file per rank, rewritten atomically after every step.

A heartbeat says which process (pid, attempt) reached which step at what time. The supervisor
reads them to notice a hung worker (a heartbeat older than the bound while the process lives) and
to know which processes to terminate. Files, not sockets: they survive the worker, cost one
rename per step, and work the same under torchrun, Pipes or a cluster's shared filesystem.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ito_assets.runtime.record.storage import write_atomic

# Writing more often than this buys nothing: the hang bound is minutes (seconds in tests).
MIN_INTERVAL_SECONDS = 0.2
STORAGE_FAILED = "storage_failed"


@dataclass(frozen=True, kw_only=True)
class Heartbeat:
    rank: int
    pid: int
    attempt: int
    step: int  # the last step finished; -1 before the first
    # "starting", "training", "checkpointing", "evaluating", "awaiting_desk", "finished", "stopped",
    # or STORAGE_FAILED (the last save could not be written; `detail` holds the storage's code)
    phase: str
    at: float  # Unix seconds
    detail: str = ""

    def __post_init__(self) -> None:
        if self.rank < 0 or self.pid <= 0 or self.attempt < 0:
            raise ValueError("rank and attempt must be >= 0 and pid positive")


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
        try:
            beat = Heartbeat(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # replaced while reading; the next poll sees the new one
        if attempt is None or beat.attempt == attempt:
            beats[beat.rank] = beat
    return beats


def clear(folder: Path) -> None:
    for path in folder.glob("rank*.json"):
        path.unlink(missing_ok=True)
