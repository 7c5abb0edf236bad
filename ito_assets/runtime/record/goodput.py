"""Desk telemetry from the event log: goodput, interruption rate and checkpoint bandwidth.

Definitions (the desk prices a training block from these):
- goodput = productive step seconds / allocated seconds (Google Cloud's "ML goodput" framing:
  the share of the allocation that advanced the model). A step is productive unless a later
  attempt went on from a step before it (resumed from an earlier checkpoint): it is done again,
  or the desk's spike restart set it aside (a REWIND event). An attempt that healed from a peer
  replica group went on from the quorum's step: the steps before it stand.
- badput, split: start-up (launch to first step of an attempt that is not a restart: a
  restart's lies in its recovery), checkpointing (seconds a save blocked training), recovery
  (detection to the first step after a restart), wasted steps, evaluation, idle between stages
  (the run's row only: the devices stay booked while no stage runs), and `other` (the rest of a
  stage's window: data loading, logging).
- a stage's window is its supervisors' allocation events (each ends at `at`, lasts `seconds`); the
  run's is the first window's start to the last one's end, so a gap between stages is counted
  once, as idle, at the run's largest device count. A stage's allocation is never less than the
  seconds its log accounts for (a supervisor killed before writing it, a wall clock set back).
- replica groups: a stage whose plan replicates runs groups side by side, each with its own log
  (`events.read_groups`), each holding its devices for the stage's whole window; the stage's
  seconds are the groups' weighted by their device-seconds (their devices, where their count held),
  so a group that was restarting while the others trained lowers goodput by its share of the
  devices, and device-hours and interruptions are every group's (`summarize_stage`).
- the run's goodput is weighed in device-seconds at the booked block's devices
  (`summarize_run`'s `num_booked_devices`): each stage's window counts every booked device, so a
  stage that holds fewer (post-training on one of eight) leaves the rest unheld, which is badput,
  and so is the idle time between stages; productive device-seconds are each stage's productive
  seconds at the devices it held. The run's seconds and their buckets stay wall-clock (they split
  the run's window); `goodput` and the quotes read the device-seconds. A stage's goodput is its
  seconds' share (its groups' seconds are already weighted by their device-seconds).
- post-training: the post-training stages (SFT, DPO, RLVR) write the same events for their one
  device (`ito_assets.posttraining.timeline`), so their steps, evaluations and saves fall in the
  buckets above and the gap before them is idle; `posttraining_seconds` says how much of the
  allocation their windows took (a share by phase, not another bucket: the buckets stay disjoint).
- interruption rate = interruptions per 1,000 GPU-hours (device-hours), planned and unplanned,
  the unit cluster operators quote failure rates in (e.g. the Llama 3 paper's 466 interruptions
  in 54 days, Dubey et al. 2024, section 3.3.4).
- checkpoint bandwidth = bytes written / total save seconds; training-blocking seconds summed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping, Sequence

from ito_assets.manifest.schema import POST_TRAINING_ORDER
from ito_assets.runtime.record.events import NOT_APPLIED, Event, EventKind

_SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, kw_only=True)
class Telemetry:
    allocated_seconds: float
    device_seconds: float  # what the stages held (the run: and the idle time at its largest count)
    productive_seconds: float
    startup_seconds: float
    checkpoint_blocking_seconds: float
    recovery_seconds: float
    wasted_step_seconds: float
    evaluation_seconds: float
    num_steps: int  # productive steps
    num_wasted_steps: int
    num_planned_interruptions: int
    num_unplanned_interruptions: int
    num_checkpoints: int
    checkpoint_bytes: int
    checkpoint_total_seconds: float
    idle_seconds: float = 0.0  # between stages' windows (a run's figure; 0 for one stage)
    posttraining_seconds: float = 0.0  # the post-training stages' windows, inside allocated_seconds
    # The run's window at the booked block's devices, and its productive seconds at the devices that
    # trained them (`summarize_run`); 0 for a stage, whose figures are its own devices'.
    allocated_device_seconds: float = 0.0
    productive_device_seconds: float = 0.0

    @property
    def device_hours(self) -> float:
        return self.device_seconds / _SECONDS_PER_HOUR

    @property
    def goodput(self) -> float:
        if self.allocated_device_seconds > 0:
            return self.productive_device_seconds / self.allocated_device_seconds
        return self.productive_seconds / self.allocated_seconds if self.allocated_seconds > 0 else 0.0

    @property
    def device_split(self) -> tuple[float, float]:
        """(allocated, productive) device-seconds: the run's at the booked block, a stage's at the
        devices it held (its productive seconds at their mean over its window)."""
        if self.allocated_device_seconds > 0:
            return self.allocated_device_seconds, self.productive_device_seconds
        if self.allocated_seconds <= 0:
            return 0.0, 0.0
        return self.device_seconds, self.productive_seconds * self.device_seconds / self.allocated_seconds

    @property
    def unheld_device_seconds(self) -> float:
        """Booked device-seconds that no stage held (fewer devices than booked, and the idle time
        at the booked count beyond the run's largest): badput in device terms, 0 for a stage."""
        return max(0.0, self.allocated_device_seconds - self.device_seconds) if self.allocated_device_seconds > 0 else 0.0

    @property
    def accounted_seconds(self) -> float:
        """Every bucket but `other`."""
        return (self.productive_seconds + self.startup_seconds + self.checkpoint_blocking_seconds
                + self.recovery_seconds + self.wasted_step_seconds + self.evaluation_seconds + self.idle_seconds)

    @property
    def other_seconds(self) -> float:
        return self.allocated_seconds - self.accounted_seconds

    def interruptions_per_1000_device_hours(self, *, planned: bool) -> float:
        count = self.num_planned_interruptions if planned else self.num_unplanned_interruptions
        return 1000.0 * count / self.device_hours if self.device_hours > 0 else 0.0

    @property
    def checkpoint_bandwidth_bytes_per_second(self) -> float:
        return self.checkpoint_bytes / self.checkpoint_total_seconds if self.checkpoint_total_seconds > 0 else 0.0

    def as_row(self) -> dict[str, float | int]:
        """Flat figures for the warehouse table and the UI."""
        allocated_device_seconds, productive_device_seconds = self.device_split
        return {
            "goodput": self.goodput,
            "allocated_seconds": self.allocated_seconds,
            "device_hours": self.device_hours,
            "allocated_device_seconds": allocated_device_seconds,
            "productive_device_seconds": productive_device_seconds,
            "unheld_device_seconds": self.unheld_device_seconds,
            "productive_seconds": self.productive_seconds,
            "badput_startup_seconds": self.startup_seconds,
            "badput_checkpoint_seconds": self.checkpoint_blocking_seconds,
            "badput_recovery_seconds": self.recovery_seconds,
            "badput_wasted_step_seconds": self.wasted_step_seconds,
            "badput_evaluation_seconds": self.evaluation_seconds,
            "badput_idle_seconds": self.idle_seconds,
            "badput_other_seconds": self.other_seconds,
            "posttraining_seconds": self.posttraining_seconds,
            "num_steps": self.num_steps,
            "num_wasted_steps": self.num_wasted_steps,
            "planned_interruptions_per_1000_device_hours": self.interruptions_per_1000_device_hours(planned=True),
            "unplanned_interruptions_per_1000_device_hours": self.interruptions_per_1000_device_hours(planned=False),
            "num_checkpoints": self.num_checkpoints,
            "checkpoint_bytes": self.checkpoint_bytes,
            "checkpoint_bandwidth_bytes_per_second": self.checkpoint_bandwidth_bytes_per_second,
        }


def _restart_points(events: list[Event]) -> list[tuple[int, int]]:
    """(attempt, the last step before the first it trained) for each attempt that resumed (-1 for
    a fresh start): the step it resumed from, unless it healed from a peer replica group and went
    on from the quorum's step (an attempt that trained nothing: the step it resumed from). And
    for each of the desk's spike restarts, (the first attempt on the rewound lineage, the restart
    step): every group's steps past it were set aside, also where the group then resumed from a
    later checkpoint of the rewound lineage or healed forward to its peers."""
    resumed = {e.attempt: e.step for e in events if e.kind is EventKind.RESUME}
    first: dict[int, int] = {}
    for e in events:
        if e.kind is EventKind.STEP and e.attempt in resumed:
            first[e.attempt] = min(first.get(e.attempt, e.step), e.step)
    points = [(attempt, first[attempt] - 1 if attempt in first else step) for attempt, step in resumed.items()]
    return points + [(e.attempt, e.step) for e in events if e.kind is EventKind.REWIND]


def _wasted(step: Event, restarts: list[tuple[int, int]]) -> bool:
    """A step is wasted when its update was not applied (a non-finite loss or gradient), or when
    any later attempt went on from a step before it: it is done again, or was set aside."""
    if step.detail == NOT_APPLIED:
        return True
    return any(attempt > step.attempt and point < step.step for attempt, point in restarts)


def summarize(events: list[Event], *, posttraining: bool = False) -> Telemetry:
    """One stage's figures; `posttraining`: the stage is a post-training one (its whole window is
    `posttraining_seconds`)."""
    def total(kind: EventKind, *, field: str = "seconds", where=lambda e: True) -> float:
        return sum(getattr(e, field) for e in events if e.kind is kind and where(e))

    restarts = _restart_points(events)
    recovered = {e.attempt for e in events if e.kind is EventKind.RECOVERY}
    steps = [e for e in events if e.kind is EventKind.STEP]
    wasted = [e for e in steps if _wasted(e, restarts)]
    allocations = [e for e in events if e.kind is EventKind.ALLOCATION]
    interruptions = [e for e in events if e.kind is EventKind.INTERRUPTION]
    buckets = {
        "productive_seconds": sum(e.seconds for e in steps) - sum(e.seconds for e in wasted),
        # A restart's start-up lies inside its recovery; the first attempt of a stage run again
        # (another supervisor, attempts numbered on) has no recovery: its start-up is start-up.
        "startup_seconds": total(EventKind.STARTUP, where=lambda e: e.attempt not in recovered),
        "checkpoint_blocking_seconds": total(EventKind.CHECKPOINT),
        # From a failure to training again: its detection (the last sign of life until the
        # supervisor saw it: up to the hang timeout) and the restart to the first step.
        "recovery_seconds": total(EventKind.INTERRUPTION) + total(EventKind.RECOVERY),
        "wasted_step_seconds": sum(e.seconds for e in wasted),
        "evaluation_seconds": total(EventKind.EVALUATION),
    }
    held = sum(e.seconds for e in allocations)
    # A supervisor killed before it wrote its allocation, or a wall clock set back while it ran,
    # leaves less allocated than the log accounts for: the allocation is then what was accounted,
    # at the attempts' device count (their start-ups', else the allocations'), so goodput stays
    # within [0, 1] and no bucket goes negative.
    allocated = max(held, sum(buckets.values()))
    devices = _attempt_devices(events) or _allocated_devices(events)
    return Telemetry(
        allocated_seconds=allocated,
        posttraining_seconds=allocated if posttraining else 0.0,
        device_seconds=sum(e.seconds * e.num_devices for e in allocations) + (allocated - held) * devices,
        **buckets,
        num_steps=len(steps) - len(wasted),
        num_wasted_steps=len(wasted),
        num_planned_interruptions=sum(1 for e in interruptions if e.planned),
        num_unplanned_interruptions=sum(1 for e in interruptions if not e.planned),
        num_checkpoints=sum(1 for e in events if e.kind is EventKind.CHECKPOINT),
        checkpoint_bytes=int(total(EventKind.CHECKPOINT, field="num_bytes")),
        checkpoint_total_seconds=total(EventKind.CHECKPOINT, field="total_seconds"),
    )


def summarize_stage(groups: Sequence[list[Event]], *, posttraining: bool = False) -> Telemetry:
    """A stage's figures from its replica groups' logs, group 0's first (`events.read_groups`; one
    log without replica groups). Each group is summarized alone (its attempts are its own). The
    groups train side by side and the stage holds all their devices for its whole window (the
    longest group's): a group that ended early (its restarts spent) held its devices to the end
    too, as `other`. The stage's seconds are the groups' weighted by their device-seconds (their
    devices, where their count held), so goodput is the share of all the stage's device time that
    advanced the model. Device-hours, interruptions, checkpoints and wasted
    steps are every group's; the steps are the most a group trained (one that healed forward
    skipped those its peers trained)."""
    parts = [summarize(log, posttraining=posttraining) for log in groups]
    if len(parts) <= 1:
        return parts[0] if parts else summarize([], posttraining=posttraining)
    devices = _group_devices(groups)
    window = max(p.allocated_seconds for p in parts)
    parts = [_held_for(p, window, d, has_devices=_devices(log) > 0) for p, d, log in zip(parts, devices, groups)]
    # Each group weighs its device time: its devices, or on average over the window where its
    # allocations named different counts (a stage run again on other devices).
    weights = [p.device_seconds for p in parts] if any(p.device_seconds > 0 for p in parts) else [1.0] * len(parts)
    mean = lambda name: sum(w * getattr(p, name) for w, p in zip(weights, parts)) / sum(weights)
    summed = lambda name: sum(getattr(p, name) for p in parts)
    stage = Telemetry(
        **{name: mean(name) for name in _SECONDS},
        device_seconds=summed("device_seconds"), num_steps=max(p.num_steps for p in parts),
        **{name: summed(name) for name in ("num_wasted_steps", "num_planned_interruptions",
                                           "num_unplanned_interruptions", "num_checkpoints", "checkpoint_bytes",
                                           "checkpoint_total_seconds")},
    )
    # Each group's buckets sum to its window; their weighted means may miss it by a rounding.
    return replace(stage, allocated_seconds=stage.accounted_seconds) if stage.other_seconds < 0 else stage


def _held_for(part: Telemetry, window: float, devices: int, *, has_devices: bool) -> Telemetry:
    """A group's figures over the stage's whole window, at its devices (`has_devices`: its own
    figures counted them for the seconds it accounted)."""
    unheld = window - part.allocated_seconds + (0.0 if has_devices else part.allocated_seconds)
    return replace(part, allocated_seconds=window, device_seconds=part.device_seconds + unheld * devices)


# A stage's figures that are seconds of its wall-clock window.
_SECONDS = ("allocated_seconds", "productive_seconds", "startup_seconds", "checkpoint_blocking_seconds",
            "recovery_seconds", "wasted_step_seconds", "evaluation_seconds", "idle_seconds", "posttraining_seconds")


def _allocated_devices(log: list[Event]) -> int:
    return max((e.num_devices for e in log if e.kind is EventKind.ALLOCATION), default=0)


def _attempt_devices(log: list[Event]) -> int:
    """The most devices an attempt's start-up names (0 in a log written before they named them)."""
    return max((e.num_devices for e in log if e.kind is EventKind.STARTUP), default=0)


def _devices(log: list[Event]) -> int:
    """A log's devices: the most its allocations or its attempts' start-ups name (a supervisor
    killed before it wrote the allocation; a post-training stage whose own windows hold one device
    and whose worker's attempts held more), else 0: none known."""
    return max(_allocated_devices(log), _attempt_devices(log))


def _group_devices(groups: Sequence[list[Event]]) -> list[int]:
    """Each group's devices. Groups are equal shares of the stage's ranks: one that wrote no
    allocation (its supervisor killed) had as many as its peers."""
    known = [_devices(log) for log in groups]
    return [d or max(known) or 1 for d in known] if len(groups) > 1 else known


def summarize_run(stages: Mapping[str, Sequence[list[Event]]], *, num_booked_devices: int = 0) -> Telemetry:
    """A run's figures from each stage's replica groups' logs (`summarize_stage`). Attempts are
    numbered per stage and group, so each stage is summarized alone and the figures, all sums, are
    added: concatenating the logs would let one stage's restart mark another stage's steps as
    wasted. The time between the stages' windows is added to the allocation as idle, at the
    largest device count of a stage (all its groups'). A supervisor killed before it wrote its
    allocation leaves its work without a window: its accounted events stand for it (`summarize`
    counted their seconds in the stage's allocation), so they are not idle too.

    `num_booked_devices`: the GPUs of the booked block the run trained on (0: unknown, the largest
    count a stage held stands for it). The goodput is weighed in device-seconds at that count
    (`_at_block`), so a stage on fewer devices than booked counts the rest as badput."""
    parts = [summarize_stage(groups, posttraining=stage in POST_TRAINING_ORDER) for stage, groups in stages.items()]
    total = Telemetry(**{f.name: sum(getattr(p, f.name) for p in parts) for f in fields(Telemetry)})
    logs = [e for groups in stages.values() for log in groups for e in log]
    windows = [(e.at - e.seconds, e.at) for e in logs
               if e.kind is EventKind.ALLOCATION or (e.kind in _ACCOUNTED and e.seconds > 0)]
    idle = _idle_seconds(windows)
    devices = max((sum(_group_devices(groups)) for groups in stages.values()), default=0)
    block = max(num_booked_devices, devices)
    allocated_device_seconds, productive_device_seconds = _at_block(parts, block)
    return replace(total, allocated_seconds=total.allocated_seconds + idle, idle_seconds=idle,
                   device_seconds=total.device_seconds + idle * devices,
                   allocated_device_seconds=allocated_device_seconds + idle * block,
                   productive_device_seconds=productive_device_seconds)


def _at_block(parts: Sequence[Telemetry], block: int) -> tuple[float, float]:
    """(allocated, productive) device-seconds of the stages' windows, each at the block's devices
    or at what it held where that was more; its productive seconds at the devices it held (their
    mean over its window). A stage whose log names no device (written before logs named them) held
    the block. (0, 0) where no device is known at all: the goodput is then the seconds' share."""
    allocated = productive = 0.0
    for part in parts:
        held = part.device_seconds
        devices = held / part.allocated_seconds if held > 0 and part.allocated_seconds > 0 else block
        productive += part.productive_seconds * devices
        allocated += max(held, part.allocated_seconds * block)
    return allocated, productive


# The events whose seconds are a bucket of the stage's allocation (`summarize`).
_ACCOUNTED = (EventKind.STEP, EventKind.STARTUP, EventKind.CHECKPOINT, EventKind.RECOVERY, EventKind.EVALUATION)


def _idle_seconds(windows: list[tuple[float, float]]) -> float:
    """The time inside the span of `windows` that none of them covers."""
    idle, reached = 0.0, None
    for start, end in sorted(windows):
        if reached is not None and start > reached:
            idle += start - reached
        reached = end if reached is None else max(reached, end)
    return idle
