"""Asynchronous checkpoints with torch.distributed.checkpoint (DCP), per the manifest's policy.

`dcp.async_save` plans the save on the calling thread and writes the shards on a background
thread. The state is first staged (copied) by a `DefaultStager` that this checkpointer keeps for
its lifetime, so that the staging buffers are allocated once and reused, and that copies on its own
thread (pinned memory and a side stream on a GPU: torchtitan's "zero-overhead" staging). Training
goes on with the next forward and backward pass while the copy runs and waits only before the
optimizer changes the weights (`wait_staged`). Training-blocking seconds are the save call plus
that wait plus any wait for the previous save.

The save runs on its own gloo process group: the background thread's collectives must never
interleave with the training step's collectives on the default group (the advice of the DCP async
tutorial and torchtitan's `async_mode="async"`). Every rank hashes the shard files it writes while
writing them (`DigestingWriter`), and DCP's gather of write results brings the digests to rank 0;
when rank 0's save completes, the done callback (still off the training thread) hashes only the
small `.metadata` and writes the completion marker; the training
thread then appends the registry record and prunes to `keep_last` in `poll`, never touching a
folder being written.

A save that fails for its storage (a full disk, EIO, a vanished folder), on any rank, is learned
by every rank at the next point they all pass (the next save, the final wait: `agree`): its
partial folder is removed, the previous whole checkpoint stays listed, and the worker decides
whether to go on. Any other failure still raises.
"""

from __future__ import annotations

import logging
import math
import shutil
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from ito_assets.errors import ErrorCode, disk_full
from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.checkpoint import registry
from ito_assets.runtime.checkpoint.digest_writer import DigestingWriter
from ito_assets.runtime.checkpoint.holds import held_steps
from ito_assets.runtime.checkpoint.markers import Marker
from ito_assets.runtime.checkpoint.registry import CheckpointRecord

_log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    directory: Path  # the stage folder (`storage.stage_dir`)
    interval_steps: int  # CheckpointPolicy.interval_steps of the manifest
    keep_last: int  # CheckpointPolicy.keep_last of the manifest
    # What trained the weights (the layout the worker ran, its fallbacks, the RoPE positions), into every marker.
    trained_with: dict | None = None
    # The run and stage ({"run_key", "stage"}), into every marker: a resume or a prune takes no other's folder.
    owner: dict | None = None

    def __post_init__(self) -> None:
        if self.interval_steps < 1:
            raise ValueError("interval_steps must be positive")
        if self.keep_last < 1:
            raise ValueError("keep_last must be positive")


@dataclass
class _InFlight:
    step: int
    folder: Path
    started: float  # time.monotonic() at the save call
    blocking_seconds: float  # grows while the training thread waits for this save
    staged: Future
    done: threading.Event
    stager: DefaultStager | None  # this save's own stager, closed once it finished (GPU)
    writer: DigestingWriter  # rank 0's holds every rank's file digests once the save finished
    marker: Marker | None = None
    spike_history: dict | None = None  # into the marker, as of this step
    finished: float | None = None  # time.monotonic() once the marker is written
    error: BaseException | None = None


@dataclass(frozen=True, kw_only=True)
class SaveFailure:
    """A save that failed for its storage, as every rank agreed on it."""

    step: int
    code: ErrorCode  # STORAGE_FULL or CHECKPOINT_STORAGE_INVALID
    reason: str  # the OS's words on the rank that saw it; "on another rank" elsewhere


def storage_cause(error: BaseException) -> OSError | None:
    """The OSError behind a failed save, if storage caused it: the error itself, its causes, or
    a rank's failure inside DCP's CheckpointException."""
    seen: list[BaseException] = [error]
    while seen:
        current = seen.pop()
        if isinstance(current, OSError):
            return current
        seen += [c for c in (current.__cause__, current.__context__) if c is not None]
        seen += _rank_failures(current)
    return None


def _rank_failures(error: BaseException) -> list[BaseException]:
    """The ranks' exceptions inside DCP's CheckpointException: each rank's failure is an exception,
    or (as DCP wraps one that a rank raised while writing its shards) an (exception, stack) pair."""
    failures = getattr(error, "failures", None)
    if not isinstance(failures, dict):
        return []
    found = []
    for failure in failures.values():
        first = failure[0] if isinstance(failure, tuple) and failure else None
        found += [c for c in (getattr(failure, "exc", failure), first) if isinstance(c, BaseException)][:1]
    return found


def _stager() -> DefaultStager:
    on_gpu = torch.cuda.is_available()
    return DefaultStager(StagingOptions(use_pinned_memory=on_gpu, use_shared_memory=False, use_async_staging=True,
                                        use_non_blocking_copy=on_gpu))


