"""Slurm: an sbatch script where `srun` starts one torchrun launcher per node; the first node of
the allocation hosts the c10d rendezvous.

`SlurmBackend` submits one job per attempt (`sbatch --parsable`), reads its state from `squeue`
while it is queued or running and from `sacct` once it left the queue, and stops it with
`scancel --signal=TERM` (the ranks flush a checkpoint) then `scancel` after the grace period.
The attempt's config, checkpoints and heartbeats must live on storage the nodes share with the
supervisor: the job reads the config by its absolute path.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ito_assets.launch.spec import LaunchSpec, torchrun_command

# sbatch's own time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME_LIMIT = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
_PARTITION = re.compile(r"^[A-Za-z0-9_.,-]+$")  # one #SBATCH line: no spaces, no newline
_JOB_ID = re.compile(r"^[0-9]+$")  # what `sbatch --parsable` prints for one job
JOB_NAME_PREFIX = "ito-"  # the job's name is this and the attempt's rendezvous id
# A busy slurmctld answers in seconds; 60 s is Slurm's own MessageTimeout ceiling advice.
COMMAND_TIMEOUT_S = 60.0
# After the plain `scancel`: Slurm's default KillWait (30 s) between its SIGTERM and SIGKILL, twice.
KILL_WAIT_S = 60.0
# States after which a job never runs again (sacct's JOB STATE CODES).
_FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                           "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
# What the step's Pipes session set: its message channel is a file on the step's host, which a
# compute node cannot write; sbatch would otherwise export it to the job (--export=ALL).
_STEP_ONLY_ENV_PREFIX = "DAGSTER_PIPES_"


@dataclass(frozen=True, kw_only=True)
class SlurmSettings:
    partition: str
    time_limit: str  # sbatch --time, e.g. "02:00:00"
    gpus_per_node: int = 0  # 0: CPU nodes (gloo)
    python: str = "python"  # the interpreter on the compute nodes
    workdir: str | None = None  # None: the job runs where sbatch ran (Slurm's default)
    rdzv_port: int = 29400  # torchrun's default c10d port, on the allocation's first node

    def __post_init__(self) -> None:
        if not _PARTITION.match(self.partition):
            raise ValueError("partition must be a Slurm partition name (letters, digits, '_', '.', ',', '-')")
        if not _TIME_LIMIT.match(self.time_limit):
            raise ValueError("time_limit must be an sbatch --time value such as 02:00:00 or 1-00:00:00")
        if self.gpus_per_node < 0:
            raise ValueError("gpus_per_node must be >= 0")
        if not 1 <= self.rdzv_port <= 65535:
            raise ValueError("rdzv_port must be a TCP port")


def _command(spec: LaunchSpec, settings: SlurmSettings) -> str:
    """The torchrun command line, quoted for bash; the endpoint is expanded on the first node."""
    endpoint = "--rdzv-endpoint=RDZV"
    args = torchrun_command(spec, python=settings.python, rdzv_endpoint="RDZV")
    return " ".join(f'--rdzv-endpoint="$RDZV_HOST:{settings.rdzv_port}"' if a == endpoint else shlex.quote(a)
                    for a in args)


def sbatch_script(spec: LaunchSpec, settings: SlurmSettings) -> str:
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in spec.env)
    gpus = f"#SBATCH --gpus-per-node={settings.gpus_per_node}\n" if settings.gpus_per_node else ""
    workdir = f"cd {shlex.quote(settings.workdir)}\n" if settings.workdir else ""
    return (
        "#!/bin/bash\n"
        f"#SBATCH --job-name={JOB_NAME_PREFIX}{spec.run_id}\n"
        f"#SBATCH --partition={settings.partition}\n"
        f"#SBATCH --nodes={spec.nnodes}\n"
        "#SBATCH --ntasks-per-node=1\n"  # one launcher per node; torchrun forks the ranks
        f"{gpus}"
        f"#SBATCH --time={settings.time_limit}\n"
        "#SBATCH --output=%x-%j.log\n"  # the back end names the attempt's log on sbatch's command line
        "set -euo pipefail\n"
        f"{workdir}"
        f"{exports}"
        # The first node of the allocation; no `| head` (with pipefail, its SIGPIPE would end the job).
        'NODES=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))\n'
        'RDZV_HOST=${NODES[0]}\n'
        # One bad rank ends the step (and the job): the supervisor restarts from a checkpoint.
        f"srun --kill-on-bad-exit=1 {_command(spec, settings)}\n"
    )


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A Slurm command; one that outlived COMMAND_TIMEOUT_S reads as failed (exit 124, like timeout(1))."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False, env=env)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} timed out after {COMMAND_TIMEOUT_S:.0f} s")


def exit_code_of(sacct_line: str) -> int | None:
    """`State|ExitCode` from sacct -P (e.g. `FAILED|1:0`, `CANCELLED by 1000|0:15`) as an exit code:
    0 only for a clean COMPLETED, the code or 128 + signal otherwise, 1 when neither says why;
    None while the job may still run."""
    state, _, exit_pair = sacct_line.strip().partition("|")
    state = state.split(" ")[0]
    if state not in _FINAL_STATES:
        return None
    code, _, sig = exit_pair.partition(":")
    code_n, sig_n = int(code or 0), int(sig or 0)
    if state == "COMPLETED" and code_n == 0 and sig_n == 0:
        return 0
    return code_n or (128 + sig_n if sig_n else 1)


# squeue states of a job that holds its nodes (the others are waiting in the queue).
_RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "STOPPED", "SUSPENDED"})


@dataclass
class SlurmAttempt:
    number: int
    submitted_at: float  # Unix seconds
    job_id: str
    log_path: Path
    poll_s: float = 0.5
    _code: int | None = None
    _running_since: float | None = None

    @property
    def launched_at(self) -> float:
        """When the job was first seen running: a wait in the queue is not start-up time, so the
        supervisor's start-up bound runs from here (until then, from now)."""
        if self._running_since is not None:
            return self._running_since
        return self.submitted_at if self._code is not None else time.time()

    def exit_code(self) -> int | None:
        if self._code is None and not self._queued():
            self._code = self._accounted()
        return self._code

    def _queued(self) -> bool:
        """In squeue (pending, running, completing). A controller error counts as queued: the
        next poll asks again rather than ending a healthy attempt."""
        done = _run(["squeue", "-h", "-j", self.job_id, "-o", "%T"])
        if done.returncode != 0:
            return "Invalid job id" not in done.stderr  # purged from the controller: it left the queue
        state = done.stdout.strip()
        if state in _RUNNING_STATES and self._running_since is None:
            self._running_since = time.time()
        return bool(state)

    def _accounted(self) -> int | None:
        done = _run(["sacct", "-j", self.job_id, "-X", "-n", "-P", "-o", "State,ExitCode"])
        lines = done.stdout.strip().splitlines() if done.returncode == 0 else []
        return exit_code_of(lines[0]) if lines else None  # accounting may lag the queue by a poll

    def wait(self, timeout_s: float) -> None:
        """The whole interval: each look at the job asks the scheduler's API, which is not polled faster."""
        time.sleep(timeout_s)

    def terminate(self, worker_pids: set[int], *, grace_s: float) -> float:
        """`worker_pids` live on the compute nodes: Slurm signals the job's steps itself."""
        started = time.monotonic()
        if self.exit_code() is not None:
            return 0.0
        _run(["scancel", "--signal=TERM", self.job_id])  # the steps' tasks: torchrun forwards to the ranks
        if not self._wait(started + grace_s):
            _run(["scancel", self.job_id])
            self._wait(time.monotonic() + KILL_WAIT_S)
        return time.monotonic() - started

    def _wait(self, deadline: float) -> bool:
        while self.exit_code() is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_s)
        return True

    def release(self) -> None:
        """A job that left the queue holds nothing."""


