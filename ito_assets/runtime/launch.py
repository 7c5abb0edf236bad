"""Starting and stopping one attempt on this machine (the local back end of
`ito_assets.launch.backend`): `torch.distributed.run` and the workers it spawns; and the choice of
back end for a `LaunchConfig`.

One node: a standalone torchrun. Several nodes on this machine (the multi-node path exercised for
real on loopback): one torchrun launcher per node, joined by a c10d rendezvous on a free loopback
port, with a rendezvous id per attempt so that a restarted attempt never meets the old one's ranks.

torchrun runs in its own session; it starts every worker in a session of its own as well, so the
workers are found by the pids in their heartbeats (checked against /proc before any signal, so a
recycled pid is never hit). Termination is SIGTERM first (torchrun forwards it; the workers flush
a checkpoint), then SIGKILL to whatever is left after the grace period.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ito_assets.launch.backend import Backend, BackendKind, LaunchConfig
from ito_assets.launch.kubernetes import KubernetesBackend
from ito_assets.launch.slurm import SlurmBackend
from ito_assets.launch.spec import LaunchSpec, torchrun_args

WORKER_MODULE = "ito_assets.runtime.worker"


def worker_spec(config_path: Path, *, nnodes: int, nproc_per_node: int, rdzv_id: str) -> LaunchSpec:
    """The worker on the attempt's config: what every back end launches."""
    return LaunchSpec(run_id=rdzv_id, nnodes=nnodes, nproc_per_node=nproc_per_node, module=WORKER_MODULE,
                      args=("--config", str(config_path)))


def torchrun_command(config_path: Path, nproc_per_node: int) -> list[str]:
    """One node, `nproc_per_node` ranks, no restarts inside torchrun: the supervisor restarts."""
    (command,) = node_commands(worker_spec(config_path, nnodes=1, nproc_per_node=nproc_per_node, rdzv_id="standalone"))
    return command


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_commands(spec: LaunchSpec) -> list[list[str]]:
    """The launch command of every node: one standalone torchrun, or `nnodes` identical launchers
    (`ito_assets.launch.spec.torchrun_args`) meeting at a c10d rendezvous on a free loopback port."""
    if spec.nnodes == 1:
        return [[sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc-per-node={spec.nproc_per_node}", "--max-restarts=0", "-m", spec.module, *spec.args]]
    loopback = replace(spec, rdzv_host="127.0.0.1", rdzv_port=_free_port())
    return [[sys.executable, "-m", "torch.distributed.run", *torchrun_args(loopback)]] * spec.nnodes


@dataclass
class Attempt:
    number: int
    processes: list[subprocess.Popen]  # one launcher per node
    launched_at: float  # Unix seconds
    log_path: Path

    def exit_code(self) -> int | None:
        """The first non-zero exit of any node (a dead rank ends the attempt), 0 once every node
        exited cleanly, None while one still runs."""
        codes = [p.poll() for p in self.processes]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            return failed[0]
        return None if None in codes else 0

    def terminate(self, worker_pids: set[int], *, grace_s: float) -> float:
        return terminate(self, worker_pids, grace_s=grace_s)

    def release(self) -> None:
        """Processes that exited hold nothing."""


def start(commands: list[list[str]], *, number: int, log_path: Path, env: dict[str, str] | None = None) -> Attempt:
    launched_at = time.time()
    processes = []
    with open(log_path, "ab") as log:
        for command in commands:
            processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                              env={**os.environ, **(env or {})}))
    return Attempt(number=number, processes=processes, launched_at=launched_at, log_path=log_path)


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
    """SIGTERM the launchers and the workers, SIGKILL them after `grace_s`; returns seconds spent."""
    started = time.monotonic()
    workers = {pid for pid in worker_pids if _is_worker(pid)}
    launchers = [p for p in attempt.processes if p.poll() is None]
    for process in launchers:
        _signal_group(process.pid, signal.SIGTERM)
    for pid in workers:
        _signal_group(pid, signal.SIGTERM)
    deadline = started + grace_s
    while time.monotonic() < deadline and (any(p.poll() is None for p in launchers) or _running(workers)):
        time.sleep(poll_s)
    for process in attempt.processes:
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGKILL)
    for pid in workers:
        if _is_worker(pid):
            _signal_group(pid, signal.SIGKILL)
    for process in attempt.processes:
        process.wait()
    return time.monotonic() - started


class LocalBackend:
    def start(self, spec: LaunchSpec, *, number: int, log_path: Path) -> Attempt:
        return start(node_commands(spec), number=number, log_path=log_path, env=dict(spec.env))


def backend_for(config: LaunchConfig) -> Backend:
    if config.backend is BackendKind.SLURM:
        return SlurmBackend(config.slurm)
    if config.backend is BackendKind.KUBERNETES:
        return KubernetesBackend(config.kubernetes)
    return LocalBackend()
