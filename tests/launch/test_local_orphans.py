"""An attempt on this machine never outlives the supervisor that started it, and never runs beside
the next attempt of its stage folder: the launchers and ranks run in sessions of their own, so a
SIGKILLed supervisor (an OOM kill, a node agent killing the Dagster step) takes none of them
along by itself. Nor does a stop leave a process of the attempt behind: a rank its launcher never
passed SIGTERM on to (no heartbeat yet), or a child a rank left running.

The "launchers" and "ranks" here are sleeping Python processes that behave as torchrun's do (each
rank in a session of its own); a supervisor is a child Python process that calls `local.start`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import process_started_at
from ito_assets.launch import local

WORKER = "ito_assets.runtime.worker.main"

# A rank: argv ready file, mode words, CHILD. Writes the ready file (the pid of its child, if any)
# once it ignores SIGTERM where told to, and its child is ready.
RANK = r"""
import os, signal, subprocess, sys, time
ready, mode, child_code = sys.argv[1], sys.argv[2].split(), sys.argv[3]
if "rank-ignores" in mode:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
children = []
if "rank-forks" in mode:  # a child in a session of its own, or in the rank's group
    child = subprocess.Popen([sys.executable, "-c", child_code, ready + ".child"],
                             start_new_session="child-own-session" in mode)
    while not os.path.exists(ready + ".child"):
        time.sleep(0.02)
    children.append(child.pid)
open(ready + ".tmp", "w").write(" ".join(map(str, children)))
os.replace(ready + ".tmp", ready)
time.sleep(120)
"""

# A rank's child that ignores SIGTERM: argv ready file.
CHILD = r"""
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1] + ".tmp", "w").close()
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""

# A launcher: argv pid file, mode words, RANK, CHILD. Starts one rank in a session of its own (as
# torchrun does) and, once it is ready, writes "<launcher pid> <rank pid> [<rank's child pid>]". A
# launcher that "ignores" SIGTERM has a handler that does nothing (SIG_IGN would pass on to the
# rank through exec); it passes nothing on to its rank.
LAUNCHER = r"""
import os, signal, subprocess, sys, time
pid_file, mode = sys.argv[1], sys.argv[2]
if "launcher-ignores" in mode.split():
    signal.signal(signal.SIGTERM, lambda *_: None)
ready = pid_file + ".rank"
rank = subprocess.Popen([sys.executable, "-c", sys.argv[3], ready, mode, sys.argv[4]], start_new_session=True)
while not os.path.exists(ready):
    time.sleep(0.02)
pids = [os.getpid(), rank.pid, *map(int, open(ready).read().split())]
open(pid_file + ".tmp", "w").write(" ".join(map(str, pids)))
os.replace(pid_file + ".tmp", pid_file)
time.sleep(120)
"""


def _launcher(pid_file: Path, mode: str) -> list[str]:
    return [sys.executable, "-c", LAUNCHER, str(pid_file), mode, RANK, CHILD]


# argv: log path, grace seconds, the launcher's command. A supervisor that starts one attempt and
# waits; the test SIGKILLs it.
SUPERVISOR = r"""
import signal, sys, time
from pathlib import Path
from ito_assets.launch import local
# SIGTERM's default action, unblocked, whatever the test process left: a disposition of SIG_IGN and a
# blocked mask pass on through fork and exec to the launchers and ranks, which would then outlive
# the watcher's SIGTERM until its grace ended.
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
local.ORPHAN_GRACE_S = float(sys.argv[2])
local.start([sys.argv[3:]], number=0, log_path=Path(sys.argv[1]), worker_module="ito_assets.runtime.worker.main")
time.sleep(120)
"""


_STARTED: dict[int, float] = {}  # pid -> when the process the test saw under it started


