"""The runtime event log: what happened to a stage, one JSON line per event.

The supervisor appends the allocation, each interruption, each recovery and each of the desk's
spike restarts it applies or follows (`rewind`) to `events.jsonl`;
rank 0 of attempt N appends its steps, checkpoints, evaluations, start-up and where it resumed to
`events-attempt-N.jsonl`. One writer per file: on shared storage (NFS, a cluster volume) appends
from two hosts to one file are not atomic, and an attempt's rank that outlives its end (a pod
still terminating) never writes into the next attempt's file. `read` merges them in time order.
Telemetry is computed from this log alone (`goodput.summarize`), so the desk's figures can be
recomputed by anyone who has the files.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ito_assets.runtime.record.storage import append_line, json_lines

EVENTS_NAME = "events.jsonl"  # the supervisor's
_WORKER_EVENTS = "events-attempt-{attempt}.jsonl"  # rank 0 of one attempt's
# Where replica group i > 0 of a stage keeps its own log (group 0's is the stage folder's).
_REPLICA_FOLDER = "replica-{replica_id}"


class EventKind(str, enum.Enum):
    ALLOCATION = "allocation"  # seconds: wall time the devices were held; num_devices
    STARTUP = "startup"  # seconds: process launch to the first step (per attempt); num_devices: the attempt's
    RESUME = "resume"  # step: the checkpoint an attempt resumed from (-1: fresh start)
    STEP = "step"  # step, seconds, loss, metrics: one optimizer step (detail NOT_APPLIED: its update was dropped)
    CHECKPOINT = "checkpoint"  # step, seconds (training-blocking), total_seconds, num_bytes
    EVALUATION = "evaluation"  # seconds: the stage's eval battery
    INTERRUPTION = "interruption"  # planned, seconds (detection: last sign of life to detection)
    RECOVERY = "recovery"  # seconds: detection to the first step of the next attempt
    # step, attempt, detail: the desk's spike restart (proposal `detail`) set the checkpoints after
    # `step` aside; attempt `attempt` is the first on the rewound lineage
    REWIND = "rewind"


# A step whose loss or gradient was not finite: its update was not applied, its time is wasted.
NOT_APPLIED = "not applied: loss or gradient not finite"


@dataclass(frozen=True, kw_only=True)
class Event:
    kind: EventKind
    at: float  # Unix seconds
    attempt: int = 0
    step: int | None = None
    seconds: float = 0.0
    total_seconds: float = 0.0
    num_bytes: int = 0
    num_devices: int = 0
    planned: bool | None = None
    loss: float | None = None
    # A step's figures beyond its loss, where the objective has them (DPO's accuracy and margin).
    metrics: dict[str, float] | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", EventKind(self.kind))
        if self.seconds < 0 or self.total_seconds < 0 or self.num_bytes < 0 or self.attempt < 0:
            raise ValueError("seconds, total_seconds, num_bytes and attempt must be >= 0")
        if self.kind in (EventKind.STEP, EventKind.CHECKPOINT, EventKind.RESUME, EventKind.REWIND) and self.step is None:
            raise ValueError(f"a {self.kind.value} event needs a step")
        if self.kind is EventKind.ALLOCATION and self.num_devices < 1:
            raise ValueError("an allocation event needs num_devices >= 1")
        if self.kind is EventKind.INTERRUPTION and self.planned is None:
            raise ValueError("an interruption event must say whether it was planned")

    def to_json(self) -> str:
        body = {**asdict(self), "kind": self.kind.value}
        if body["metrics"] is None:  # most events: the line stays as it was
            del body["metrics"]
        return json.dumps(body, sort_keys=True)


def append(folder: Path, event: Event, *, by_worker: bool = False) -> None:
    """`by_worker`: rank 0 of `event.attempt` writes it (its own file); otherwise the supervisor."""
    name = _WORKER_EVENTS.format(attempt=event.attempt) if by_worker else EVENTS_NAME
    # Step events are many and cheap to lose on a machine crash; the rest are fsynced.
    append_line(folder / name, event.to_json(), durable=event.kind is not EventKind.STEP)


def read(folder: Path) -> list[Event]:
    """Every event of the stage folder, in time order (a stable sort: each file keeps its order)."""
    workers = {_attempt_of(p): p for p in folder.glob(_WORKER_EVENTS.format(attempt="*"))}
    workers.pop(None, None)  # not an attempt's file
    paths = [folder / EVENTS_NAME, *(workers[n] for n in sorted(workers))]
    found = [event for path in paths if path.is_file() for event in _read_file(path)]
    return sorted(found, key=lambda e: e.at)


def replica_dir(stage_dir: Path, replica_id: int) -> Path:
    """Replica group `replica_id`'s folder: the stage folder for group 0."""
    return stage_dir if replica_id == 0 else stage_dir / _REPLICA_FOLDER.format(replica_id=replica_id)


def read_groups(stage_dir: Path) -> list[list[Event]]:
    """Each replica group's log, group 0's first (a stage without replica groups: one log). Each
    group numbers its attempts from 0, so its log is read, and summed up, alone."""
    groups = {_number(p.name, _REPLICA_FOLDER.format(replica_id="*")): p for p in stage_dir.glob(
        _REPLICA_FOLDER.format(replica_id="*")) if p.is_dir() and not p.is_symlink()}  # a link is not a group's own
    groups.pop(None, None)
    groups.pop(0, None)  # group 0 is the stage folder itself
    return [read(stage_dir), *(read(groups[n]) for n in sorted(groups))]


def _attempt_of(path: Path) -> int | None:
    return _number(path.name, _WORKER_EVENTS.format(attempt="*"))


def _number(name: str, pattern: str) -> int | None:
    """The integer that stands for `*` in `pattern` (one `*`), or None when `name` has another shape."""
    prefix, suffix = pattern.split("*")
    if not (name.startswith(prefix) and name.endswith(suffix)) or len(name) <= len(prefix) + len(suffix):
        return None
    digits = name[len(prefix):len(name) - len(suffix)]
    canonical = digits.isascii() and digits.isdigit() and str(int(digits)) == digits  # "01" is no one's
    return int(digits) if canonical else None


def _read_file(path: Path) -> list[Event]:
    """The file's events; a line that is not one (torn by a kill during the append, or written by
    hand) is skipped, and the lines after it still count."""
    found = []
    for fields in json_lines(path):
        try:
            event = Event(**fields)
        except (ValueError, TypeError):
            continue
        if _sane(event):
            found.append(event)
    return found


def _integer(value: object) -> bool:
    """An int the ledger's BIGINT columns hold: one past them (a step of 2**63) failed the whole
    stage's publication after its compute was spent."""
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _sane(event: Event) -> bool:
    """Every field of the type the figures sum and compare: one non-finite time or a step given as
    text would make goodput NaN or stop the sort. A loss may be NaN (a diverged step's)."""
    return (all(_finite(v) for v in (event.at, event.seconds, event.total_seconds))
            and all(_integer(v) for v in (event.attempt, event.num_bytes, event.num_devices)) and event.num_devices >= 0
            and (event.step is None or _integer(event.step))
            and (event.loss is None or isinstance(event.loss, (int, float)) and not isinstance(event.loss, bool))
            and (event.planned is None or isinstance(event.planned, bool))
            and (event.metrics is None or isinstance(event.metrics, dict)) and isinstance(event.detail, str))
