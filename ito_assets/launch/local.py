"""This machine: `torch.distributed.run` and the workers it spawns.

One rank: the worker alone, hosting its own store; torchrun's agent would add seconds of start-up
and nothing else, since restarts are the supervisor's. One node: a standalone torchrun. Several
nodes on this machine (the multi-node path exercised for real on loopback): one torchrun launcher
per node, joined by a c10d rendezvous on a free loopback port, with a rendezvous id per attempt so
that a restarted attempt never meets the old one's ranks.

torchrun runs in its own session; it starts every worker in a session of its own as well, so the
workers are found by the pids in their heartbeats. A heartbeat is a file anyone who can write the
folder can forge, and a pid may have been recycled: a pid is signalled only while its process's
initial environment (/proc/<pid>/environ, readable for our own processes only) holds the attempt's
random launch id, which every launcher and the workers they spawn inherit and no other run's
process has. Termination is SIGTERM first (torchrun forwards it; the workers flush
a checkpoint), then SIGKILL to whatever is left after the grace period.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ito_assets.launch.spec import LaunchSpec, direct_command, torchrun_command


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_commands(spec: LaunchSpec) -> list[list[str]]:
    """The launch command of every node: the worker itself where it is the only rank, one
    standalone torchrun for one node, or `nnodes` identical launchers meeting at a c10d rendezvous
    on a free loopback port."""
    if spec.world_size == 1:
        return [direct_command(spec)]
    if spec.nnodes == 1:
        return [torchrun_command(spec, standalone=True)]
    loopback = replace(spec, rdzv_host="127.0.0.1", rdzv_port=_free_port())
    return [torchrun_command(loopback)] * spec.nnodes


# How often a waiting supervisor asks whether a launcher exited: a finished or dead attempt is
# seen within this, not a whole poll interval (5 s by default) later; a waitpid costs microseconds.
EXIT_CHECK_S = 0.05


@dataclass
class LocalAttempt:
    """An attempt on this machine (`ito_assets.launch.backend.Attempt`)."""

    number: int
    processes: list[subprocess.Popen]  # one launcher per node
    launched_at: float  # Unix seconds
    log_path: Path
    worker_module: str  # the worker the attempt runs
    launch_id: str = ""  # LAUNCH_ID_ENV of every process of the attempt: only such pids are ever signalled

    def exit_code(self) -> int | None:
        """The first non-zero exit of any node (a dead rank ends the attempt), 0 once every node
        exited cleanly, None while one still runs."""
        codes = [p.poll() for p in self.processes]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            return failed[0]
        return None if None in codes else 0

    def wait(self, timeout_s: float) -> None:
        """Until one more node's launcher exits or `timeout_s` passes (a waitpid every EXIT_CHECK_S).
        A node that had already exited cleanly while others run does not end the wait: that would
        spin the supervisor's poll until the last node exits."""
        running = [p for p in self.processes if p.poll() is None]
        deadline = time.monotonic() + timeout_s
        while running and all(p.poll() is None for p in running):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(EXIT_CHECK_S, left))

    def terminate(self, worker_pids: set[int], *, grace_s: float) -> float:
        return terminate(self, worker_pids, grace_s=grace_s)

    def release(self) -> None:
        """Processes that exited hold nothing."""


# What torchrun tells its ranks. A world of one started alone must not inherit them from a parent
# that is itself a rank (or a shell that set them): it would wait for ranks that never come.
RANK_ENVIRONMENT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


# Names the attempt in its processes' environment: set last, so that nothing inherited overrides it.
LAUNCH_ID_ENV = "ITO_LAUNCH_ID"


def start(commands: list[list[str]], *, number: int, log_path: Path, worker_module: str,
          env: dict[str, str] | None = None, alone: bool = False) -> LocalAttempt:
    """Run every node's command in a session of its own, all writing to `log_path`; `alone`: the
    one command is a world of one, started without the rank environment of this process."""
    launched_at = time.time()
    launch_id = secrets.token_hex(16)
    inherited = {k: v for k, v in os.environ.items() if not (alone and k in RANK_ENVIRONMENT)}
    processes = []
    with open(log_path, "ab") as log:
        for command in commands:
            processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                              env={**inherited, **(env or {}), LAUNCH_ID_ENV: launch_id}))
    return LocalAttempt(number=number, processes=processes, launched_at=launched_at, log_path=log_path,
                        worker_module=worker_module, launch_id=launch_id)


def _is_worker(pid: int, launch_id: str) -> bool:
    """Whether `pid` runs in the attempt whose launch id is `launch_id`: not a recycled pid, not
    another run's worker, not a process of another user (its environ is unreadable)."""
    if not launch_id:
        return False
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{LAUNCH_ID_ENV}={launch_id}".encode() in environ.split(b"\0")


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


def _running(pids: set[int], launch_id: str) -> bool:
    return any(_is_worker(pid, launch_id) and not _zombie(pid) for pid in pids)


def terminate(attempt: LocalAttempt, worker_pids: set[int], *, grace_s: float, poll_s: float = 0.05) -> float:
    """SIGTERM the launchers and the workers, SIGKILL them after `grace_s`; returns seconds spent."""
    started = time.monotonic()
    launch_id = attempt.launch_id
    workers = {pid for pid in worker_pids if _is_worker(pid, launch_id)}
    launchers = [p for p in attempt.processes if p.poll() is None]
    for process in launchers:
        _signal_group(process.pid, signal.SIGTERM)
    for pid in workers:
        _signal_group(pid, signal.SIGTERM)
    deadline = started + grace_s
    while time.monotonic() < deadline and (any(p.poll() is None for p in launchers) or _running(workers, launch_id)):
        time.sleep(poll_s)
    for process in attempt.processes:
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGKILL)
    for pid in workers:
        if _is_worker(pid, launch_id):
            _signal_group(pid, signal.SIGKILL)
    for process in attempt.processes:
        process.wait()
    return time.monotonic() - started


class LocalBackend:
    def start(self, spec: LaunchSpec, *, number: int, log_path: Path) -> LocalAttempt:
        return start(node_commands(spec), number=number, log_path=log_path, worker_module=spec.module,
                     env=dict(spec.env), alone=spec.world_size == 1)
