"""Telemetry of a stage trained by replica groups: every group's log counts (device-hours,
interruptions, the device time a restarting group lost), each group read alone, and a group that
healed forward from its peers has not wasted the steps it trained before its restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import examples

from ito_assets.defs.telemetry.table import rows_for_run
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import Event, EventKind
from ito_assets.runtime.record.goodput import summarize, summarize_run, summarize_stage
from ito_assets.runtime.record.publish import stage_metrics


def e(kind: EventKind, at: float = 0.0, **fields) -> Event:
    return Event(kind=kind, at=at, **fields)


def group(allocated: float, devices: int, steps: range, *, attempt: int = 0, resumed: int = -1,
          step_seconds: float = 1.0) -> list[Event]:
    return [e(EventKind.ALLOCATION, seconds=allocated, num_devices=devices),
            e(EventKind.RESUME, attempt=attempt, step=resumed),
            *(e(EventKind.STEP, attempt=attempt, step=s, seconds=step_seconds) for s in steps)]


def restarted_group(devices: int, *, first_steps: range, resumed: int, healed_from: int) -> list[Event]:
    """Attempt 0 trained `first_steps` and was killed; attempt 1 resumed from `resumed` (group 0's
    checkpoint) and trained from `healed_from` to step 80, 30 s of recovery between them."""
    return [e(EventKind.ALLOCATION, seconds=100.0, num_devices=devices),
            e(EventKind.RESUME, attempt=0, step=-1),
            *(e(EventKind.STEP, attempt=0, step=s, seconds=1.0) for s in first_steps),
            e(EventKind.INTERRUPTION, attempt=0, planned=False, seconds=10.0),
            e(EventKind.RECOVERY, attempt=1, seconds=20.0),
            e(EventKind.RESUME, attempt=1, step=resumed),
            *(e(EventKind.STEP, attempt=1, step=s, seconds=1.0) for s in range(healed_from, 81))]


def test_every_group_counts_and_the_stages_seconds_are_weighted_by_devices() -> None:
    """Group 0 (2 devices) trained 80 of its 100 s; group 1 (2 devices) was killed after 20 steps,
    was 30 s recovering and healed at step 51 (trained 51-80). Reading group 0 alone said goodput
    0.8, 200 device-seconds and no interruption."""
    first = group(100.0, 2, range(1, 81))
    second = restarted_group(2, first_steps=range(1, 21), resumed=-1, healed_from=51)
    stage = summarize_stage([first, second])
    assert stage.allocated_seconds == 100.0 and stage.productive_seconds == (80 + 20 + 30) / 2
    assert stage.goodput == 0.65 and stage.recovery_seconds == 15.0
    assert stage.device_hours == pytest.approx(400 / 3600, rel=1e-12)
    assert (stage.num_unplanned_interruptions, stage.num_planned_interruptions) == (1, 0)
    assert stage.interruptions_per_1000_device_hours(planned=False) == pytest.approx(1000 / (400 / 3600))
    assert stage.num_steps == 80 and stage.num_wasted_steps == 0  # the most a group trained
    # Four devices against two: group 0 weighs twice as much.
    heavy = summarize_stage([group(100.0, 4, range(1, 81)), second])
    assert heavy.productive_seconds == pytest.approx((4 * 80 + 2 * 50) / 6)
    assert heavy.device_hours == pytest.approx(600 / 3600, rel=1e-12)
    assert heavy.allocated_seconds * 6 == pytest.approx(heavy.device_hours * 3600)
    assert summarize_stage([first]) == summarize(first)  # one group: its own figures


@pytest.mark.parametrize(("healed_from", "wasted"), [(22, 0), (21, 0), (20, 1), (19, 2), (4, 17)])
def test_a_healed_groups_steps_before_its_first_step_again_are_not_wasted(healed_from, wasted) -> None:
    """Attempt 0 trained steps 1-20; attempt 1 resumed from step 3 and trained from `healed_from`:
    the steps of attempt 0 from `healed_from` on were done again, those before it stand (a resume
    without healing goes on at step 4: 17 wasted, as before)."""
    log = restarted_group(1, first_steps=range(1, 21), resumed=3, healed_from=healed_from)
    assert summarize(log).num_wasted_steps == wasted
    assert summarize(log).wasted_step_seconds == wasted


def test_an_attempt_that_trained_nothing_wastes_from_the_step_it_resumed_from() -> None:
    log = [e(EventKind.RESUME, attempt=0, step=-1), *(e(EventKind.STEP, attempt=0, step=s, seconds=1.0) for s in range(1, 11)),
           e(EventKind.RESUME, attempt=1, step=6)]
    assert summarize(log).num_wasted_steps == 4


def test_the_runs_idle_time_is_counted_at_the_devices_of_all_of_a_stages_groups() -> None:
    """Stage a: two groups of 4 devices, 0-100 s; stage b: one group of 4, 200-300 s; 100 s idle at
    8 devices, the most a stage held."""
    a = [[e(EventKind.ALLOCATION, at=100.0, seconds=100.0, num_devices=4)]] * 2
    b = [[e(EventKind.ALLOCATION, at=300.0, seconds=100.0, num_devices=4)]]
    run = summarize_run({"pretraining": a, "mid_training": b})
    assert (run.idle_seconds, run.allocated_seconds) == (100.0, 300.0)
    assert run.device_hours == pytest.approx((100 * 8 + 100 * 4 + 100 * 8) / 3600, rel=1e-12)


def test_groups_without_an_allocation_weigh_alike_over_the_longest_window() -> None:
    """Supervisors killed before they wrote an allocation: each group's accounted seconds stand
    (10 and 4 s), at a device each, over the longest group's window."""
    stage = summarize_stage([group(1.0, 1, range(1, 11))[1:], group(1.0, 1, range(1, 5))[1:]])
    assert (stage.allocated_seconds, stage.productive_seconds, stage.goodput) == (10.0, 7.0, 0.7)
    assert stage.device_hours == pytest.approx(20 / 3600, rel=1e-12)


