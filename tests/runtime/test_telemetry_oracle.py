"""Run telemetry against an independent oracle, on generated multi-stage, multi-attempt logs.

Attempts are numbered from 0 in every stage, so the run's figures must look a resume up by
(stage, attempt). The oracle keeps each stage's surviving steps on a stack: an attempt that goes on
from step c (its checkpoint's, or the quorum's where it healed from peers), or the desk's spike
restart to step c before it, pops every kept step after c (wasted: done again, or set aside); what
is left at the end is productive. Whole
seconds keep every sum exact in floats."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ito_assets.defs.telemetry.table import rows_for_run
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import Event, EventKind

# The post-training stages write the same kinds of events (ito_assets.posttraining.timeline).
STAGES = ("pretraining", "mid_training", "long_context", "sft", "dpo", "rlvr")
POSTTRAINING = {"sft", "dpo", "rlvr"}
seconds = st.integers(min_value=0, max_value=50)


@st.composite
def stage_log(draw) -> tuple[list[Event], dict[str, int]]:
    """One stage's events, and what the oracle says of them."""
    e = lambda kind, **f: Event(kind=kind, at=0.0, **f)
    log, kept, wasted, checkpoints = [], [], 0, [-1]
    startup = recovery = blocking = evaluation = 0
    for attempt in range(draw(st.integers(min_value=1, max_value=4))):
        resumed = -1 if attempt == 0 else draw(st.sampled_from(checkpoints))
        # How the attempt began: the stage's first; a restart after a failure; the desk's spike
        # restart (a rewind); the stage run again by another supervisor (no recovery).
        begun = "first" if attempt == 0 else draw(st.sampled_from(["failure", "rewind", "again"]))
        taken = draw(seconds)
        if begun in ("first", "again"):
            startup += taken
            log.append(e(EventKind.STARTUP, attempt=attempt, seconds=taken))
        else:  # a restart's start-up lies inside its recovery, which is the badput counted, with the
            spent = draw(seconds)  # failure's detection before it
            detected = draw(seconds)
            recovery += detected + spent
            detail = "spike_restart" if begun == "rewind" else "dead"
            log += [e(EventKind.INTERRUPTION, attempt=attempt - 1, planned=begun == "rewind", seconds=detected, detail=detail),
                    e(EventKind.STARTUP, attempt=attempt, seconds=min(taken, spent)),
                    e(EventKind.RECOVERY, attempt=attempt, seconds=spent)]
        # The desk's spike restart to a checkpoint: every step past it is set aside, whatever the
        # attempt then resumes from (a later checkpoint of the rewound lineage) or heals forward to.
        rewind = draw(st.sampled_from(checkpoints)) if begun == "rewind" else None
        if rewind is not None:
            log.append(e(EventKind.REWIND, attempt=attempt, step=rewind))
        log.append(e(EventKind.RESUME, attempt=attempt, step=resumed))
        # A replica group healed from its peers goes on from the quorum's step, ahead of its
        # checkpoint: the steps before it stand. An attempt that trains nothing goes on from its checkpoint.
        first = max(resumed, 0) + 1 + (0 if attempt == 0 else draw(st.integers(min_value=0, max_value=3)))
        last = draw(st.integers(min_value=first - 1, max_value=first + 7))
        point = resumed if last < first else first - 1
        point = point if rewind is None else min(point, rewind)
        while kept and kept[-1][0] > point:
            wasted += kept.pop()[1]
        for step in range(first, last + 1):
            step_seconds = draw(seconds)
            kept.append((step, step_seconds))
            log.append(e(EventKind.STEP, attempt=attempt, step=step, seconds=step_seconds))
            if draw(st.booleans()):
                block = draw(seconds)
                blocking += block
                checkpoints.append(step)
                log.append(e(EventKind.CHECKPOINT, attempt=attempt, step=step, seconds=block, total_seconds=block,
                             num_bytes=1))
    evaluation = draw(seconds)
    log.append(e(EventKind.EVALUATION, attempt=attempt, seconds=evaluation))
    productive = sum(s for _, s in kept)
    used = productive + wasted + startup + recovery + blocking + evaluation
    allocated = used + draw(seconds)  # the supervisor's window holds everything, plus idle time
    log.insert(0, e(EventKind.ALLOCATION, seconds=allocated, num_devices=1))
    return log, {"productive": productive, "wasted": wasted, "allocated": allocated, "steps": len(kept),
                 "startup": startup, "recovery": recovery}


