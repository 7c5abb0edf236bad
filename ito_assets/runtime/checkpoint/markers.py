"""Completion markers: how a resume tells a whole checkpoint from a partial or corrupt one.

A DCP checkpoint is a folder of `.distcp` shards plus a `.metadata` file that rank 0 writes last.
After the asynchronous save has finished, rank 0 writes `COMPLETE.json` atomically: the step, the
sha256 of `.metadata`, the size and digest of every file, the name of the digest's algorithm
(`file_digest`; a marker without one is sha256, as every marker was before it was named), and the
sha256 of that file list (`manifest_sha256`). The shards' digests are the ones each rank computed
while writing them (`digest_writer`); only `.metadata`, and any file no writer reported, is read
back. A folder is trusted only when that marker exists and every digest still matches (the
datatrove habit of completion markers, with the digests added because a marker alone does not
catch a flipped byte). The marker also names its owner, the run and stage that wrote it: a folder
copied or moved in from another run or stage is whole by its own digests but is not this stage's,
and neither is a folder or file that is a symbolic link (no writer makes one; it points elsewhere).

Verification hashes the files on a pool of threads (`first_mismatch`); `resume` splits them
among the ranks (`shares`) and agrees on the first bad one, so every rank gives the same answer.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ito_assets.digests import file_sha256
from ito_assets.runtime.checkpoint.file_digest import ALGORITHMS, FILE_DIGEST, LEGACY, FileDigest, file_digest
from ito_assets.runtime.record.storage import read_regular_file, write_atomic

MARKER_NAME = "COMPLETE.json"
METADATA_NAME = ".metadata"
_DIR_PATTERN = re.compile(r"step-([0-9]{9})")  # ASCII digits, the whole name (fullmatch)
# A marker lists a few files per rank and the spike detector's window: far below this. A larger
# file is not one (a planted or runaway file must not be read whole into memory).
MAX_MARKER_BYTES = 64 << 20
# Threads that hash one rank's files: bounded, as eight ranks of a node share its cores and its reads.
VERIFY_THREADS = min(8, os.cpu_count() or 1)


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


def manifest_sha256(files: Iterable[tuple[str, int, str]]) -> str:
    """The sha256 of the file list as canonical JSON: one value that names the whole payload."""
    text = json.dumps([list(f) for f in files], separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class Marker:
    step: int
    metadata_sha256: str
    files: tuple[tuple[str, int, str], ...]  # (name, size, digest under `algorithm`)
    trained_with: dict | None = None  # the layout and positions that trained it (`StageWorker.trained_with`)
    spike_history: dict | None = None  # the spike detector's values at this step (`SpikeDetector.state`)
    algorithm: str = LEGACY  # of the files' digests
    manifest_sha256: str | None = None  # None in a marker written before it was recorded
    owner: dict | None = None  # {"run_key", "stage"} that wrote it; None in a marker from before it was recorded

    @property
    def num_bytes(self) -> int:
        return sum(size for _, size, _ in self.files)


def _entry(path: Path, streamed: FileDigest | None) -> tuple[str, int, str]:
    size = path.stat().st_size
    if streamed is None:
        return path.name, size, file_digest(path, FILE_DIGEST)
    if streamed.size != size:
        raise RuntimeError(f"{path.name} holds {size} bytes but its writer wrote {streamed.size}")
    return path.name, size, streamed.digest


def write_marker(folder: Path, step: int, *, streamed: Sequence[FileDigest] = (), trained_with: dict | None = None,
                 spike_history: dict | None = None, owner: dict | None = None) -> Marker:
    """Write the marker last (atomic rename), with the digests the writers `streamed` and the
    other payload files hashed here, and what trained the weights (a resume under another layout
    reshards them: DCP)."""
    if not (folder / METADATA_NAME).is_file():
        raise RuntimeError("a finished DCP save has a .metadata file; this folder has none")
    by_name = {d.name: d for d in streamed}
    paths = _payload_files(folder)
    missing = sorted(set(by_name) - {p.name for p in paths})
    if missing:
        raise RuntimeError(f"written but not in the folder: {', '.join(missing)}")
    files = tuple(_entry(p, by_name.get(p.name)) for p in paths)
    marker = Marker(step=step, metadata_sha256=file_sha256(folder / METADATA_NAME), files=files,
                    trained_with=trained_with, spike_history=spike_history, algorithm=FILE_DIGEST,
                    manifest_sha256=manifest_sha256(files), owner=owner)
    write_atomic(folder / MARKER_NAME, json.dumps(_body(marker), sort_keys=True).encode())
    return marker


def _body(marker: Marker) -> dict:
    body = {"step": marker.step, "metadata_sha256": marker.metadata_sha256, "files": [list(f) for f in marker.files],
            "file_digest": marker.algorithm, "manifest_sha256": marker.manifest_sha256}
    for key, value in (("trained_with", marker.trained_with), ("spike_history", marker.spike_history),
                       ("owner", marker.owner)):
        if value is not None:
            body[key] = value
    return body


def _marker_text(folder: Path) -> str:
    """The marker's text, read only from a regular file of a marker's size: never through a link,
    never from a FIFO or device (an open or read that would block the resume for ever)."""
    data = read_regular_file(folder / MARKER_NAME, MAX_MARKER_BYTES)
    if data is None:
        raise ValueError("not a marker file")
    return data.decode()


def read_marker(folder: Path) -> Marker | None:
    """The folder's marker, or None when it has none that can be read: any malformed content
    (deep nesting, an infinite number, a wrong type) is a missing marker, never an exception."""
    try:
        body = json.loads(_marker_text(folder))
        manifest = body.get("manifest_sha256")
        return Marker(step=int(body["step"]), metadata_sha256=str(body["metadata_sha256"]),
                      files=tuple((str(n), int(s), str(d)) for n, s, d in body["files"]),
                      trained_with=_dict_or_none(body.get("trained_with")),
                      spike_history=_dict_or_none(body.get("spike_history")),
                      algorithm=str(body.get("file_digest", LEGACY)),
                      manifest_sha256=None if manifest is None else str(manifest),
                      owner=_dict_or_none(body.get("owner")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError):
        return None


def _dict_or_none(value: object) -> dict | None:
    return value if isinstance(value, dict) else None


def owned_by(marker: Marker, owner: dict | None) -> bool:
    """Whether `marker` may be this `owner`'s (None: any). A marker from before owners were
    recorded names none and is taken, as such markers were."""
    return owner is None or marker.owner is None or marker.owner == owner


def _has_link(folder: Path) -> bool:
    return folder.is_symlink() or any(p.is_symlink() for p in folder.iterdir())


# The parts of a marker's `trained_with` a checkpoint must share with the attempt that resumes it:
# its data order (a position counts global batches of one size, in one seed's order). The layout
# and the positions may differ (DCP reshards; a stage's positions are its own).
RESUME_TERMS = ("data_order",)


def resume_terms(trained_with: dict | None) -> dict | None:
    """What of `trained_with` a checkpoint must share to be resumed, or pruned as this attempt's."""
    terms = {key: trained_with[key] for key in RESUME_TERMS if key in (trained_with or {})}
    return terms or None


