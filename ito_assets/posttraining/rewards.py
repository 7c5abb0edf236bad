"""Verifiable rewards: 1.0 for a right answer, 0.0 otherwise; code is judged by its unit tests.

Code runs in a child interpreter (`python -I -S`): in a fresh temporary folder, with an empty
environment, CPU-time, memory and file-size limits, a wall-clock timeout that kills its process
group, and no network: the socket constructors raise, and where Linux user namespaces are
available the child runs in an empty network namespace (`unshare -rn`), which has no interface
but loopback. It is a guard against accidents of generated code, not a boundary against an
adversary; production isolates reward workers in containers without network.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ito_assets.posttraining.tasks import Task

# 5 s per program: generous for one-line functions and six asserts (measured: ~0.15 s a run here,
# interpreter start-up and the network namespace included).
CODE_TIMEOUT_SECONDS = 5.0
# 512 MiB address space and 1 MiB of file writes: enough for the interpreter, not for a runaway.
CODE_MEMORY_BYTES = 512 * 1024 * 1024
CODE_FILE_BYTES = 1024 * 1024

_PRELUDE = """
import resource, socket
resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))
resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))
def _no_network(*args, **kwargs):
    raise OSError("network is disabled in the reward sandbox")
socket.socket = socket.create_connection = socket.socketpair = socket.getaddrinfo = _no_network
with open("candidate.py", encoding="utf-8") as source:
    code = compile(source.read(), "candidate.py", "exec")
exec(code, {{"__name__": "__main__"}})
"""


@dataclass(frozen=True, kw_only=True)
class CodeRun:
    passed: bool
    timed_out: bool
    network_namespace: bool  # True when the child ran in an empty network namespace


@functools.lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    """Whether `unshare -rn` works here (unprivileged user namespaces enabled)."""
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_code_tests(program: str, *, timeout: float = CODE_TIMEOUT_SECONDS) -> CodeRun:
    """Run `program` (candidate code followed by its asserts); passed when it exits with 0."""
    prelude = _PRELUDE.format(memory=CODE_MEMORY_BYTES, cpu=max(1, int(timeout)), fsize=CODE_FILE_BYTES)
    isolate = network_namespace_available()
    command = (["unshare", "-rn"] if isolate else []) + [sys.executable, "-I", "-S", "-c", prelude]
    with tempfile.TemporaryDirectory(prefix="ito-reward-") as folder:
        Path(folder, "candidate.py").write_text(program, encoding="utf-8")
        child = subprocess.Popen(
            command, cwd=folder, env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            return CodeRun(passed=False, timed_out=True, network_namespace=isolate)
    return CodeRun(passed=code == 0, timed_out=False, network_namespace=isolate)


def _numeric_equal(completion: str, answer: str) -> bool:
    try:
        return int(completion.strip()) == int(answer)
    except ValueError:
        return False


def score(task: Task, completion: str) -> float:
    """The verifiable reward of `completion` (the decoded text after the prompt, eos cut)."""
    if task.family == "arithmetic":
        return float(_numeric_equal(completion, task.answer))
    if task.family == "exact_match":
        return float(completion.strip() == task.answer)
    if task.family == "code":
        program = f"{task.prompt}{completion}\n\n{task.tests}\n"
        return float(run_code_tests(program).passed)
    raise ValueError("task family must be arithmetic, exact_match or code")
