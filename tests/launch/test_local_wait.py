"""The supervisor waits on this machine's launchers between polls: it wakes as soon as one more
node exits, not a whole poll interval later, and never spins on a node that had already exited."""

from __future__ import annotations

import subprocess
import sys
import time

from ito_assets.launch.local import LocalAttempt


def _attempt(tmp_path, *durations: float) -> LocalAttempt:
    processes = [subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({d})"]) for d in durations]
    return LocalAttempt(number=0, processes=processes, launched_at=time.time(), log_path=tmp_path / "log",
                        worker_module="ito_assets.runtime.worker.main")


def _stop(attempt: LocalAttempt) -> None:
    for process in attempt.processes:
        process.kill()
        process.wait()


def test_a_node_that_exits_ends_the_wait_long_before_the_interval(tmp_path):
    attempt = _attempt(tmp_path, 0.3, 60)
    try:
        started = time.monotonic()
        attempt.wait(30.0)
        assert time.monotonic() - started < 15.0  # the 0.3 s node's exit, not the 30 s interval
        assert attempt.processes[0].poll() == 0 and attempt.exit_code() is None
    finally:
        _stop(attempt)


def test_the_wait_lasts_its_interval_while_every_node_runs_or_an_earlier_one_has_exited(tmp_path):
    attempt = _attempt(tmp_path, 0, 60)
    try:
        attempt.processes[0].wait()  # exited cleanly before the wait began
        for timeout in (0.0, 0.3):
            started = time.monotonic()
            attempt.wait(timeout)
            assert time.monotonic() - started >= timeout
        assert attempt.exit_code() is None  # the other node still runs
    finally:
        _stop(attempt)
