"""This machine: one torchrun launcher per simulated node, all on loopback. With nnodes=1 it is a
plain single-node launch; with more, the multi-node path runs for real on one machine."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ito_assets.launch.spec import LaunchSpec, torchrun_args


@dataclass(frozen=True)
class NodeResult:
    node: int
    returncode: int
    log_path: str


def local_argv(spec: LaunchSpec, python: str = sys.executable) -> list[str]:
    return [python, "-m", "torch.distributed.run", *torchrun_args(spec)]


def launch_local(spec: LaunchSpec, *, cwd: Path, log_dir: Path, timeout_s: float) -> list[NodeResult]:
    """Start every node's launcher, wait for all (killing all on timeout), return exit codes."""
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **dict(spec.env)}
    processes = []
    for node in range(spec.nnodes):
        log_path = log_dir / f"node{node}.log"
        with open(log_path, "wb") as log:
            processes.append(
                # A session per launcher, so a timeout kills its workers too, not only torchrun.
                (node, log_path, subprocess.Popen(local_argv(spec), cwd=cwd, env=env, stdout=log,
                                                  stderr=subprocess.STDOUT, start_new_session=True))
            )
    deadline = time.monotonic() + timeout_s
    results = []
    for node, log_path, process in processes:
        try:
            code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for _, _, other in processes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(other.pid, signal.SIGKILL)
            code = process.wait()
        results.append(NodeResult(node, code, str(log_path)))
    return results