def _placed(log: list[Event], ends_at: float) -> list[Event]:
    """The stage's allocation as the supervisor writes it, ending at `ends_at`, and its events
    inside it (each ending there too: within the window whatever its seconds)."""
    return [replace(e, at=ends_at) for e in log]


@settings(max_examples=60, deadline=None)
@given(st.lists(stage_log(), min_size=1, max_size=len(STAGES)), st.lists(seconds, min_size=5, max_size=5))
def test_the_run_row_matches_the_oracle_and_no_bucket_is_negative(stages, gaps) -> None:
    with tempfile.TemporaryDirectory() as folder:
        stage_dirs, cursor = {}, 1_800_000_000.0  # whole seconds: every sum stays exact
        for index, (name, (log, truth)) in enumerate(zip(STAGES, stages)):
            cursor += truth["allocated"]
            stage_dirs[name] = Path(folder) / name
            stage_dirs[name].mkdir()
            for event in _placed(log, cursor):
                events.append(stage_dirs[name], event)
            cursor += gaps[index] if index < len(gaps) else 0
        rows = {row["stage"]: row for row in rows_for_run("p", stage_dirs)}
    truths = [truth for _, truth in stages]
    idle = sum(gaps[: len(stages) - 1])  # between stages; none after the last
    for name, truth in zip(STAGES, truths):
        assert rows[name]["productive_seconds"] == truth["productive"]
        assert rows[name]["badput_wasted_step_seconds"] == truth["wasted"]
        assert rows[name]["badput_startup_seconds"] == truth["startup"]
        assert rows[name]["badput_recovery_seconds"] == truth["recovery"]
    run = rows["run"]
    assert run["productive_seconds"] == sum(t["productive"] for t in truths)
    assert run["badput_wasted_step_seconds"] == sum(t["wasted"] for t in truths)
    assert run["num_steps"] == sum(t["steps"] for t in truths)
    assert run["badput_idle_seconds"] == idle and all(rows[n]["badput_idle_seconds"] == 0 for n in STAGES[: len(stages)])
    assert run["allocated_seconds"] == sum(t["allocated"] for t in truths) + idle
    assert run["posttraining_seconds"] == sum(t["allocated"] for name, t in zip(STAGES, truths) if name in POSTTRAINING)
    assert run["device_hours"] == pytest.approx(run["allocated_seconds"] / 3600, rel=1e-12)  # one device throughout
    buckets = [v for k, v in run.items() if k.startswith("badput_")] + [run["productive_seconds"]]
    assert min(buckets) >= 0 and sum(buckets) == run["allocated_seconds"]


def test_one_stages_restart_never_wastes_another_stages_steps(tmp_path) -> None:
    """Concatenated, the two logs read as one: stage b's resume wasted 3 of stage a's steps (4/16)."""
    e = lambda kind, **f: Event(kind=kind, at=0.0, **f)
    first = [e(EventKind.ALLOCATION, seconds=8, num_devices=1), e(EventKind.RESUME, attempt=0, step=-1),
             *[e(EventKind.STEP, attempt=0, step=s, seconds=1) for s in (1, 2, 3, 4)]]
    second = [e(EventKind.ALLOCATION, seconds=8, num_devices=1), e(EventKind.RESUME, attempt=0, step=-1),
              *[e(EventKind.STEP, attempt=0, step=s, seconds=1) for s in (1, 2)],
              e(EventKind.RESUME, attempt=1, step=1), *[e(EventKind.STEP, attempt=1, step=s, seconds=1) for s in (2, 3)]]
    stage_dirs = {"pretraining": tmp_path / "a", "mid_training": tmp_path / "b"}
    for (name, folder), log in zip(stage_dirs.items(), (first, second)):
        folder.mkdir()
        for event in log:
            events.append(folder, event)
    run = {row["stage"]: row for row in rows_for_run("p", stage_dirs)}["run"]
    assert run["goodput"] == 7 / 16 and run["badput_wasted_step_seconds"] == 1


