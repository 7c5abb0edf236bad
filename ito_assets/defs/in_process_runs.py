"""Runs executed in a command's own process (`ito data prepare`, `make run`) and what is left of
them when that process is killed.

No daemon watches such a run: killed mid-step it stays STARTED for good, and the pool slot its
step held (`duckdb_writer`, one slot) stays claimed, so every later run on the instance waits for
that slot forever. Each in-process run is therefore tagged with the process that executes it
(host, pid and the pid's start time, so a reused pid is not taken for it); before a command
executes a run, `fail_orphaned_runs` marks failed the runs of this host whose process is gone and
frees their slots.

A live run that holds the slot is waited for, but Dagster's in-process executor waits for a slot
without looking at Ctrl-C (it only acts on an interrupt inside a step): `wait_for_pool` does that
wait before the run starts, where Ctrl-C ends the command, and says whom it waits for.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Callable

import dagster as dg

# host:pid:start of the process executing the run (start: /proc's clock ticks since boot, or "").
PROCESS_TAG = "ito/in_process"
_UNFINISHED = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]


def _start_time(pid: int) -> str | None:
    """The process's start time as /proc gives it; "" where there is no /proc (then a live pid is
    trusted to be the same process); None when no such process runs (a zombie, killed but not yet
    reaped by its parent, runs no more)."""
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").exists():
        try:
            # The command name (field 2) may hold spaces and parentheses: count fields after its ")".
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return None
        return None if len(fields) < 20 or fields[0] in ("Z", "X") else fields[19]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # another user's process: alive
        pass
    return ""


def process_tags() -> dict[str, str]:
    """The tag naming this process, for a run it is about to execute."""
    return {PROCESS_TAG: f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid()) or ''}"}


def _gone(value: str) -> bool:
    """Whether the process a PROCESS_TAG value names has ended (always False for another host's)."""
    host, _, rest = value.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return _start_time(int(pid)) != start


def fail_orphaned_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark failed every unfinished in-process run of this host whose process has ended, and free
    the pool slots it held -> their run ids."""
    orphaned = []
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=_UNFINISHED)):
        value = run.tags.get(PROCESS_TAG)
        if value is None or not _gone(value):
            continue
        instance.report_run_failed(run, message="the process executing this run ended before the run did (killed); "
                                                "marked failed and its pool slots freed by the next in-process run")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        orphaned.append(run.run_id)
    return orphaned


def wait_for_pool(instance: dg.DagsterInstance, pool: str, say: Callable[[str], None], poll_s: float = 0.5) -> None:
    """Return once no other run holds or queues for a slot of `pool` (one slot on the embedded
    instance); meanwhile say once which runs it waits for. A holder killed while we wait is
    failed and its slot freed (`fail_orphaned_runs`), so the wait ends with it."""
    said = False
    while True:
        fail_orphaned_runs(instance)
        info = instance.event_log_storage.get_concurrency_info(pool)
        others = sorted(info.active_run_ids | {step.run_id for step in info.pending_steps})  # queued or assigned
        others = [run_id for run_id in others if not _left_behind(instance, pool, run_id)]
        if not others:
            return
        if not said:
            say(f"waiting for the '{pool}' pool: run(s) {', '.join(others)} of this instance hold or queue for its "
                f"slot (another `ito data prepare`, `make run` or a run of `make ui`); Ctrl-C stops this command")
            said = True
        time.sleep(poll_s)


def _left_behind(instance: dg.DagsterInstance, pool: str, run_id: str) -> bool:
    """Whether `run_id`'s claim on `pool` outlived its run (ended, or deleted from the instance):
    then it is freed, not waited for."""
    run = instance.get_run_by_id(run_id)
    if run is not None and not run.is_finished:
        return False
    instance.event_log_storage.free_concurrency_slots_for_run(run_id)
    return True
