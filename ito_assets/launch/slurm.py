"""Slurm: an sbatch script where `srun` starts one torchrun launcher per node; the first node of
the allocation hosts the c10d rendezvous.

`SlurmBackend` submits one job per attempt (`sbatch --parsable`), reads its state from `squeue`
while it is queued or running and from `sacct` once it left the queue, and stops it with
`scancel --signal=TERM` (the ranks flush a checkpoint) then `scancel` after the grace period.
The attempt's config, checkpoints and heartbeats must live on storage the nodes share with the
supervisor: the job reads the config by its absolute path.

A job's name is `ito-<rendezvous id>-<series>` (`job_name`): the rendezvous id is the attempt's,
the series a digest of the folder the stage's attempts log to. A start first cancels this user's
jobs of its series that earlier starts left: an sbatch that got no answer may have had its job
registered after the scancel that looked for it, and a stop may not have reached the controller;
such a job would run unwatched on the nodes the new attempt needs until its time limit. A job is
only ever signalled while the queue lists it under its name and this user: its id may name
another job once it left (the controller's ids wrap, and restart with its state).
"""

from __future__ import annotations

import hashlib
import os
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
JOB_NAME_PREFIX = "ito-"  # a job's name: this, the attempt's rendezvous id and its series (job_name)
SERIES_DIGITS = 12  # hex digits of the series digest: at 48 bits, two stage folders sharing one is negligible
# A busy slurmctld answers in seconds; 60 s is Slurm's own MessageTimeout ceiling advice.
COMMAND_TIMEOUT_S = 60.0
# After the plain `scancel`: Slurm's default KillWait (30 s) between its SIGTERM and SIGKILL, twice.
KILL_WAIT_S = 60.0
# A command that could not be started (not on PATH, not executable) reads as failed, as in a shell.
NOT_RUN = 127
# Accounting (slurmdbd) may record a job minutes after it left the queue, or never, on a cluster
# that runs none. Past this without a record, the attempt reads as exit 0 and the supervisor goes by
# what the job left: finished where its result is there, dead otherwise; never waiting forever.
ACCOUNTING_WAIT_S = 600.0
# States after which a job never runs again (sacct's JOB STATE CODES).
_FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                           "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
# A listed job in these is ending already: Slurm kills what is left of it, no scancel needed.
_ENDING_STATES = _FINAL_STATES | {"COMPLETING"}
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


def series(log_path: Path) -> str:
    """The digest that ends the names of the jobs whose attempts log to `log_path`'s folder: the
    attempts of one stage (of one replica group, which logs to a folder of its own) share it, in
    every supervisor run of the stage, and no other stage's do."""
    return hashlib.sha256(str(Path(log_path).parent.absolute()).encode()).hexdigest()[:SERIES_DIGITS]


def job_name(spec: LaunchSpec, log_path: Path) -> str:
    """`ito-<rendezvous id>-<series>`: the whole name is the attempt's (a lost sbatch's job is
    cancelled by it), its end the stage's (a start finds the jobs earlier ones left by it). At most
    80 characters of the run id's own letters, digits, '-' and '_': sacct keeps 255 (and compares)."""
    return f"{JOB_NAME_PREFIX}{spec.run_id}-{series(log_path)}"


def _of_series(name: str, digest: str) -> bool:
    return name.startswith(JOB_NAME_PREFIX) and name.endswith(f"-{digest}")


def _uid() -> str:
    """This user, as squeue -u, scancel --user and squeue's %U take it: a uid needs no passwd entry
    (a container's user may have none)."""
    return str(os.geteuid())