class Checkpointer:
    """Saves asynchronously, at most one save in flight; rank 0 finalizes and prunes."""

    def __init__(self, config: CheckpointConfig, *, process_group: dist.ProcessGroup | None, rank: int):
        self.config = config
        self.process_group = process_group
        self.rank = rank
        # A stager reused across saves keeps its staging buffers (on CPU, as the tests show). On an
        # H200 with torch 2.11 a reused pinned-memory stager failed its second save (KeyError in
        # StateDictStager, 2026-11-29), so on a GPU every save gets a stager of its own.
        self._stager = None if torch.cuda.is_available() else _stager()
        self._in_flight: _InFlight | None = None
        self._ready: list[CheckpointRecord] = []  # finished while save() waited for them
        self._newest: int | None = None  # the newest step this checkpointer saved whole (`prune`'s bound)
        self._failed: tuple[int, OSError] | None = None  # this rank's storage failure not yet agreed on
        self.failures: list[SaveFailure] = []  # agreed on, for the worker to act on (`take_failures`)
        if rank == 0:
            config.directory.mkdir(parents=True, exist_ok=True)

    def due(self, step: int) -> bool:
        return step > 0 and step % self.config.interval_steps == 0

    def save(self, step: int, state: dict[str, Any], *, spike_history: dict | None = None,
             on_tick: Callable[[], None] | None = None, tick_s: float = 1.0) -> float:
        """Start an asynchronous save of `state` at `step`; returns the seconds training was blocked.
        `spike_history` (the detector's values at `step`) goes into the marker. A folder of `step`
        already there (a partial save of a killed attempt, one the resume rejected) is replaced.
        `on_tick` every `tick_s` while the previous save is still writing, as in `wait`: on slow
        storage that wait can outlast the supervisor's hang bound."""
        # At most one save in flight; the wait is the previous save's blocking.
        self._ready.extend(self.wait(on_tick=on_tick, tick_s=tick_s))
        self.agree()
        started = time.monotonic()
        folder = markers.checkpoint_dir(self.config.directory, step)
        if self.rank == 0 and (folder.exists() or folder.is_symlink()):
            _remove(folder)  # a partial save of this step from a killed attempt, or a folder planted there
        _barrier(self.process_group)
        own = _stager() if self._stager is None else None
        writer = DigestingWriter(folder)
        response = dcp.async_save(state, checkpoint_id=str(folder), storage_writer=writer,
                                  process_group=self.process_group, async_stager=own or self._stager)
        assert isinstance(response, AsyncSaveResponse), "an asynchronous stager yields an AsyncSaveResponse"
        flight = _InFlight(step=step, folder=folder, started=started, blocking_seconds=time.monotonic() - started,
                           staged=response.staging_completion, done=threading.Event(), stager=own,
                           writer=writer, spike_history=spike_history)
        self._in_flight = flight
        response.upload_completion.add_done_callback(lambda f: self._on_done(flight, f))
        return flight.blocking_seconds

    def wait_staged(self) -> float:
        """Block until the state of the save in flight is copied; call before changing the weights."""
        flight = self._in_flight
        if flight is None or flight.staged.done():
            return 0.0
        started = time.monotonic()
        flight.staged.result()
        waited = time.monotonic() - started
        flight.blocking_seconds += waited
        return waited

    def _on_done(self, flight: _InFlight, future: Future) -> None:
        """Runs on the thread that finished the save: write the marker with the streamed digests (rank 0)."""
        try:
            future.result()
            if self.rank == 0:
                flight.marker = markers.write_marker(flight.folder, flight.step, streamed=flight.writer.file_digests,
                                                     trained_with=self.config.trained_with,
                                                     spike_history=flight.spike_history, owner=self.config.owner)
        except BaseException as error:  # surfaced on the training thread by poll()/wait()
            flight.error = error
        finally:
            flight.finished = time.monotonic()
            flight.done.set()

    def poll(self) -> list[CheckpointRecord]:
        """Non-blocking: records of saves finished since the last call (rank 0), after pruning."""
        ready, self._ready = self._ready, []
        flight = self._in_flight
        if flight is None or not flight.done.is_set():
            return ready
        self._in_flight = None
        if flight.stager is not None:
            flight.stager.close()
        if flight.error is not None:
            cause = storage_cause(flight.error)
            if cause is None:
                raise RuntimeError("an asynchronous checkpoint save failed") from flight.error
            self._failed = (flight.step, cause)  # every rank learns of it in `agree`
            return ready
        if self.rank != 0:
            return ready
        record = CheckpointRecord(
            step=flight.step, path=str(flight.folder), num_bytes=flight.marker.num_bytes,
            blocking_seconds=flight.blocking_seconds,
            total_seconds=max(flight.finished - flight.started, flight.blocking_seconds),
            metadata_sha256=flight.marker.metadata_sha256, completed_at=time.time(),
        )
        registry.append(self.config.directory, record)
        self._newest = flight.step
        self.prune()
        return ready + [record]

    def wait(self, on_tick: Callable[[], None] | None = None, tick_s: float = 1.0) -> list[CheckpointRecord]:
        """Block until the save in flight (if any) is finalized; `on_tick` every `tick_s` meanwhile
        (the worker's heartbeat: a long save is not a hang)."""
        flight = self._in_flight
        if flight is not None:
            started = time.monotonic()
            while not flight.done.wait(timeout=tick_s):
                if on_tick is not None:
                    on_tick()
            flight.blocking_seconds += time.monotonic() - started
        return self.poll()

    def agree(self) -> SaveFailure | None:
        """A collective on the checkpoint group (every rank, at the same point: the next save, the
        final wait): whether a save failed for its storage on any rank. Its partial folder is
        removed (rank 0) and the failure is kept in `failures`."""
        step, error = self._failed if self._failed is not None else (-1, None)
        self._failed = None
        flags = torch.tensor([step, int(error is not None and disk_full(error))], dtype=torch.int64)
        if dist.is_initialized() and dist.get_world_size(self.process_group) > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.process_group)
        failed_step, full = int(flags[0]), bool(flags[1])
        if failed_step < 0:
            return None
        folder = markers.checkpoint_dir(self.config.directory, failed_step)
        if self.rank == 0 and markers.read_marker(folder) is None:
            _remove(folder, ignore_errors=True)
        reason = (error.strerror or type(error).__name__) if error is not None else "on another rank"
        failure = SaveFailure(step=failed_step, code=ErrorCode.STORAGE_FULL if full else ErrorCode.CHECKPOINT_STORAGE_INVALID,
                              reason=reason)
        self.failures.append(failure)
        return failure

    def take_failures(self) -> list[SaveFailure]:
        taken, self.failures = self.failures, []
        return taken

    def close(self) -> list[CheckpointRecord]:
        records = self.wait()
        if self._stager is not None:
            self._stager.close()
        return records

    def prune(self) -> list[int]:
        """Keep the newest `keep_last` whole checkpoints; remove older ones and old partial folders.

        Once this checkpointer has saved, only folders up to its newest save count, and that save
        is always kept. A newer folder is one this attempt's resume rejected (a flipped byte leaves
        every size right, so it looks whole here, where digests are not checked): counted, it
        would have each new save pruned as soon as written. It stays until the run reaches its
        step again and `save` replaces it."""
        folders = sorted((markers.step_of(p), p) for p in self.config.directory.iterdir()
                         if p.is_dir() and markers.step_of(p) is not None)
        bound = self._newest if self._newest is not None else math.inf
        whole = [step for step, p in folders if step <= bound and self._whole(p)]
        try:
            held = held_steps(self.config.directory)
        except OSError as error:  # holds unknown: pruning now could delete a held checkpoint
            _log.warning("not pruning: the holds folder cannot be read (%s)", error)
            return []
        keep = set(whole[-self.config.keep_last:]) | held | {self._newest}
        newest_whole = whole[-1] if whole else -1
        in_flight = self._in_flight.step if self._in_flight else None
        removed = []
        for step, folder in folders:
            if step in keep or step == in_flight or step > newest_whole:
                continue
            _remove(folder, ignore_errors=True)
            removed.append(step)
        return removed

    def _whole(self, folder: Path) -> bool:
        """Marked, this stage's, not a link, and its files as the marker lists them (`markers.intact`):
        a folder planted from elsewhere, or one whose marker lies (another step, a shard missing or
        cut short), never counts toward `keep_last`, else it would have the stage's own whole
        checkpoints pruned; nor does one the resume skips for its data order (a stage run again
        with another batch size starts afresh beside the folders of the first order, which stay).
        The digests are left to the resume: hashing every kept folder at each save would cost more
        than the save."""
        return markers.intact(folder, self.config.owner, markers.resume_terms(self.config.trained_with))


def _remove(folder: Path, *, ignore_errors: bool = False) -> None:
    """A link goes, never what it points to (rmtree refuses a link; following it would delete another's folder);
    so does a plain file planted under a step's name, which rmtree refuses too."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        try:
            folder.unlink()
        except OSError:
            if not ignore_errors:
                raise
        return
    shutil.rmtree(folder, ignore_errors=ignore_errors)


def _barrier(group: dist.ProcessGroup | None) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)