@dataclass(frozen=True)
class SlurmBackend:
    settings: SlurmSettings

    def start(self, spec: LaunchSpec, *, number: int, log_path: Path) -> SlurmAttempt:
        script = log_path.with_suffix(".sbatch")
        script.write_text(sbatch_script(spec, self.settings))
        env = {k: v for k, v in os.environ.items() if not k.startswith(_STEP_ONLY_ENV_PREFIX)}
        submitted_at = time.time()
        done = _run(["sbatch", "--parsable", f"--output={log_path}", str(script)], env=env)
        if done.returncode == 124:
            _cancel_lost(spec)
            raise RuntimeError(f"sbatch did not answer for attempt {number}: {done.stderr.strip()}")
        if done.returncode != 0:
            raise RuntimeError(f"sbatch refused attempt {number}: {done.stderr.strip()}")
        job_id = done.stdout.strip().split(";")[0]  # --parsable: "ID" or "ID;cluster"
        if not _JOB_ID.match(job_id):  # else squeue and scancel would be asked about another job, or none
            raise RuntimeError(f"sbatch gave attempt {number} no job id")
        return SlurmAttempt(number=number, submitted_at=submitted_at, job_id=job_id, log_path=log_path)


def _cancel_lost(spec: LaunchSpec) -> None:
    """sbatch timed out, which may have been after the controller took the job: cancel it by its
    name (one of this attempt's own: the rendezvous id is per attempt), as this user only, so that
    no attempt runs unwatched beside the next one."""
    user = pwd.getpwuid(os.getuid()).pw_name
    _run(["scancel", f"--name={JOB_NAME_PREFIX}{spec.run_id}", f"--user={user}"])
