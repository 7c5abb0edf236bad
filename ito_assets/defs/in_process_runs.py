"""Runs executed in a command's own process (`ito data prepare`, `make run`) and what is left of
them when that process is killed.

No daemon watches such a run: killed mid-step it stays STARTED for good, and the pool slot its
step held (`duckdb_writer`, one slot) stays claimed, so every later run on the instance waits for
that slot forever. Each in-process run is therefore tagged with the process that executes it
(host, pid and the pid's start time, so a reused pid is not taken for it); before a command
executes a run, `fail_orphaned_runs` marks failed the runs of this host whose process is gone and
frees their slots.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import dagster as dg

# host:pid:start of the process executing the run (start: /proc's clock ticks since boot, or "").
PROCESS_TAG = "ito/in_process"
_UNFINISHED = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]


def _start_time(pid: int) -> str | None:
    """The process's start time as /proc gives it; "" where there is no /proc (then a live pid is
    trusted to be the same process); None when no such process runs."""
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").exists():
        try:
            # The command name (field 2) may hold spaces and parentheses: count fields after its ")".
            return stat.read_text().rsplit(")", 1)[1].split()[19]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return None
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
