"""Progress on long work: a stage logs where it is at every tenth of its steps, the data plane at
every tenth of its work units, each with its rate and what is left; `make run` prints a line as
each run starts and ends."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ito_assets import progress
from ito_assets.runtime.worker.main import StageWorker


def _worker(num_steps: int, rank: int = 0) -> SimpleNamespace:
    lines: list[str] = []
    return SimpleNamespace(config=SimpleNamespace(num_steps=num_steps), rank=rank, step_seconds=[0.5] * 3,
                           log=lines.append, lines=lines)


@pytest.mark.parametrize("step,logged", [(19, False), (20, True), (21, False), (200, True)])
def test_a_line_at_every_tenth_of_the_steps(step, logged):
    worker = _worker(200)
    StageWorker.report_progress(worker, step)
    assert bool(worker.lines) is logged


def test_the_line_says_where_how_fast_and_how_long():
    worker = _worker(200)
    StageWorker.report_progress(worker, 40)
    assert worker.lines == ["40 of 200 steps (20%), 2 steps/s, about 80 s to go"]


def test_a_short_stage_logs_every_step_and_other_ranks_stay_quiet():
    short = _worker(7)
    for step in range(1, 8):
        StageWorker.report_progress(short, step)
    assert len(short.lines) == 7 and short.lines[-1].endswith("(100%), 2 steps/s, about 0 s to go")
    quiet = _worker(200, rank=1)
    StageWorker.report_progress(quiet, 20)
    assert quiet.lines == []


@pytest.mark.parametrize("total", [1, 7, 10, 25, 200, 1001])
def test_ten_lines_at_most_whatever_the_length_and_always_the_end(total):
    said: list[str] = []
    counter = progress.Progress("dedup signatures", total, "work units", say=said.append, clock=iter(range(10_000)).__next__)
    for _ in range(total):
        counter.advance()
    assert len(said) == min(total, progress.PARTS)
    assert said[-1].startswith(f"[dedup signatures] {total:,} of {total:,} work units (100%), ")


def test_a_tenth_is_crossed_exactly_at_its_boundary():
    # 25 units: the tenths fall at 2.5, 5, 7.5 ...: 3 crosses the first, 2 does not.
    assert not progress.crossed(1, 2, 25)
    assert progress.crossed(2, 3, 25)
    assert not progress.crossed(3, 4, 25)
    assert progress.crossed(4, 5, 25)
    assert progress.crossed(24, 25, 25)
    assert not progress.crossed(0, 0, 25) and not progress.crossed(0, 1, 0)


def test_the_rate_and_time_to_go_come_from_the_clock():
    said: list[str] = []
    ticks = iter([100.0, 104.0])  # started at 100 s; 4 s later, 2 of 4 shards are done
    counter = progress.Progress("exact-copy keys", 4, "source shards", say=said.append, clock=lambda: next(ticks))
    counter.advance(2)
    assert said == ["[exact-copy keys] 2 of 4 source shards (50%), 0.5 source shards/s, about 4 s to go"]


def test_without_a_rate_the_line_says_so():
    assert progress.line(0, 3, "steps", None) == "0 of 3 steps (0%), rate unknown, time to go unknown"


def test_make_runs_bar_follows_a_runs_steps_and_their_log():
    import io
    import uuid

    import dagster as dg

    from ito_assets.local_run import StepBar

    @dg.op
    def first(context) -> int:
        context.log.info("[phase] 1 of 1 work units (100%), 1 work units/s, about 0 s to go")
        return 1

    @dg.op
    def second(context, value: int) -> int:
        return value + 1

    @dg.job
    def two_steps():
        second(first())

    out, run_id = io.StringIO(), str(uuid.uuid4())
    with dg.instance_for_test() as instance:
        bar = StepBar(instance, run_id, len(two_steps.nodes), file=out, disable=False)
        with bar:
            assert two_steps.execute_in_process(instance=instance, run_id=run_id).success
        assert bar.bar.n == bar.bar.total == 2
    shown = out.getvalue()
    assert "2/2" in shown and "second" in shown and "1 of 1 work units" in shown


def test_the_bar_stays_off_where_stdout_is_not_a_terminal():
    import io

    from ito_assets.local_run import StepBar

    bar = StepBar(instance=None, run_id="unused", num_steps=3, file=io.StringIO())  # tqdm: a pipe, no bar
    with bar:
        pass
    assert bar.bar.disable and not bar.thread.is_alive()