def _trained_otherwise(marker: Marker, expected: dict | None) -> str | None:
    """The first of `expected`'s entries the marker's `trained_with` names with another value."""
    recorded = marker.trained_with or {}
    return next((key for key, value in (expected or {}).items() if key in recorded and recorded[key] != value), None)


def precheck(folder: Path, owner: dict | None = None,
             trained_with: dict | None = None) -> tuple[Marker | None, str | None]:
    """Everything but the digests: (the marker, None) when the files may be hashed, else (None, why not).
    `owner`: the run and stage resuming ({"run_key", "stage"}), refusing another's checkpoint;
    `trained_with`: entries its marker's `trained_with` must hold alike where it names them (a
    marker from before one was recorded is taken, as owners are)."""
    try:
        if _has_link(folder):
            return None, "a symbolic link in place of the folder or one of its files"
    except OSError:
        return None, "the folder cannot be listed"
    marker = read_marker(folder)
    if marker is None:
        return None, "no completion marker (partial save)"
    if marker.step != step_of(folder):
        return None, "the marker names another step"
    if not owned_by(marker, owner):
        return None, "the marker names another run or stage"
    if (differs := _trained_otherwise(marker, trained_with)) is not None:
        return None, f"written with another {differs}: {marker.trained_with[differs]}, this attempt's {trained_with[differs]}"
    if marker.algorithm not in ALGORITHMS:
        return None, f"the marker's file digest {marker.algorithm!r} is not known here"
    if marker.manifest_sha256 is not None and marker.manifest_sha256 != manifest_sha256(marker.files):
        return None, "the marker's file list does not match its manifest digest"
    if {p.name for p in _payload_files(folder)} != {name for name, _, _ in marker.files}:
        return None, "files differ from the marker's list"
    return marker, None


