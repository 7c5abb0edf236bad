"""A post-training stage's time in the runtime event log the pretraining stages write
(`ito_assets.runtime.record.events`), so that desk telemetry counts every second of the booking,
post-training included.

The stage runs in one process on one device, so it is its own supervisor: it writes its events
to the stage folder's `events.jsonl` as they happen (one writer), in the kinds telemetry reads:

    startup     stage start to the first evaluation (reading the pairs, loading the policy)
    step        each optimizer step (RLVR: one trainer step, its generator draws included)
    evaluation  the held-out battery before (first stage only) and after, and the KL to the reference
    checkpoint  the policy's save (training waits for it: blocking and total seconds are the same)
    allocation  the stage's whole window, written last, on one device

A rerun of the stage in the same run folder trains again from the stage's start, so it is the
next attempt, resumed from nothing: telemetry then counts the earlier attempt's steps as wasted.

A stage whose steps run on the stage worker (`on_worker`) writes only its own part here: its
start-up, evaluations, the policy's save, and its windows before and after the worker's. The
worker and its supervisor write the attempts (resume, start-up, steps, checkpoints, their
allocation) into the same folder, numbered as theirs.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import Event, EventKind

NUM_DEVICES = 1  # the stages train in one process (`pipeline.run_stage`)


class StageTimeline:
    def __init__(self, folder: Path, *, clock=time.time, steps_by_worker: bool = False):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.clock = folder, clock
        self.started = self.window_started = clock()
        self.num_steps = 0
        self.attempt = 0
        if steps_by_worker:  # the worker's attempts resume and are counted by the worker
            return
        self.attempt = sum(1 for e in events.read(folder) if e.kind is EventKind.RESUME)
        self._write(EventKind.RESUME, step=-1, detail="fresh: a post-training stage restarts from its start")

    def startup(self) -> None:
        """Everything since the stage began, before its first evaluation."""
        self._write(EventKind.STARTUP, seconds=self.clock() - self.started, num_devices=NUM_DEVICES)

    def step(self, seconds: float, loss: float) -> None:
        self.num_steps += 1
        self._write(EventKind.STEP, step=self.num_steps, seconds=seconds, loss=loss)

    def evaluation(self, seconds: float) -> None:
        self._write(EventKind.EVALUATION, seconds=seconds)

    def checkpoint(self, seconds: float, num_bytes: int, *, step: int | None = None) -> None:
        """`step`: the stage's optimizer steps, where the worker took them (else those counted here)."""
        self._write(EventKind.CHECKPOINT, step=self.num_steps if step is None else step, seconds=seconds,
                    total_seconds=seconds, num_bytes=num_bytes)

    @contextlib.contextmanager
    def handed_to_worker(self):
        """While the stage worker trains, its supervisor writes the allocation: the stage's own
        window closes before and opens again after, so that no second is counted twice."""
        self.close()
        try:
            yield
        finally:
            self.window_started = self.clock()

    def close(self) -> None:
        """The stage's window, from its start (or its return from the worker) to now."""
        self._write(EventKind.ALLOCATION, seconds=self.clock() - self.window_started, num_devices=NUM_DEVICES)

    def _write(self, kind: EventKind, **fields) -> None:
        if "seconds" in fields:
            fields["seconds"] = max(0.0, fields["seconds"])  # a clock stepped back is not negative time
        events.append(self.folder, Event(kind=kind, at=self.clock(), attempt=self.attempt, **fields))
