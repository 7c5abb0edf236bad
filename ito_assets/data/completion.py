"""Completion markers for a phase's work units: a rerun of a failed or killed step redoes only the
units that did not finish, on either engine.

A unit's marker is written by the step's process when the unit's result comes back (results come
back in unit order, so after a failure the markers are the units before the first failed one).
It holds the unit's key, the SHA-256 of every file the unit wrote, and its result. The key digests
what the unit was asked to do: the function, the task's own parameters (`task.key()`) and the
SHA-256 of every file the task reads. A result is kept as plain data (JSON numbers, Parquet frames
beside the marker), never pickled, so a tampered folder cannot run code.

On the rerun a unit is skipped only when its marker's key is the key of the task asked now and
every file it wrote still has the bytes it wrote. Everything else in the phase's folder (files of
a unit that did not finish, of a changed task, of a unit that no longer exists) is removed before
the phase starts, so no stale file outlives its unit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import polars as pl

from ito_assets.digests import file_sha256

LOGGER = logging.getLogger("ito_assets.progress")
MARKER = "marker-{:05d}.json"
MARKERS = "marker-*.json"
RESULT_FRAME = "result-{:05d}-{}.parquet"


class ResumableTask(Protocol):
    def key(self) -> dict:
        """The task's parameters (JSON), besides the contents of the files it reads."""
        ...

    def inputs(self) -> tuple[str, ...]:
        """The files the task reads."""
        ...

    def outputs(self) -> tuple[str, ...]:
        """The files the task writes, all in the phase's folder."""
        ...


def frame_digest(frame: pl.DataFrame) -> str:
    """SHA-256 of a frame's values, whatever its chunks (two equal frames can differ in IPC bytes)."""
    digest = hashlib.sha256()
    for column in frame.get_columns():
        digest.update(f"{column.name}:{column.dtype}:{column.len()}\n".encode())
        digest.update(column.is_null().to_numpy().tobytes())
        if column.dtype.is_numeric():
            digest.update(column.fill_null(0).to_numpy().tobytes())
        else:
            text = column.cast(pl.String).fill_null("")
            digest.update(text.str.len_bytes().to_numpy().tobytes())
            digest.update("".join(text.to_list()).encode())
    return digest.hexdigest()


def task_key(function: Callable, task: ResumableTask, known: Mapping[str, str] | None = None) -> str:
    """`known`: {path: SHA-256} of inputs whose bytes were already hashed (source shards verified by
    the step, outputs an earlier phase's workers hashed as they wrote them): taken as they are,
    so that the step does not read a corpus again only to mark its tasks."""
    known = known or {}
    body = {
        "function": f"{function.__module__}.{function.__qualname__}",
        "task": task.key(),
        "inputs": [known.get(str(path)) or file_sha256(path) for path in task.inputs()],
        "outputs": [Path(path).name for path in task.outputs()],
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Checked:
    """A task and its function, run by `run_checked` in a worker (a top-level function, so that
    both a process pool and Ray can ship it)."""

    function: Callable
    task: ResumableTask


def run_checked(checked: Checked) -> tuple[Any, dict[str, str]]:
    """-> (the function's result, SHA-256 of each file the task wrote): the outputs are hashed by
    the worker that wrote them, in parallel, while they are still in its page cache."""
    result = checked.function(checked.task)
    return result, {Path(path).name: file_sha256(path) for path in checked.task.outputs()}


class CompletionMarkers:
    """The markers of one phase, kept in the folder its units write to."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.resumed = 0  # units an earlier attempt finished, found by `finished`
        folder.mkdir(parents=True, exist_ok=True)

    def finished(self, keys: Sequence[str], unit: str = "work units") -> dict[int, Any]:
        """{unit: result} of the units whose marker holds for `keys`; every other file in the
        folder is removed. `unit` names what a task is, in the run's log."""
        results, keep = {}, set()
        for index, key in enumerate(keys):
            loaded = self._load(index, key)
            if loaded is not None:
                results[index], files = loaded
                keep |= files
        for path in self.folder.iterdir():
            if path.name not in keep and path.is_file():
                path.unlink()
        self.resumed = len(results)
        if results:
            LOGGER.info(f"{len(results):,} of {len(keys):,} {unit} were finished by an earlier attempt in {self.folder.name}: not redone")
        return results

    def digest(self) -> str:
        """SHA-256 over every file the phase's markers vouch for (names and the digests their
        workers took): what a later task that reads all of a phase's outputs depends on, without
        hashing them again."""
        digest = hashlib.sha256()
        for path in sorted(self.folder.glob(MARKERS)):
            digest.update(json.dumps(json.loads(path.read_text())["outputs"], sort_keys=True).encode())
        return digest.hexdigest()

    def written(self) -> dict[str, str]:
        """{path: SHA-256} of every file the phase's markers vouch for, as their workers hashed them
        (`task_key`'s `known` for a later phase that reads them)."""
        written = {}
        for path in self.folder.glob(MARKERS):
            written |= {str(self.folder / name): digest for name, digest in json.loads(path.read_text())["outputs"].items()}
        return written

    def record(self, index: int, key: str, result: Any, digests: dict[str, str]) -> None:
        frames: dict[str, str] = {}
        encoded = self._encode(index, result, frames)
        marker = {"key": key, "outputs": digests, "frames": frames, "result": encoded}
        path = self.folder / MARKER.format(index)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(marker, sort_keys=True))
        os.replace(partial, path)  # a marker is whole or absent

    def _load(self, index: int, key: str) -> tuple[Any, set[str]] | None:
        path = self.folder / MARKER.format(index)
        try:
            marker = json.loads(path.read_text())
            if marker["key"] != key:
                return None
            written = {**marker["outputs"], **marker["frames"]}
            if any(file_sha256(self.folder / name) != digest for name, digest in written.items()):
                return None
            return self._decode(marker["result"]), {path.name, *written}
        except (OSError, ValueError, KeyError, TypeError):
            return None  # absent, torn or tampered: the unit is done again

    def _encode(self, index: int, result: Any, frames: dict[str, str]) -> Any:
        if result is None or isinstance(result, (bool, int, float, str)):
            return {"value": result}
        if isinstance(result, tuple):
            return {"tuple": [self._encode(index, part, frames) for part in result]}
        if isinstance(result, pl.DataFrame):
            name = RESULT_FRAME.format(index, len(frames))
            result.write_parquet(self.folder / name)
            frames[name] = file_sha256(self.folder / name)
            return {"frame": name}
        raise TypeError(f"a work unit's result cannot be kept in a completion marker: {type(result).__name__}")

    def _decode(self, encoded: dict) -> Any:
        if "value" in encoded:
            return encoded["value"]
        if "tuple" in encoded:
            return tuple(self._decode(part) for part in encoded["tuple"])
        return pl.read_parquet(self.folder / encoded["frame"])