def test_a_group_without_an_allocation_has_its_peers_devices_and_loses_nothing() -> None:
    """Group 1's supervisor was killed before it wrote its allocation: its 40 wasted seconds and
    its interruption count at group 0's 4 devices (they dropped its seconds and kept its counts)."""
    first = group(100.0, 4, range(1, 101), step_seconds=0.5)
    second = [e(EventKind.RESUME, attempt=0, step=-1), *(e(EventKind.STEP, attempt=0, step=s, seconds=1.0) for s in range(1, 41)),
              e(EventKind.INTERRUPTION, attempt=0, planned=False, seconds=2.0), e(EventKind.RESUME, attempt=1, step=-1),
              e(EventKind.STEP, attempt=1, step=1, seconds=1.0)]
    stage = summarize_stage([first, second])
    assert stage.wasted_step_seconds == pytest.approx(40 / 2) and stage.num_wasted_steps == 40
    assert stage.recovery_seconds == pytest.approx(2 / 2) and stage.num_unplanned_interruptions == 1
    assert stage.device_hours == pytest.approx(800 / 3600, rel=1e-12)


def _killed_supervisors_log(devices: int) -> list[Event]:
    """Two attempts of `devices` each (their start-ups say so); the supervisor was killed before it
    wrote the allocation: 2 + 10 + 3 + 5 + 5 accounted seconds (the restart's start-up lies in its recovery)."""
    return [e(EventKind.STARTUP, attempt=0, seconds=2.0, num_devices=devices), e(EventKind.RESUME, attempt=0, step=-1),
            *(e(EventKind.STEP, attempt=0, step=s, seconds=1.0) for s in range(1, 11)),
            e(EventKind.INTERRUPTION, attempt=0, planned=False, seconds=3.0), e(EventKind.RECOVERY, attempt=1, seconds=5.0),
            e(EventKind.STARTUP, attempt=1, seconds=1.0, num_devices=devices), e(EventKind.RESUME, attempt=1, step=5),
            *(e(EventKind.STEP, attempt=1, step=s, seconds=1.0) for s in range(6, 11))]


def test_a_lone_stage_without_an_allocation_counts_its_attempts_devices() -> None:
    figures = summarize_stage([_killed_supervisors_log(4)])
    assert figures.allocated_seconds == 25.0 and figures.num_wasted_steps == 5
    assert figures.device_hours == pytest.approx(25 * 4 / 3600, rel=1e-12)
    assert figures.interruptions_per_1000_device_hours(planned=False) == pytest.approx(1000 / (25 * 4 / 3600))
    # A log written before start-ups said their devices has none to count (as before).
    assert summarize_stage([_killed_supervisors_log(0)]).device_hours == 0.0
    # Beside a peer that wrote its allocation, the start-ups' devices are the group's own.
    stage = summarize_stage([group(25.0, 2, range(1, 21)), _killed_supervisors_log(4)])
    assert stage.device_hours == pytest.approx(25 * (2 + 4) / 3600, rel=1e-12)


