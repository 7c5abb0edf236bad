"""The code reward is 1.0 only when the tests ran to their end: exits, overrides and detached
processes of the program under test do not change that."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ito_assets.posttraining import rewards
from ito_assets.posttraining.rewards import process_namespace_available, run_code_tests, score
from ito_assets.posttraining.tasks import code_tasks

TASK = code_tasks(seed=5, count=1)[0]  # def f(x): return x * x - 6


def test_every_reference_answer_still_passes():
    tasks = code_tasks(seed=1, count=30)
    assert {t.answer.split(" ")[0] for t in tasks} >= {"x", "max(x,"}
    assert all(score(task, task.answer) == 1.0 for task in tasks)
    assert score(TASK, "x * x") == 0.0


@pytest.mark.parametrize("exit_early", [
    "import os; os._exit(0)",
    "raise SystemExit(0)",
    "import sys; sys.exit()",
    "import atexit, os; atexit.register(os._exit, 0)",
])
def test_a_program_that_exits_before_its_tests_scores_zero(exit_early):
    assert score(TASK, f"0\n{exit_early}") == 0.0
    assert not run_code_tests(f"def f(x):\n    return 0\n{exit_early}\n", "assert f(1) == 2").passed


def test_a_value_equal_to_anything_scores_zero():
    assert score(TASK, "type('Any', (), {'__eq__': lambda self, other: True})()") == 0.0
    assert score(TASK, "type('Int', (int,), {'__eq__': lambda self, other: True})(0)") == 0.0


@pytest.mark.parametrize("override", [
    "import builtins\nbuiltins.type = lambda value: int\nbuiltins.AssertionError = KeyboardInterrupt",
    "type = lambda value: int",
    "import sys\nsys.settrace(lambda frame, event, arg: None)",
])
def test_overrides_made_by_the_program_do_not_reach_its_tests(override):
    assert score(TASK, f"0\n{override}") == 0.0
    assert score(TASK, f"{TASK.answer}\n{override}") == 1.0


def test_the_program_sees_neither_its_tests_nor_the_stdin_that_carried_them():
    assert run_code_tests("import os, sys\nassert os.listdir('.') == [] and sys.stdin.read() == ''\n").passed


def _write_later(marker: Path, *, detach: bool, wait: float) -> str:
    """A program that leaves a process behind which writes `marker` after `wait` seconds."""
    return (
        "import os, time\n"
        "if os.fork() == 0:\n"
        f"    {'os.setsid()' if detach else 'pass'}\n"
        f"    time.sleep({wait})\n"
        f"    open({str(marker)!r}, 'w').close()\n"
        "    os._exit(0)\n"
    )


@pytest.mark.skipif(not process_namespace_available(), reason="needs unprivileged user namespaces")
@pytest.mark.parametrize("hang", [False, True])
def test_a_detached_process_does_not_outlive_the_program(tmp_path, hang):
    marker = tmp_path / "left-running"
    # The process left behind writes after the program's end (0.1 s) or its timeout (0.5 s).
    program = _write_later(marker, detach=True, wait=1.0 if hang else 0.5) + ("time.sleep(30)\n" if hang else "")
    result = run_code_tests(program, timeout=0.5 if hang else rewards.CODE_TIMEOUT_SECONDS)
    assert result.timed_out == hang and result.process_namespace
    time.sleep(1.0)
    assert not marker.exists()


def test_without_namespaces_its_process_group_still_goes_with_it(tmp_path, monkeypatch):
    monkeypatch.setattr(rewards, "_isolation", lambda: ())
    marker = tmp_path / "left-running"
    result = run_code_tests(_write_later(marker, detach=False, wait=0.5))
    assert result.passed and not result.network_namespace
    time.sleep(1.0)
    assert not marker.exists()


@pytest.mark.skipif(not process_namespace_available(), reason="needs unprivileged user namespaces")
def test_the_parents_start_up_environment_is_out_of_reach():
    # /proc/<pid>/environ holds what a process was started with, so the canary must be there at start.
    scan = (
        "import os\nfound = b''\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n        found += open(f'/proc/{pid}/environ', 'rb').read()\n"
        "    except OSError:\n        pass\n"
        "assert b'ITO_CANARY_SECRET' not in found\n"
    )
    parent = f"from ito_assets.posttraining.rewards import run_code_tests\nassert run_code_tests({scan!r}).passed\n"
    env = {**os.environ, "ITO_CANARY_SECRET": "canary"}
    done = subprocess.run([sys.executable, "-c", parent], env=env, cwd=Path(__file__).parents[2], timeout=60)
    assert done.returncode == 0
