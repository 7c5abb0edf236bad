"""Verifiable rewards: 1.0 for a right answer, 0.0 otherwise; code is judged by its unit tests.

Code runs in a child interpreter (`python -I -S`): in a fresh temporary folder, with an empty
environment, CPU-time, memory and file-size limits, a wall-clock timeout, and no network: the
socket constructors raise, and where Linux user namespaces are available the child runs in an
empty network namespace (`unshare -rn`), which has no interface but loopback, and in its own
process namespace, so that every process it starts, a detached one included, dies with it.

A program passes only when its tests prove that they ran to their end. The child reads the program,
its tests and a random nonce from stdin before any of the program runs, and nothing of them is left
on disk. It runs the program (over a copy of the builtins), then the tests in a namespace of their
own (the program's names, the interpreter's original builtins), and writes the nonce to a channel of
the parent's only when neither raised. What it calls after the program (exec, compile, the trace
hooks, os.write, os._exit) it binds before: a program that rebinds builtins.exec, os._exit or
sys.settrace in their modules used to skip its tests, fall through a failed assert, or jump over
asserts, and score 1.0. An exit code proves nothing: `os._exit(0)`, `raise SystemExit(0)` or an atexit
hook in the program used to score 1.0. The code tests want a built-in number (`tasks.code_tasks`), so
a value whose `__eq__` claims to equal anything does not pass either.

It is a guard against the accidents and cheap exits of generated code, not a boundary against an
adversary: the program runs as the parent's user in the same interpreter as its tests, so code that
walks the interpreter's frames or memory could still find the nonce; it can read and write any file
that user can (nothing confines it to its folder); and without user namespaces a process it detaches
(`os.setsid`) outlives it, and it can read the parent's start-up environment in
`/proc/<parent>/environ` (with them, the kernel refuses that read). Production isolates reward
workers in containers without network.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from ito_assets.posttraining.tasks import Task

# 5 s per program: generous for one-line functions and six asserts (measured: ~0.15 s a run here,
# interpreter start-up and the network namespace included).
CODE_TIMEOUT_SECONDS = 5.0
# 512 MiB address space and 1 MiB of file writes: enough for the interpreter, not for a runaway.
CODE_MEMORY_BYTES = 512 * 1024 * 1024
CODE_FILE_BYTES = 1024 * 1024

# The isolations tried, strongest first: network, process and /proc namespaces (the child is the
# namespace's first process, and the kernel kills every process left in it when that one ends),
# then the network namespace alone.
_ISOLATIONS: tuple[tuple[str, ...], ...] = (
    ("unshare", "-rn", "--pid", "--fork", "--kill-child", "--mount-proc"),
    ("unshare", "-rn"),
)

_HARNESS = """
import builtins, json, os, resource, socket, sys
resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))
resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))
def _no_network(*args, **kwargs):
    raise OSError("network is disabled in the reward sandbox")
socket.socket = socket.create_connection = socket.socketpair = socket.getaddrinfo = _no_network
def _main():
    job = json.loads(sys.stdin.read())
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    originals = dict(builtins.__dict__)
    # What runs after the program, bound before it: a program that rebinds builtins.exec (the tests
    # never run) or os._exit (a failed assert falls through to the proof) changes nothing here.
    run, build, caught = exec, compile, BaseException
    settrace, setprofile, write, leave = sys.settrace, sys.setprofile, os.write, os._exit
    program = {{"__name__": "__main__", "__builtins__": dict(originals)}}
    try:
        run(build(job["program"], "candidate.py", "exec", optimize=0), program)
        settrace(None)
        setprofile(None)
        tests = {{name: value for name, value in program.items() if name not in originals}}
        tests.update(__name__="__main__", __builtins__=originals)
        run(build(job["tests"], "tests.py", "exec", optimize=0), tests)
    except caught:
        leave(1)
    write(job["proof_fd"], job["nonce"].encode())
    leave(0)
_main()
"""


@dataclass(frozen=True, kw_only=True)
class CodeRun:
    passed: bool
    timed_out: bool
    network_namespace: bool  # True when the child ran in an empty network namespace
    process_namespace: bool = False  # True when its processes could not outlive it


@functools.lru_cache(maxsize=1)
def _isolation() -> tuple[str, ...]:
    for prefix in _ISOLATIONS:
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            continue
    return ()


def network_namespace_available() -> bool:
    """Whether `unshare -rn` works here (unprivileged user namespaces enabled)."""
    return bool(_isolation())


def process_namespace_available() -> bool:
    """Whether the child also gets its own process namespace (nothing it starts outlives it)."""
    return "--pid" in _isolation()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_code_tests(program: str, tests: str = "", *, timeout: float = CODE_TIMEOUT_SECONDS) -> CodeRun:
    """Run `program`, then `tests` (asserts over its names); passed only when both ran to their end."""
    harness = _HARNESS.format(memory=CODE_MEMORY_BYTES, cpu=max(1, int(timeout)), fsize=CODE_FILE_BYTES)
    isolation = _isolation()
    command = [*isolation, sys.executable, "-I", "-S", "-c", harness]
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="ito-reward-") as folder, tempfile.TemporaryFile() as proof:
        job = {"program": program, "tests": tests, "nonce": nonce, "proof_fd": proof.fileno()}
        child = subprocess.Popen(
            command, cwd=folder, env={}, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, pass_fds=(proof.fileno(),),
        )
        try:
            child.communicate(json.dumps(job).encode("utf-8"), timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        # What it left running in its process group goes with it (its namespace's go anyway).
        _kill_group(child.pid)
        child.wait()
        proof.seek(0)
        proved = nonce.encode() in proof.read(CODE_FILE_BYTES + len(nonce))
    return CodeRun(passed=proved and not timed_out, timed_out=timed_out, network_namespace=bool(isolation),
                   process_namespace="--pid" in isolation)


# The one way an integer is written: ASCII digits, a minus sign for a negative, no "+", no leading
# zero, no "-0". Python's int() also reads "1_0", "+10", "0010", Arabic-Indic, fullwidth and
# mathematical digits, each of which would be rewarded as the answer it is not written as.
_CANONICAL_INTEGER = re.compile(r"0|-?[1-9][0-9]*", re.ASCII)


def _numeric_equal(completion: str, answer: str) -> bool:
    """Whether the completion, whitespace around it aside (as exact_match strips it), writes the
    answer's integer the canonical way (`str(int)`)."""
    text = completion.strip()
    return _CANONICAL_INTEGER.fullmatch(text) is not None and text == str(int(answer))


def score(task: Task, completion: str) -> float:
    """The verifiable reward of `completion` (the decoded text after the prompt, eos cut)."""
    if task.family == "arithmetic":
        return float(_numeric_equal(completion, task.answer))
    if task.family == "exact_match":
        return float(completion.strip() == task.answer)
    if task.family == "code":
        return float(run_code_tests(f"{task.prompt}{completion}\n", task.tests).passed)
    raise ValueError("task family must be arithmetic, exact_match or code")
