"""The checkpoint registry: one JSON line per finished checkpoint of a stage (`registry.jsonl`).

A record is appended by rank 0 only after the checkpoint's completion marker is on disk, so every
line names a checkpoint that was whole when written. A kill between the two (the marker is written
on the save's thread, the record at the training thread's next poll) leaves a whole checkpoint
without a record: the attempt that resumes from it lists it from its marker (`list_from_marker`).
Pruning and corruption are judged from the folder itself (`markers.validate`), never from this
list: the registry is what `ito checkpoints` and the desk read; the marker is what a resume trusts.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ito_assets.runtime.checkpoint.markers import MARKER_NAME, Marker
from ito_assets.runtime.record.storage import append_line, json_lines

REGISTRY_NAME = "registry.jsonl"


@dataclass(frozen=True, kw_only=True)
class CheckpointRecord:
    step: int
    path: str
    num_bytes: int
    blocking_seconds: float  # training stopped for this long (staging, planning, waiting)
    total_seconds: float  # from the save call to the completion marker
    metadata_sha256: str  # sha256 of the checkpoint's DCP `.metadata` file
    completed_at: float  # Unix seconds

    def __post_init__(self) -> None:
        if not isinstance(self.step, int) or self.step < 0:
            raise ValueError("step must be an integer >= 0")
        if not all(math.isfinite(v) for v in (self.blocking_seconds, self.total_seconds, self.completed_at)):
            raise ValueError("seconds and completed_at must be finite")
        if self.num_bytes <= 0:
            raise ValueError("num_bytes must be positive")
        if self.blocking_seconds < 0 or self.total_seconds < self.blocking_seconds:
            raise ValueError("total_seconds must be >= blocking_seconds >= 0")
        if len(self.metadata_sha256) != 64:
            raise ValueError("metadata_sha256 must be 64 hex digits")

    @property
    def bandwidth_bytes_per_second(self) -> float:
        """Bytes over the whole save (staging, writing, hashing): what the desk can plan on."""
        return self.num_bytes / self.total_seconds if self.total_seconds > 0 else float("inf")

    def to_json(self) -> str:
        # A record listed from its marker has no seconds: null, not the non-standard `Infinity`.
        bandwidth = self.bandwidth_bytes_per_second if self.total_seconds > 0 else None
        return json.dumps({**asdict(self), "bandwidth_bytes_per_second": bandwidth}, sort_keys=True)


def append(directory: Path, record: CheckpointRecord) -> None:
    append_line(directory / REGISTRY_NAME, record.to_json())


def read(directory: Path) -> list[CheckpointRecord]:
    """Every record of the stage folder, in the order written; a line that is no record (cut short
    by a kill during the append, or written by hand) is skipped, and the lines after it still count."""
    path = directory / REGISTRY_NAME
    if not path.exists():
        return []
    records = []
    for fields in json_lines(path):
        fields.pop("bandwidth_bytes_per_second", None)
        try:
            records.append(CheckpointRecord(**fields))
        except (ValueError, TypeError):
            continue
    return records


def list_from_marker(directory: Path, folder: Path, marker: Marker) -> CheckpointRecord | None:
    """Append the record of the whole checkpoint in `folder` unless the registry's last record of
    that folder already names its bytes (`metadata_sha256`); returns the record appended, or None.
    Its seconds only the killed attempt knew: 0 (no bandwidth to plan on); its completion is the
    marker's time."""
    path = str(folder)
    listed = [record for record in read(directory) if record.path == path]
    if listed and listed[-1].metadata_sha256 == marker.metadata_sha256:
        return None
    record = CheckpointRecord(step=marker.step, path=path, num_bytes=marker.num_bytes, blocking_seconds=0.0,
                              total_seconds=0.0, metadata_sha256=marker.metadata_sha256,
                              completed_at=(folder / MARKER_NAME).stat().st_mtime)
    append(directory, record)
    return record