def _pids(pid_file: Path, timeout_s: float = 8.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the launcher never wrote its pids"
        time.sleep(0.02)
    pids = [int(p) for p in pid_file.read_text().split()]
    for pid in pids:
        _STARTED.setdefault(pid, process_started_at(pid))
    return pids


def _alive(pid: int) -> bool:
    """Running, not a zombie, the process the test saw (not a later one under its pid), and one of
    an attempt's (its environment names a launch)."""
    started = process_started_at(pid)
    if started is None or _STARTED.get(pid, started) != started:
        return False
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{local.LAUNCH_ID_ENV}=".encode() in environ


def _all_gone(pids: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(_alive(pid) for pid in pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _kill(pids: list[int]) -> None:
    """The test's own leftovers, whatever the code under test did."""
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _supervisor(tmp_path: Path, mode: str, grace_s: float, folder: str = "stage") -> tuple[subprocess.Popen, Path]:
    stage = tmp_path / folder
    stage.mkdir(exist_ok=True)
    pid_file = stage / "pids"
    child = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(stage / "attempt-0.log"), str(grace_s),
                              *_launcher(pid_file, mode)])
    return child, pid_file


@pytest.mark.parametrize(("mode", "grace_s", "within_s"), [
    # They stop on SIGTERM, inside the 60 s grace. In `make test-long`: in four full suites on
    # 2026-12-06 they were not gone after 10, then 45 s (the watcher had not yet written its line),
    # never alone or under a partial load. Later that day it passed in two full suites (0.3 s), and
    # the test processes' SIGTERM was never ignored or blocked at any test (logged per test), so the
    # supervisor's reset below is not what changed: the cause is still unknown.
    pytest.param("", 60.0, 45.0, marks=pytest.mark.long),
    ("launcher-ignores rank-ignores", 1.0, 6.0),  # they ignore it: SIGKILL after the grace period
])
def test_local_a_sigkilled_supervisor_leaves_no_launcher_or_rank_running(tmp_path, mode, grace_s, within_s):
    child, pid_file = _supervisor(tmp_path, mode, grace_s)
    pids: list[int] = []
    try:
        pids = _pids(pid_file)
        child.kill()  # SIGKILL: no handler, no finally, no atexit
        child.wait()
        log = tmp_path / "stage" / "attempt-0.log"
        assert _all_gone(pids, within_s), (f"still running after the supervisor died: {[p for p in pids if _alive(p)]}; "
                                           f"the attempt's log: {log.read_text()!r}")
        deadline = time.monotonic() + 5
        while "of its attempt in " not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)  # the watcher writes its line once it finds nothing left
        assert "of its attempt in " in log.read_text()  # how long it took, for a slow stop's reader
    finally:
        child.kill()
        child.wait()
        _kill(pids)


def test_local_a_new_start_of_the_stage_first_ends_what_a_killed_supervisor_left(tmp_path, monkeypatch):
    # The old attempt ignores SIGTERM and its supervisor's watch would give it 60 s: a retried
    # step's supervisor must not start its attempt beside it (two writers of one stage folder).
    child, pid_file = _supervisor(tmp_path, "launcher-ignores rank-ignores", 60.0)
    old: list[int] = []
    new = None
    try:
        old = _pids(pid_file)
        child.kill()
        child.wait()
        monkeypatch.setattr(local, "ORPHAN_GRACE_S", 1.0, raising=False)
        new = local.start([[sys.executable, "-c", "import time; time.sleep(60)"]], number=1,
                          log_path=tmp_path / "stage" / "attempt-1.log", worker_module=WORKER)
        assert not [pid for pid in old if _alive(pid)], "the new attempt started beside the old one"
        assert new.processes[0].poll() is None
    finally:
        child.kill()
        child.wait()
        _kill(old)
        if new is not None:
            new.terminate(set(), grace_s=2.0)


