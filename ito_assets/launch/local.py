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
a checkpoint), then SIGKILL to whatever is left after the grace period. Besides the launchers and
the heartbeats' pids, a stop reaches every process of ours whose environment carries the launch
id (found in /proc): a rank torchrun never passed SIGTERM on to, a child a rank left running.

Sessions of their own mean that nothing takes the attempt along when its supervisor dies without
stopping it (SIGKILL, the OOM killer, a node agent ending the step): see `_watch` and
`_end_left_behind`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
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
    watcher: subprocess.Popen | None = None  # `_watch`: ends the attempt once its stdin closes

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
        """Close the watcher's pipe: it ends whatever of the attempt is still running (a child a
        rank left behind), within the orphan grace period; the launchers exited. The watcher is
        reaped here when it is done at once (nothing left), else by the next start."""
        if self.watcher is not None and self.watcher.stdin is not None:
            self.watcher.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.watcher.wait(timeout=WATCHER_EXIT_S)


# What torchrun tells its ranks. A world of one started alone must not inherit them from a parent
# that is itself a rank (or a shell that set them): it would wait for ranks that never come.
RANK_ENVIRONMENT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


# Name the attempt in its processes' environment: set last, so that nothing inherited overrides them.
LAUNCH_ID_ENV = "ITO_LAUNCH_ID"  # the attempt: random, no other attempt's
LAUNCH_FOLDER_ENV = "ITO_LAUNCH_FOLDER"  # the folder of its log (the stage folder), resolved
LAUNCH_OWNER_ENV = "ITO_LAUNCH_OWNER"  # the supervising process: "<pid>:<start time in clock ticks>"
_MARKS = tuple(name.encode() for name in (LAUNCH_ID_ENV, LAUNCH_FOLDER_ENV, LAUNCH_OWNER_ENV))

# SIGTERM to SIGKILL for an attempt that its supervisor can no longer stop (it died): the
# supervisor's own default grace (`SupervisorConfig.grace_s`), which the back end is not given.
ORPHAN_GRACE_S = 60.0
# After a SIGKILL, how long to wait for the processes to be gone before launching beside them.
KILL_WAIT_S = 5.0
# A watcher with nothing left to stop exits in milliseconds; one still stopping is not waited for.
WATCHER_EXIT_S = 2.0


def start(commands: list[list[str]], *, number: int, log_path: Path, worker_module: str,
          env: dict[str, str] | None = None, alone: bool = False, grace_s: float | None = None) -> LocalAttempt:
    """Run every node's command in a session of its own, all writing to `log_path`; `alone`: the
    one command is a world of one, started without the rank environment of this process. First
    ends what an earlier, dead supervisor of the same folder left running; `grace_s` (default
    ORPHAN_GRACE_S) bounds that and the watcher's stop once this supervisor is gone."""
    grace_s = ORPHAN_GRACE_S if grace_s is None else grace_s
    folder = str(Path(log_path).parent.resolve())
    left = _end_left_behind(folder, grace_s)
    launched_at = time.time()
    launch_id = secrets.token_hex(16)
    inherited = {k: v for k, v in os.environ.items()
                 if not (alone and k in RANK_ENVIRONMENT) and k.encode() not in _MARKS}
    marks = {LAUNCH_ID_ENV: launch_id, LAUNCH_FOLDER_ENV: folder, LAUNCH_OWNER_ENV: _owner(os.getpid())}
    processes = []
    with open(log_path, "ab") as log:
        if left:
            log.write(f"ended processes {sorted(left)} that an earlier supervisor of {folder} left running\n".encode())
            log.flush()
        # Before the launchers: a supervisor that dies between the two leaves nothing unwatched.
        watcher = subprocess.Popen([sys.executable, "-c", "from ito_assets.launch.local import _watch; _watch()",
                                    launch_id, str(grace_s)], stdin=subprocess.PIPE, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True, env=inherited)
        for command in commands:
            processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                              env={**inherited, **(env or {}), **marks}))
    return LocalAttempt(number=number, processes=processes, launched_at=launched_at, log_path=log_path,
                        worker_module=worker_module, launch_id=launch_id, watcher=watcher)


# Why a watcher process, and not PR_SET_PDEATHSIG on the launchers: the death signal fires when the
# *thread* that forked the launcher exits (the replica groups' supervisors run on threads of their
# own), it needs a preexec_fn (unsafe in a process with threads), it reaches torchrun alone (a
# SIGKILLed torchrun leaves its ranks, each in a session of its own, running) and a launcher that
# ignores SIGTERM would outlive it. The watcher holds the read end of a pipe whose only write end is
# the supervisor's; the kernel closes it however the supervisor dies, and the watcher then stops
# every process carrying the launch id as `terminate` does. It runs in a session of its own, so a
# signal to the supervisor's process group does not take it along before it has done that.
# Should the watcher die too (it is small: the OOM killer picks a rank first), the next start of the
# stage ends what is left (`_end_left_behind`) before it launches.
def _watch() -> None:
    """`python -c ... <launch id> <grace seconds>`, started by `start`: wait for EOF on stdin, then
    SIGTERM every process of the attempt and SIGKILL what is left after the grace period."""
    launch_id, grace_s = sys.argv[1], float(sys.argv[2])
    while os.read(0, 4096):  # EOF: the supervisor closed the pipe (the attempt ended) or died
        pass
    found_at = time.monotonic()
    ended = _end(lambda: _attempt_processes(launch_id), grace_s=grace_s)
    if ended:  # how long, so that a slow stop can be told from a slow scan or a late end of the pipe
        print(f"the supervisor is gone: stopped processes {sorted(ended)} of its attempt in "
              f"{time.monotonic() - found_at:.1f} s", flush=True)