def sbatch_script(spec: LaunchSpec, settings: SlurmSettings, name: str | None = None) -> str:
    """The job's script; `name` is its job name (the back end's `job_name`), `ito-<run id>` without."""
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in spec.env)
    gpus = f"#SBATCH --gpus-per-node={settings.gpus_per_node}\n" if settings.gpus_per_node else ""
    workdir = f"cd {shlex.quote(settings.workdir)}\n" if settings.workdir else ""
    return (
        "#!/bin/bash\n"
        f"#SBATCH --job-name={name or JOB_NAME_PREFIX + spec.run_id}\n"
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
    """A Slurm command; one that outlived COMMAND_TIMEOUT_S reads as failed (exit 124, like timeout(1)),
    one that could not start as NOT_RUN. Without `env`, it runs without the variables it reads
    options from (SQUEUE_STATES, SQUEUE_PARTITION, SCANCEL_FULL, SCANCEL_INTERACTIVE, ...): a
    user's settings would hide jobs from squeue, signal the batch shell with the steps (it dies
    before the ranks flush a checkpoint) or make scancel ask for a confirmation nobody gives."""
    if env is None:
        own = f"{Path(argv[0]).name.upper()}_"
        env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} timed out after {COMMAND_TIMEOUT_S:.0f} s")
    except OSError as error:  # else the caller's own handling of a failed command never runs
        return subprocess.CompletedProcess(argv, NOT_RUN, "", f"{argv[0]} could not run: {error}")


def _why(done: subprocess.CompletedProcess) -> str:
    return done.stderr.strip() or f"exit {done.returncode}"


def _note(log_path: Path, line: str) -> None:
    with open(log_path, "a") as log:
        log.write(line + "\n")


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
    name: str  # the job's name (job_name): the queue and accounting are asked about the id under it
    poll_s: float = 0.5
    accounting_wait_s: float = ACCOUNTING_WAIT_S
    _code: int | None = None
    _running_since: float | None = None
    _left_queue_at: float | None = None  # time.monotonic(), first seen out of the queue without a record

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
            if self._code is None:
                now = time.monotonic()
                self._left_queue_at = self._left_queue_at or now
                if now - self._left_queue_at >= self.accounting_wait_s:
                    _note(self.log_path, f"--- job {self.job_id} left the queue {self.accounting_wait_s:g} s ago and "
                                         "accounting has no record of it: read as exit 0, its end is what it left")
                    self._code = 0
        return self._code

    def _queued(self) -> bool:
        """In squeue (pending, running, completing) under its name, as this user's. A controller
        error counts as queued: the next poll asks again rather than ending a healthy attempt. The id
        under another name or user is another job's: ours left the queue."""
        done = _run(["squeue", "-h", "-j", self.job_id, "-o", "%T|%U|%j"])
        if done.returncode != 0:
            return "Invalid job id" not in done.stderr  # purged from the controller: it left the queue
        state, uid, name = (done.stdout.strip().split("|", 2) + ["", ""])[:3]
        if not state or uid != _uid() or name != self.name:
            return False
        if state in _RUNNING_STATES and self._running_since is None:
            self._running_since = time.time()
        return True

    def _accounted(self) -> int | None:
        """sacct's record under the job's name: without it, `sacct -j` gives the latest job under the
        id, which is another's where the ids restarted and ours is not recorded yet."""
        done = _run(["sacct", "-j", self.job_id, "-X", "-n", "-P", "-o", "State,ExitCode,JobName"])
        lines = done.stdout.strip().splitlines() if done.returncode == 0 else []
        ours = [state_exit for state_exit, _, name in (line.rpartition("|") for line in lines) if name == self.name]
        return exit_code_of(ours[0]) if ours else None  # accounting may lag the queue by a poll

    def wait(self, timeout_s: float) -> None:
        """The whole interval: each look at the job asks the scheduler's API, which is not polled faster."""
        time.sleep(timeout_s)

    def terminate(self, worker_pids: set[int], *, grace_s: float) -> float:
        """`worker_pids` live on the compute nodes: Slurm signals the job's steps itself. Only while
        the queue lists the job as ours: a scancel by id alone would reach the job that has the id now."""
        started = time.monotonic()
        if self._code is not None or not self._queued():
            return 0.0
        _run(["scancel", "--signal=TERM", self.job_id])  # the steps' tasks: torchrun forwards to the ranks
        if not self._wait(started + grace_s):
            _run(["scancel", self.job_id])
            self._wait(time.monotonic() + KILL_WAIT_S)
        return time.monotonic() - started

    def _wait(self, deadline: float) -> bool:
        """Until the job left the queue (its processes ended), not until sacct has its record: that
        may lag by minutes, and the plain scancel would then follow a job that already ended."""
        while self._queued():
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
        name = job_name(spec, log_path)
        _cancel_left_over(series(log_path), number, log_path)
        script = log_path.with_suffix(".sbatch")
        script.write_text(sbatch_script(spec, self.settings, name))
        env = {k: v for k, v in os.environ.items() if not k.startswith(_STEP_ONLY_ENV_PREFIX)}
        submitted_at = time.time()
        # Appended to: by default the job truncates its output file, and with it what was noted before.
        # The name on the command line too: it outranks SBATCH_JOB_NAME in the environment, which
        # outranks the script's directive, and the job is found (watched, swept) by its name alone.
        done = _run(["sbatch", "--parsable", f"--job-name={name}", f"--output={log_path}", "--open-mode=append",
                     str(script)], env=env)
        job_id = done.stdout.strip().split(";")[0] if done.returncode == 0 else ""  # --parsable: "ID" or "ID;cluster"
        if not _JOB_ID.match(job_id):  # else squeue and scancel would be asked about another job, or none
            # The controller may have taken the job all the same: sbatch ran out of time (124), gave up
            # waiting on its own (a socket timeout) or answered in another form.
            _cancel_lost(name, number, log_path)
            if done.returncode == 124:
                raise RuntimeError(f"sbatch did not answer for attempt {number}: {_why(done)}")
            if done.returncode != 0:
                raise RuntimeError(f"sbatch refused attempt {number}: {_why(done)}")
            raise RuntimeError(f"sbatch gave attempt {number} no job id")
        return SlurmAttempt(number=number, submitted_at=submitted_at, job_id=job_id, log_path=log_path, name=name)


