"""Completion markers: how a resume tells a whole checkpoint from a partial or corrupt one.

A DCP checkpoint is a folder of `.distcp` shards plus a `.metadata` file that rank 0 writes last.
After the asynchronous save has finished, rank 0 writes `COMPLETE.json` atomically: the step, the
sha256 of `.metadata`, and the size and sha256 of every file. A folder is trusted only when that
marker exists and every digest still matches (the datatrove habit of completion markers, with the
digests added because a marker alone does not catch a flipped byte).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ito_assets.digests import file_sha256
from ito_assets.runtime.record.storage import write_atomic

MARKER_NAME = "COMPLETE.json"
METADATA_NAME = ".metadata"
_DIR_PATTERN = re.compile(r"step-([0-9]{9})")  # ASCII digits, the whole name (fullmatch)


def checkpoint_dir(stage_dir: Path, step: int) -> Path:
    return stage_dir / f"step-{step:09d}"


def step_of(path: Path) -> int | None:
    match = _DIR_PATTERN.fullmatch(path.name)
    return int(match.group(1)) if match else None


def _is_temporary(name: str) -> bool:
    """A writer's temporary sibling, never a payload: `.tmp...`, or `.NAME...tmp` as
    storage.write_atomic and DCP's own metadata writer (`.metadata.tmp`) name theirs."""
    return name.startswith(".tmp") or (name.startswith(".") and name.endswith(".tmp"))


def _payload_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name != MARKER_NAME and not _is_temporary(p.name))


@dataclass(frozen=True, kw_only=True)
class Marker:
    step: int
    metadata_sha256: str
    files: tuple[tuple[str, int, str], ...]  # (name, size, sha256)
    trained_with: dict | None = None  # the layout and positions that trained it (`StageWorker.trained_with`)
    spike_history: dict | None = None  # the spike detector's values at this step (`SpikeDetector.state`)

    @property
    def num_bytes(self) -> int:
        return sum(size for _, size, _ in self.files)


def write_marker(folder: Path, step: int, *, trained_with: dict | None = None,
                 spike_history: dict | None = None) -> Marker:
    """Hash every file of a finished save and write the marker last (atomic rename), with what
    trained the weights (a resume under another layout reshards them: DCP)."""
    files = tuple((p.name, p.stat().st_size, file_sha256(p)) for p in _payload_files(folder))
    metadata = next((digest for name, _, digest in files if name == METADATA_NAME), None)
    if metadata is None:
        raise RuntimeError("a finished DCP save has a .metadata file; this folder has none")
    marker = Marker(step=step, metadata_sha256=metadata, files=files, trained_with=trained_with,
                    spike_history=spike_history)
    body = {"step": step, "metadata_sha256": metadata, "files": [list(f) for f in files]}
    for key, value in (("trained_with", trained_with), ("spike_history", spike_history)):
        if value is not None:
            body[key] = value
    write_atomic(folder / MARKER_NAME, json.dumps(body, sort_keys=True).encode())
    return marker


def read_marker(folder: Path) -> Marker | None:
    try:
        body = json.loads((folder / MARKER_NAME).read_text())
        return Marker(step=int(body["step"]), metadata_sha256=str(body["metadata_sha256"]),
                      files=tuple((str(n), int(s), str(d)) for n, s, d in body["files"]),
                      trained_with=_dict_or_none(body.get("trained_with")),
                      spike_history=_dict_or_none(body.get("spike_history")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _dict_or_none(value: object) -> dict | None:
    return value if isinstance(value, dict) else None


def validate(folder: Path) -> str | None:
    """None when the checkpoint is whole; otherwise why it must be skipped."""
    marker = read_marker(folder)
    if marker is None:
        return "no completion marker (partial save)"
    if marker.step != step_of(folder):
        return "the marker names another step"
    present = {p.name for p in _payload_files(folder)}
    if present != {name for name, _, _ in marker.files}:
        return "files differ from the marker's list"
    for name, size, digest in marker.files:
        path = folder / name
        if path.stat().st_size != size or file_sha256(path) != digest:
            return f"digest mismatch in {name}"
    return None


def candidates(stage_dir: Path) -> list[Path]:
    """Checkpoint folders of the stage, newest first."""
    if not stage_dir.is_dir():
        return []
    found = [p for p in stage_dir.iterdir() if p.is_dir() and step_of(p) is not None]
    return sorted(found, key=step_of, reverse=True)