def _marks(pid: int) -> dict[bytes, bytes]:
    """The launch variables in `pid`'s initial environment; none for a process of another user
    (even where its environ is readable: root), a zombie (it has no environment left) or a
    process that is no attempt's."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return {}
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    marks = {}
    for entry in environ.split(b"\0"):
        name, _, value = entry.partition(b"=")
        if name in _MARKS:
            marks.setdefault(name, value)  # the first, as getenv reads it
    return marks


def _is_worker(pid: int, launch_id: str) -> bool:
    """Whether `pid` runs in the attempt whose launch id is `launch_id`: not a recycled pid, not
    another run's worker, not a process of another user."""
    return bool(launch_id) and _marks(pid).get(LAUNCH_ID_ENV.encode()) == launch_id.encode()


def _processes(match: Callable[[dict[bytes, bytes]], bool]) -> set[int]:
    """Our processes (this one excepted) whose launch variables `match`: a scan of /proc."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            marks = _marks(int(name))
            if marks and match(marks):
                found.add(int(name))
    return found


def _attempt_processes(launch_id: str) -> set[int]:
    """Every process of the attempt: its launchers, their ranks, whatever those started."""
    if not launch_id:
        return set()
    return _processes(lambda marks: marks.get(LAUNCH_ID_ENV.encode()) == launch_id.encode())


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields from the state on (the command name may hold spaces)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()
    except (OSError, IndexError):
        return None


def _owner(pid: int) -> str:
    """`pid` and its start time: the pair names one process for as long as the machine runs."""
    fields = _stat(pid)
    return f"{pid}:{fields[19] if fields else ''}"


def _owner_alive(owner: bytes) -> bool:
    pid, _, started = owner.decode(errors="replace").partition(":")
    if not pid.isdigit():
        return False
    fields = _stat(int(pid))
    return fields is not None and fields[0] != "Z" and fields[19] == started


def _end_left_behind(folder: str, grace_s: float) -> set[int]:
    """End the processes of attempts in `folder` whose supervisor died without stopping them, before
    a new attempt starts there (a retried step): two attempts of a stage would share its devices and
    write one checkpoint folder. An attempt whose supervisor lives is that supervisor's to stop."""
    def left() -> set[int]:
        return _processes(lambda marks: marks.get(LAUNCH_FOLDER_ENV.encode()) == folder.encode()
                          and not _owner_alive(marks.get(LAUNCH_OWNER_ENV.encode(), b"")))
    return _end(left, grace_s=grace_s)


def _end(find: Callable[[], set[int]], *, grace_s: float, poll_s: float = 0.05) -> set[int]:
    """SIGTERM what `find` finds, SIGKILL what it still finds after `grace_s`, then wait (at most
    KILL_WAIT_S) until it finds nothing; returns every pid it signalled."""
    found = find()
    ended = set(found)
    for pid in found:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while found and time.monotonic() < deadline:
        time.sleep(poll_s)
        found = find()
    deadline = time.monotonic() + KILL_WAIT_S
    while found and time.monotonic() < deadline:
        ended |= found
        for pid in found:
            _signal(pid, signal.SIGKILL)
        time.sleep(poll_s)
        found = find()
    return ended


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except (ProcessLookupError, PermissionError):
        pass


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
    """SIGTERM the launchers and the workers, SIGKILL them after `grace_s`; returns seconds spent.
    The workers: the heartbeats' pids and every other process carrying the attempt's launch id."""
    started = time.monotonic()
    launch_id = attempt.launch_id
    workers = {pid for pid in worker_pids if _is_worker(pid, launch_id)}
    launchers = [p for p in attempt.processes if p.poll() is None]
    groups = {p.pid for p in launchers} | workers
    for pid in groups:
        _signal_group(pid, signal.SIGTERM)
    for pid in _attempt_processes(launch_id):  # one SIGTERM each: a second one would cut torchrun's own stop short
        if _group_of(pid) not in groups:
            _signal(pid, signal.SIGTERM)
    deadline = started + grace_s
    while time.monotonic() < deadline and (any(p.poll() is None for p in launchers) or _running(workers, launch_id)
                                           or _attempt_processes(launch_id)):
        time.sleep(poll_s)
    for process in attempt.processes:
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGKILL)
    for pid in workers:
        if _is_worker(pid, launch_id):
            _signal_group(pid, signal.SIGKILL)
    for pid in _attempt_processes(launch_id):
        _signal(pid, signal.SIGKILL)
    for process in attempt.processes:
        process.wait()
    attempt.release()  # the watcher finds nothing left and exits
    return time.monotonic() - started


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


class LocalBackend:
    def start(self, spec: LaunchSpec, *, number: int, log_path: Path) -> LocalAttempt:
        return start(node_commands(spec), number=number, log_path=log_path, worker_module=spec.module,
                     env=dict(spec.env), alone=spec.world_size == 1)