def intact(folder: Path, owner: dict | None = None, trained_with: dict | None = None) -> bool:
    """Whole by everything but the digests: the marker's checks (`precheck`) and every listed file's
    size. Cheap enough for every prune, and a marker that lies about its folder (another step, a
    shard missing, extra or cut short) fails it."""
    marker, _ = precheck(folder, owner, trained_with)
    if marker is None:
        return False
    try:
        return all((folder / name).stat().st_size == size for name, size, _ in marker.files)
    except OSError:
        return False


def _matches(folder: Path, marker: Marker, index: int) -> bool:
    name, size, digest = marker.files[index]
    path = folder / name
    try:
        return path.stat().st_size == size and file_digest(path, marker.algorithm) == digest
    except OSError:  # gone or unreadable since the listing: not whole either
        return False


def first_mismatch(folder: Path, marker: Marker, indices: Sequence[int], *, threads: int = VERIFY_THREADS) -> int | None:
    """The lowest index among `indices` whose file does not match the marker, or None; the
    files are hashed on up to `threads` threads (hashlib and xxhash drop the GIL while hashing)."""
    if not indices:
        return None
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(indices)))) as pool:
        matches = list(pool.map(lambda i: _matches(folder, marker, i), indices))
    return min((i for i, ok in zip(indices, matches) if not ok), default=None)


def mismatch_reason(marker: Marker, index: int) -> str:
    return f"digest mismatch in {marker.files[index][0]}"


def shares(marker: Marker, count: int) -> list[list[int]]:
    """The marker's file indices split among `count` verifiers, balanced by bytes (largest file
    first, to the least loaded verifier, ties to the lowest): the same split on every rank."""
    loads = [(0, verifier) for verifier in range(count)]  # a heap: (bytes so far, verifier)
    split: list[list[int]] = [[] for _ in range(count)]
    for index in sorted(range(len(marker.files)), key=lambda i: (-marker.files[i][1], i)):
        load, verifier = heapq.heappop(loads)
        split[verifier].append(index)
        heapq.heappush(loads, (load + marker.files[index][1], verifier))
    return [sorted(indices) for indices in split]


def validate(folder: Path, *, threads: int = VERIFY_THREADS, owner: dict | None = None,
             trained_with: dict | None = None) -> str | None:
    """None when the checkpoint is whole (and `owner`'s); otherwise why it must be skipped (one process, every file)."""
    marker, reason = precheck(folder, owner, trained_with)
    if marker is None:
        return reason
    index = first_mismatch(folder, marker, range(len(marker.files)), threads=threads)
    return None if index is None else mismatch_reason(marker, index)


def candidates(stage_dir: Path) -> list[Path]:
    """Checkpoint folders of the stage, newest first."""
    if not stage_dir.is_dir():
        return []
    found = [p for p in stage_dir.iterdir() if p.is_dir() and step_of(p) is not None]
    return sorted(found, key=step_of, reverse=True)