def _cancel_lost(name: str, number: int, log_path: Path) -> None:
    """Cancel the job a failed sbatch may have submitted, by its name (the attempt's own) and as this
    user only, so that no attempt runs unwatched beside the next one. A job the controller registers
    only after this look carries its series' name: the next start cancels it."""
    done = _run(["scancel", f"--name={name}", f"--user={_uid()}"])
    outcome = "" if done.returncode == 0 else f" failed ({_why(done)})"
    _note(log_path, f"--- sbatch gave attempt {number} no job id: scancel --name={name}{outcome}; a job "
                    f"registered after it is cancelled by the next start")


def _series_jobs(digest: str, number: int) -> dict[str, tuple[str, str]]:
    """This user's jobs in the queue whose name ends in the series digest: id -> (state, name). -a:
    a partition hidden from the user hides its jobs from a plain squeue -u."""
    done = _run(["squeue", "-h", "-a", "-u", _uid(), "-o", "%i|%T|%j"])
    if done.returncode != 0:
        raise RuntimeError(f"squeue did not list the jobs left before attempt {number} ({_why(done)}): not started")
    jobs = {}
    for line in done.stdout.splitlines():
        job_id, state, name = (line.strip().split("|", 2) + ["", ""])[:3]
        if _JOB_ID.match(job_id) and _of_series(name, digest):
            jobs[job_id] = (state, name)
    return jobs


def _cancel_left_over(digest: str, number: int, log_path: Path) -> None:
    """Cancel this user's jobs of the series (by id, name and user) that are not ending already. The
    supervisor starts an attempt only once the one before ended or was stopped: any such job is left
    over (one whose sbatch got no answer and that the controller registered later, one whose stop
    did not reach it). A squeue without an answer, or a job still there after its scancel, fails
    the start (each call bounded by COMMAND_TIMEOUT_S): an attempt started without the look could run
    beside a job that holds the nodes it needs, until that job's time limit."""
    left = {job_id: job for job_id, job in _series_jobs(digest, number).items() if job[0] not in _ENDING_STATES}
    for job_id, (state, name) in left.items():
        done = _run(["scancel", f"--name={name}", f"--user={_uid()}", job_id])
        outcome = "cancelled" if done.returncode == 0 else f"scancel failed ({_why(done)})"
        _note(log_path, f"--- job {job_id} ({name}, {state}), left by an earlier start of this stage: {outcome} "
                        f"before attempt {number}'s")
    if not left:
        return
    still = sorted(job_id for job_id, (state, _) in _series_jobs(digest, number).items()
                   if job_id in left and state not in _ENDING_STATES)
    if still:
        raise RuntimeError(f"scancel did not end job {', '.join(still)}, left by an earlier start of this stage, "
                           f"before attempt {number}: not started")