def test_local_a_start_leaves_other_folders_and_live_supervisors_attempts_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(local, "ORPHAN_GRACE_S", 1.0, raising=False)
    # Another stage folder's attempt, its supervisor killed (and its own watch long): not this stage's.
    child, pid_file = _supervisor(tmp_path, "launcher-ignores rank-ignores", 60.0, folder="other")
    other: list[int] = []
    mine = again = None
    try:
        other = _pids(pid_file)
        child.kill()
        child.wait()
        # This folder's attempt of a live supervisor (this process): only that supervisor ends it.
        (tmp_path / "stage").mkdir()
        mine = local.start([[sys.executable, "-c", "import time; time.sleep(60)"]], number=0,
                           log_path=tmp_path / "stage" / "attempt-0.log", worker_module=WORKER)
        again = local.start([[sys.executable, "-c", "import time; time.sleep(60)"]], number=1,
                            log_path=tmp_path / "stage" / "attempt-1.log", worker_module=WORKER)
        time.sleep(0.3)
        assert all(_alive(pid) for pid in other)
        assert mine.processes[0].poll() is None
    finally:
        child.kill()
        child.wait()
        _kill(other)
        for attempt in (mine, again):
            if attempt is not None:
                attempt.terminate(set(), grace_s=2.0)


def _attempt(tmp_path: Path, mode: str) -> tuple[local.LocalAttempt, list[int]]:
    pid_file = tmp_path / "pids"
    attempt = local.start([_launcher(pid_file, mode)], number=0,
                          log_path=tmp_path / "attempt-0.log", worker_module=WORKER)
    try:
        return attempt, _pids(pid_file)
    except BaseException:
        attempt.terminate(set(), grace_s=1.0)
        raise


def test_local_a_launcher_that_ignores_sigterm_does_not_leave_its_rank_running(tmp_path):
    # No heartbeat names the rank yet (start-up) and the launcher passes nothing on: torchrun
    # SIGKILLed after the grace period takes no rank in a session of its own along.
    attempt, pids = _attempt(tmp_path, "launcher-ignores")
    try:
        started = time.monotonic()
        attempt.terminate(set(), grace_s=1.0)
        assert time.monotonic() - started < 6.0  # the grace period, not the rank's sleep
        assert _all_gone(pids, 3.0), f"left running: {[p for p in pids if _alive(p)]}"
    finally:
        _kill(pids)


@pytest.mark.parametrize("mode", ["rank-forks child-own-session", "rank-forks"])
def test_local_a_child_a_rank_leaves_behind_is_stopped_with_the_attempt(tmp_path, mode):
    # The child ignores SIGTERM: in a session of its own it is reached by nothing that signals the
    # rank's group; in the rank's group it outlives the rank, whose group is then never SIGKILLed.
    attempt, pids = _attempt(tmp_path, mode)
    try:
        attempt.terminate({pids[1]}, grace_s=1.0)
        assert _all_gone(pids, 3.0), f"left running: {[p for p in pids if _alive(p)]}"
    finally:
        _kill(pids)


ZOMBIE_LAUNCHER = r"""
import os, signal, subprocess, sys, time
# On SIGTERM: exit after a second, never reaping the rank, which exits at once (a zombie meanwhile).
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.0), os._exit(0)))
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
open(sys.argv[1] + ".tmp", "w").write(f"{os.getpid()} {rank.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""


def test_local_a_zombie_rank_does_not_hold_a_stop_for_the_whole_grace_period(tmp_path):
    pid_file = tmp_path / "pids"
    attempt = local.start([[sys.executable, "-c", ZOMBIE_LAUNCHER, str(pid_file)]], number=0,
                          log_path=tmp_path / "attempt-0.log", worker_module=WORKER)
    pids: list[int] = []
    try:
        pids = _pids(pid_file)
        started = time.monotonic()
        attempt.terminate({pids[1]}, grace_s=30.0)
        assert time.monotonic() - started < 6.0
        assert attempt.processes[0].returncode == 0  # it exited on its own, not by SIGKILL
    finally:
        attempt.terminate(set(), grace_s=1.0)
        _kill(pids)


def test_local_a_released_attempts_watcher_is_reaped_not_left_a_zombie(tmp_path):
    attempt = local.start([[sys.executable, "-c", "pass"]], number=0, log_path=tmp_path / "attempt-0.log",
                          worker_module="m", alone=True)
    try:
        for process in attempt.processes:
            process.wait(timeout=10)
        attempt.release()
        assert attempt.watcher.returncode is not None  # waited for: no zombie per attempt
    finally:
        if attempt.watcher.poll() is None:
            attempt.watcher.kill()