def test_overlapping_windows_are_not_idle_and_a_gap_is_counted_at_the_runs_devices(tmp_path) -> None:
    from ito_assets.runtime.record.goodput import _idle_seconds, summarize_run

    assert _idle_seconds([(0, 10), (5, 12), (20, 30)]) == 8  # 12 -> 20
    assert _idle_seconds([(0, 10), (10, 20)]) == 0 and _idle_seconds([]) == 0
    e = lambda at, seconds, devices: Event(kind=EventKind.ALLOCATION, at=at, seconds=seconds, num_devices=devices)
    run = summarize_run({"a": [[e(100.0, 100.0, 8)]], "b": [[e(400.0, 100.0, 4)]]})  # 200 s idle between them
    assert (run.idle_seconds, run.allocated_seconds) == (200.0, 400.0)
    assert run.device_hours == pytest.approx((100 * 8 + 100 * 4 + 200 * 8) / 3600, rel=1e-12)


def test_a_killed_supervisors_work_is_not_idle_too() -> None:
    """pretraining 0-100 s; mid_training's first supervisor trained 100-200 s and was killed before
    it wrote its allocation; the retry's ran 200-300 s. Every second was a productive step: its
    stage's allocation counts the killed one's seconds, so the run's idle must not count them again
    (it said 400 s allocated, 100 idle, goodput 0.75)."""
    from ito_assets.runtime.record.goodput import summarize_run

    def stage(start: float, attempts: list[tuple[float, float, bool]]) -> list[Event]:
        log = []
        for number, (begin, end, windowed) in enumerate(attempts):
            log += [Event(kind=EventKind.STEP, at=t + 10, attempt=number, step=int(t), seconds=10.0) for t in range(int(begin), int(end), 10)]
            if windowed:
                log.append(Event(kind=EventKind.ALLOCATION, at=end, seconds=end - begin, num_devices=8))
        return log

    run = summarize_run({"pretraining": [stage(0, [(0, 100, True)])],
                         "mid_training": [stage(100, [(100, 200, False), (200, 300, True)])]})
    assert (run.allocated_seconds, run.idle_seconds, run.productive_seconds) == (300.0, 0.0, 300.0)
    assert run.goodput == 1.0
    # A real gap between the stages is still idle.
    gap = summarize_run({"pretraining": [stage(0, [(0, 100, True)])],
                         "mid_training": [stage(150, [(150, 200, False), (200, 300, True)])]})
    assert (gap.allocated_seconds, gap.idle_seconds) == (300.0, 50.0)


def test_a_table_written_before_the_idle_figure_takes_it(tmp_path) -> None:
    from ito_assets.data.warehouse import connect
    from ito_assets.defs.telemetry import table as telemetry_table

    warehouse = tmp_path / "w.duckdb"
    old_columns = [c for c in telemetry_table._COLUMNS if c != "badput_idle_seconds"]
    with connect(warehouse) as connection:
        connection.execute(f"CREATE TABLE {telemetry_table.TABLE} (partition_key VARCHAR, stage VARCHAR, "
                           + ", ".join(f"{c} DOUBLE" for c in old_columns) + ", computed_at DOUBLE)")
    row = {"partition_key": "p", "stage": "run", **{c: 1.0 for c in telemetry_table._COLUMNS}}
    telemetry_table.write(warehouse, "p", [row])
    with connect(warehouse) as connection:
        assert connection.execute(f"SELECT badput_idle_seconds, goodput FROM {telemetry_table.TABLE}").fetchall() == [(1.0, 1.0)]
