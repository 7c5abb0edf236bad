"""Progress on long work: a stage logs where it is at every tenth of its steps, with its rate and
what is left; `make run` prints a line as each run starts and ends."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

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
    assert worker.lines == ["step 40 of 200 (20%), 2.00 steps/s, about 80 s to go"]


def test_a_short_stage_logs_every_step_and_other_ranks_stay_quiet():
    short = _worker(7)
    for step in range(1, 8):
        StageWorker.report_progress(short, step)
    assert len(short.lines) == 7 and short.lines[-1].endswith("(100%), 2.00 steps/s, about 0 s to go")
    quiet = _worker(200, rank=1)
    StageWorker.report_progress(quiet, 20)
    assert quiet.lines == []