def test_a_post_training_stage_counts_its_killed_workers_attempts_at_their_devices() -> None:
    """The stage's own windows (its evaluations, on the asset's one device) wrote allocations; its
    worker's supervisor, killed, wrote none: the worker's 300 s count at the 8 devices its start-up
    names, not at the stage's own one."""
    log = [e(EventKind.ALLOCATION, seconds=10.0, num_devices=1), e(EventKind.EVALUATION, seconds=10.0),
           e(EventKind.STARTUP, attempt=0, seconds=20.0, num_devices=8), e(EventKind.RESUME, attempt=0, step=-1),
           *(e(EventKind.STEP, attempt=0, step=s, seconds=1.0) for s in range(1, 281))]
    figures = summarize(log)
    assert figures.allocated_seconds == 310.0
    assert figures.device_hours * 3600 == pytest.approx(10 * 1 + 300 * 8, rel=1e-12)


def test_a_start_up_that_names_negative_devices_is_not_read(tmp_path) -> None:
    (tmp_path / "events-attempt-0.jsonl").write_text(
        Event(kind=EventKind.STARTUP, at=1.0, seconds=2.0).to_json().replace('"num_devices": 0', '"num_devices": -2') + "\n"
        + Event(kind=EventKind.STARTUP, at=2.0, attempt=0, seconds=3.0, num_devices=2).to_json() + "\n")
    assert [x.num_devices for x in events.read(tmp_path)] == [2]


def test_groups_weigh_their_device_time_where_their_device_counts_changed() -> None:
    """Group 0: 100 s on 2 devices, 80 productive. Group 1: 50 s on 2 devices, then run again 50 s
    on 6, 20 s productive: 400 device-seconds against group 0's 200. Weighted by the largest count
    (6 against 2) its goodput read 0.35."""
    second = [e(EventKind.ALLOCATION, seconds=50.0, num_devices=2), e(EventKind.ALLOCATION, seconds=50.0, num_devices=6),
              e(EventKind.RESUME, attempt=0, step=-1), *(e(EventKind.STEP, attempt=0, step=s, seconds=1.0) for s in range(1, 21))]
    stage = summarize_stage([group(100.0, 2, range(1, 81)), second])
    assert stage.goodput == pytest.approx((200 * 0.8 + 400 * 0.2) / 600, rel=1e-12)
    assert stage.device_hours == pytest.approx(600 / 3600, rel=1e-12)
    assert stage.allocated_seconds == pytest.approx(100.0, rel=1e-12)


def test_a_group_that_ended_early_held_its_devices_to_the_stages_end() -> None:
    """4 + 4 devices; group 1 spent its restarts after 50 of group 0's 100 s: its devices stayed
    booked for the stage (they read 75 s allocated and goodput 1.0)."""
    stage = summarize_stage([group(100.0, 4, range(1, 101)), group(50.0, 4, range(1, 51))])
    assert (stage.allocated_seconds, stage.productive_seconds) == (100.0, 75.0)
    assert stage.other_seconds == 25.0 and stage.device_hours == pytest.approx(800 / 3600, rel=1e-12)


def test_a_healed_group_after_a_spike_restart_wasted_every_step_past_the_rewind() -> None:
    """Both groups trained steps 1-150; the desk's spike restart rewound them to step 100 (the
    supervisor's REWIND event names the first attempt on the rewound lineage); group 0 trained
    101-200, group 1 came back late and healed at 121, or resumed from group 0's checkpoint at 120
    on the rewound lineage. Group 1's steps 101-150 were set aside with the lineage: 50 wasted (the
    first attempt's first step or checkpoint said 30)."""
    def rewound(healed_from: int, *, resumed: int = 100, failed_between: bool = False) -> list[Event]:
        trained = 2 if failed_between else 1
        between = [e(EventKind.RESUME, attempt=1, step=resumed),  # it could not start: an interruption of its own
                   e(EventKind.INTERRUPTION, attempt=1, planned=False, detail="not_started")] if failed_between else []
        return [e(EventKind.ALLOCATION, seconds=400.0, num_devices=1), e(EventKind.RESUME, attempt=0, step=-1),
                *(e(EventKind.STEP, attempt=0, step=s, seconds=1.0) for s in range(1, 151)),
                e(EventKind.INTERRUPTION, attempt=0, planned=True, detail="spike_restart"),
                e(EventKind.REWIND, attempt=1, step=100, detail="proposal-1"), *between,
                e(EventKind.RESUME, attempt=trained, step=resumed),
                *(e(EventKind.STEP, attempt=trained, step=s, seconds=1.0) for s in range(healed_from, 201))]
    assert summarize(rewound(101)).num_wasted_steps == 50 and summarize(rewound(121)).num_wasted_steps == 50
    assert summarize(rewound(121, resumed=120)).num_wasted_steps == 50
    assert summarize(rewound(121, failed_between=True)).num_wasted_steps == 50
    # At the rewind's step exactly: step 100 stands, 101 does not.
    steps = [x for x in rewound(121) if x.kind is EventKind.STEP and x.attempt == 0]
    assert [s.step for s in steps if _is_wasted(rewound(121), s)][:1] == [101]


