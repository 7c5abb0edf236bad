"""The run's goodput is weighed in device-seconds at the booked block's GPUs: an hour of
post-training on one of eight booked GPUs is not as productive as an hour of pretraining on all
eight, and the seven GPUs it leaves unheld are badput. The wall-clock buckets stay as they were."""

from __future__ import annotations

import pytest

from ito_assets.runtime.record.events import Event, EventKind
from ito_assets.runtime.record.goodput import summarize_run


def stage(start: float, seconds: float, devices: int, productive: int) -> list[list[Event]]:
    """One log: a window of `seconds` on `devices`, `productive` one-second steps inside it."""
    log = [Event(kind=EventKind.ALLOCATION, at=start + seconds, seconds=seconds, num_devices=devices),
           Event(kind=EventKind.STARTUP, at=start + 1, seconds=0.0, num_devices=devices)]
    log += [Event(kind=EventKind.STEP, at=start + 1 + i, step=i + 1, seconds=1.0) for i in range(productive)]
    return [log]


MIXED = {"pretraining": stage(0, 1000, 8, 1000), "sft": stage(1000, 1000, 1, 1000), "dpo": stage(2000, 1000, 1, 1000)}


def test_post_training_on_one_of_eight_gpus_counts_the_other_seven_as_badput() -> None:
    run = summarize_run(MIXED, num_booked_devices=8)
    row = run.as_row()
    # Every second productive on the devices each stage held: 8 x 1000 + 1000 + 1000 of 8 x 3000.
    assert row["productive_device_seconds"] == 10_000 and row["allocated_device_seconds"] == 24_000
    assert row["goodput"] == pytest.approx(10_000 / 24_000)  # the previous release said 1.0
    assert row["unheld_device_seconds"] == 2 * 7 * 1000
    # The window's wall-clock split is unchanged.
    assert (row["allocated_seconds"], row["productive_seconds"], row["badput_idle_seconds"]) == (3000, 3000, 0)
    assert run.device_hours == pytest.approx(10_000 / 3600)


@pytest.mark.parametrize(("booked", "goodput"), [
    (0, 10_000 / 24_000),  # unknown: the most a stage held (8)
    (7, 10_000 / 24_000),  # fewer than a stage held: what it held counts, never less
    (8, 10_000 / 24_000),
    (9, 10_000 / 27_000),  # one GPU more than any stage used: unheld throughout
])
def test_the_booked_count_below_at_and_above_what_the_stages_held(booked: int, goodput: float) -> None:
    assert summarize_run(MIXED, num_booked_devices=booked).goodput == pytest.approx(goodput)


def test_stages_on_every_booked_gpu_keep_the_seconds_share_exactly() -> None:
    stages = {"pretraining": stage(0, 100, 8, 60), "mid_training": stage(100, 100, 8, 40)}
    run = summarize_run(stages, num_booked_devices=8)
    assert run.goodput == 0.5 == run.productive_seconds / run.allocated_seconds


def test_idle_time_between_stages_counts_at_the_booked_count() -> None:
    """A gap of 100 s between two stages on 2 of 4 booked GPUs: 4 x 100 idle device-seconds."""
    stages = {"pretraining": stage(0, 100, 2, 100), "mid_training": stage(200, 100, 2, 100)}
    run = summarize_run(stages, num_booked_devices=4)
    assert run.idle_seconds == 100
    assert run.allocated_device_seconds == 4 * 300 and run.productive_device_seconds == 2 * 200
    assert run.unheld_device_seconds == 4 * 300 - 2 * 300  # the stages' idle is at their 2, the block's at 4


def test_a_log_that_names_no_device_counts_at_the_block() -> None:
    """Written before logs named devices (no allocation, no start-up count): the block held it."""
    log = [Event(kind=EventKind.STEP, at=float(i + 1), step=i + 1, seconds=1.0) for i in range(10)]
    run = summarize_run({"pretraining": [log]}, num_booked_devices=8)
    assert run.goodput == 1.0 and run.allocated_device_seconds == 80
    unknown = summarize_run({"pretraining": [log]})  # nor a booked count: the seconds' share
    assert (unknown.allocated_device_seconds, unknown.goodput) == (0.0, 1.0)


def test_a_stage_row_gives_its_own_device_seconds() -> None:
    from ito_assets.runtime.record.goodput import summarize_stage

    row = summarize_stage(stage(0, 100, 4, 50)).as_row()
    assert (row["allocated_device_seconds"], row["productive_device_seconds"], row["unheld_device_seconds"]) == (400, 200, 0)
    assert row["goodput"] == 0.5
