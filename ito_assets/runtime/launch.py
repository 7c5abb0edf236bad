"""Starting and stopping one attempt: `torch.distributed.run` and the workers it spawns.

torchrun runs in its own session; it starts every worker in a session of its own as well, so the
workers are found by the pids in their heartbeats (checked against /proc before any signal, so a
recycled pid is never hit). Termination is SIGTERM first (torchrun forwards it; the workers flush
a checkpoint), then SIGKILL to whatever is left after the grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

WORKER_MODULE = "ito_assets.runtime.worker"


def torchrun_command(config_path: Path, nproc_per_node: int) -> list[str]:
    """One node, `nproc_per_node` ranks, no restarts inside torchrun: the supervisor restarts."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc_per_node}",
            "--max-restarts=0", "-m", WORKER_MODULE, "--config", str(config_path)]


@dataclass
class Attempt:
    number: int
    process: subprocess.Popen
    launched_at: float  # Unix seconds
    log_path: Path

    def exit_code(self) -> int | None:
        return self.process.poll()


def start(command: list[str], *, number: int, log_path: Path, env: dict[str, str] | None = None) -> Attempt:
    launched_at = time.time()
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, **(env or {})})
    return Attempt(number=number, process=process, launched_at=launched_at, log_path=log_path)


def _is_worker(pid: int) -> bool:
    try:
        return WORKER_MODULE.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _signal_group(pid: int, number: int) -> None:
    """The process group led by `pid` (torchrun's and each worker's own session), else the process."""
    try:
        os.killpg(pid, number)
    except ProcessLookupError:
        try:
            os.kill(pid, number)
        except ProcessLookupError:
            pass


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def _running(pids: set[int]) -> bool:
    return any(_is_worker(pid) and not _zombie(pid) for pid in pids)


def terminate(attempt: Attempt, worker_pids: set[int], *, grace_s: float, poll_s: float = 0.05) -> float:
    """SIGTERM the launcher and the workers, SIGKILL them after `grace_s`; returns seconds spent."""
    started = time.monotonic()
    workers = {pid for pid in worker_pids if _is_worker(pid)}
    if attempt.exit_code() is None:
        _signal_group(attempt.process.pid, signal.SIGTERM)
    for pid in workers:
        _signal_group(pid, signal.SIGTERM)
    deadline = started + grace_s
    while time.monotonic() < deadline and (attempt.exit_code() is None or _running(workers)):
        time.sleep(poll_s)
    if attempt.exit_code() is None:
        _signal_group(attempt.process.pid, signal.SIGKILL)
    for pid in workers:
        if _is_worker(pid):
            _signal_group(pid, signal.SIGKILL)
    attempt.process.wait()
    return time.monotonic() - started