def _is_wasted(log: list[Event], step: Event) -> bool:
    from ito_assets.runtime.record.goodput import _restart_points, _wasted

    return _wasted(step, _restart_points(log))


def test_a_rewind_applied_between_attempts_wastes_the_steps_past_it() -> None:
    """The attempt died; the desk's restart to step 50 was applied before the next one, which
    healed forward to step 81: no spike interruption, but every step past 50 was set aside."""
    log = [e(EventKind.RESUME, attempt=0, step=-1), *(e(EventKind.STEP, attempt=0, step=s, seconds=1.0) for s in range(1, 100)),
           e(EventKind.INTERRUPTION, attempt=0, planned=False, detail="dead"),
           e(EventKind.REWIND, attempt=1, step=50, detail="proposal-2"),
           e(EventKind.RESUME, attempt=1, step=50), *(e(EventKind.STEP, attempt=1, step=s, seconds=1.0) for s in range(81, 120))]
    assert summarize(log).num_wasted_steps == 49
    # A rewind recorded for a later attempt leaves the steps of that attempt and after it alone.
    assert summarize([*log, e(EventKind.REWIND, attempt=1, step=10, detail="proposal-3")]).num_wasted_steps == 89


def test_weighted_buckets_never_leave_other_below_zero() -> None:
    """Each group's buckets sum to its window; their weighted means missed it by 1.1e-16."""
    a = [e(EventKind.ALLOCATION, seconds=0.8, num_devices=1), e(EventKind.STARTUP, seconds=0.7),
         e(EventKind.RESUME, step=-1), e(EventKind.STEP, step=1, seconds=0.1)]
    b = [e(EventKind.ALLOCATION, seconds=0.8, num_devices=3), e(EventKind.STARTUP, seconds=0.8),
         e(EventKind.RESUME, step=-1), e(EventKind.STEP, step=1, seconds=0.0)]
    stage = summarize_stage([a, b])
    assert stage.other_seconds >= 0.0 and stage.goodput <= 1.0


def test_no_group_at_all_is_an_empty_stage() -> None:
    assert summarize_stage([]) == summarize([]) and summarize_run({"pretraining": []}).allocated_seconds == 0.0


def _write(folder: Path, log: list[Event], at: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for event in log:
        events.append(folder, Event(**{**event.__dict__, "at": at}))


def test_the_tables_rows_and_the_stages_goodput_read_every_groups_folder(tmp_path) -> None:
    stage_dir = tmp_path / "pretraining"
    _write(stage_dir, group(100.0, 2, range(1, 81)), 1_000.0)
    _write(events.replica_dir(stage_dir, 1), restarted_group(2, first_steps=range(1, 21), resumed=-1, healed_from=51), 1_000.0)
    # Not a group's folder: neither read nor a reason to fail.
    (stage_dir / "replica-x").mkdir()
    (stage_dir / "replica-3").write_text("")
    rows = {row["stage"]: row for row in rows_for_run("p", {"pretraining": stage_dir})}
    assert rows["pretraining"]["goodput"] == 0.65 and rows["run"]["goodput"] == 0.65
    assert rows["run"]["device_hours"] == pytest.approx(400 / 3600, rel=1e-12)
    assert ("pretraining/goodput" in {name for _, name, _ in stage_metrics("pretraining", stage_dir, {})})
    assert [v for _, name, v in stage_metrics("pretraining", stage_dir, {}) if name == "pretraining/goodput"] == [0.65]


def test_groups_are_read_in_the_order_of_their_numbers(tmp_path) -> None:
    stage_dir = tmp_path / "stage"
    for number in (0, 1, 2, 10):
        _write(events.replica_dir(stage_dir, number), [e(EventKind.ALLOCATION, seconds=1.0, num_devices=number + 1)], 5.0)
    assert [log[0].num_devices for log in events.read_groups(stage_dir)] == [1, 2, 3, 11]
    assert events.read_groups(tmp_path / "absent") == [[]]
    # Not a group's own folder: another spelling of a number, a link to a folder elsewhere.
    _write(stage_dir / "replica-01", [e(EventKind.ALLOCATION, seconds=1.0, num_devices=99)], 5.0)
    _write(tmp_path / "elsewhere", [e(EventKind.ALLOCATION, seconds=1.0, num_devices=98)], 5.0)
    (stage_dir / "replica-3").symlink_to(tmp_path / "elsewhere")
    assert [log[0].num_devices for log in events.read_groups(stage_dir)] == [1, 2, 3, 11]


def test_the_start_up_of_a_stage_run_again_is_start_up_and_a_restarts_is_recovery() -> None:
    """Attempts 0-1 under one supervisor (1 a restart, its start-up inside its recovery), then the
    stage run again: attempt 2, a new supervisor's first, has no recovery. Its 7 s of start-up were
    filed as other."""
    log = [e(EventKind.STARTUP, attempt=0, seconds=5.0), e(EventKind.INTERRUPTION, attempt=0, planned=False, seconds=1.0),
           e(EventKind.STARTUP, attempt=1, seconds=3.0), e(EventKind.RECOVERY, attempt=1, seconds=4.0),
           e(EventKind.STARTUP, attempt=2, seconds=7.0), e(EventKind.ALLOCATION, seconds=30.0, num_devices=1)]
    telemetry = summarize(log)
    assert (telemetry.startup_seconds, telemetry.recovery_seconds) == (12.0, 5.0)
    assert telemetry.other_seconds == 30.0 - 17.0


@st.composite
def group_log(draw) -> list[Event]:
    """One group's log: attempts that fail, heal, rewind or run again, some with no allocation."""
    log, attempt_seconds = [], st.integers(min_value=0, max_value=30)
    for attempt in range(draw(st.integers(min_value=1, max_value=3))):
        if attempt:
            log += [e(EventKind.INTERRUPTION, attempt=attempt - 1, planned=draw(st.booleans()), seconds=draw(attempt_seconds),
                      detail=draw(st.sampled_from(["spike_restart", "dead", "hung"]))),
                    e(EventKind.RECOVERY, attempt=attempt, seconds=draw(attempt_seconds))]
            if draw(st.booleans()):
                log.append(e(EventKind.REWIND, attempt=attempt, step=draw(st.integers(min_value=0, max_value=5))))
        log += [e(EventKind.STARTUP, attempt=attempt, seconds=draw(attempt_seconds), num_devices=draw(st.sampled_from([0, 2]))),
                e(EventKind.RESUME, attempt=attempt, step=draw(st.integers(min_value=-1, max_value=5)))]
        first = draw(st.integers(min_value=1, max_value=10))
        log += [e(EventKind.STEP, attempt=attempt, step=s, seconds=draw(attempt_seconds))
                for s in range(first, first + draw(st.integers(min_value=0, max_value=5)))]
    if draw(st.booleans()):
        log.append(e(EventKind.ALLOCATION, seconds=draw(st.integers(min_value=0, max_value=300)), num_devices=2))
    return log


@settings(max_examples=examples(200, 5000), deadline=None)
@given(st.lists(group_log(), min_size=1, max_size=4))
def test_a_stages_figures_over_any_groups_keep_their_bounds(groups) -> None:
    stage = summarize_stage(groups)
    buckets = [stage.productive_seconds, stage.startup_seconds, stage.checkpoint_blocking_seconds,
               stage.recovery_seconds, stage.wasted_step_seconds, stage.evaluation_seconds, stage.other_seconds]
    assert min(buckets) >= 0 and 0 <= stage.goodput <= 1
    assert stage.allocated_seconds == pytest.approx(sum(buckets), rel=1e-12, abs=1e-9)
    # Every allocation and start-up that says its devices says 2; a group without either has its
    # peers' (1 where no group has one), a stage of one group without either has none.
    known = any(x.num_devices for log in groups for x in log)
    devices = (2 if known else 1) * len(groups) if len(groups) > 1 else (2 if known else 0)
    assert stage.device_hours * 3600 == pytest.approx(stage.allocated_seconds * devices, rel=1e-9, abs=1e-9)
    assert stage.num_unplanned_interruptions + stage.num_planned_interruptions == sum(
        1 for log in groups for x in log if x.kind is EventKind.INTERRUPTION)
