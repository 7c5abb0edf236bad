"""What to launch (the plan's node and GPU counts, the worker module, the rendezvous) and the
torchrun command that launches it, the same for every back end."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from ito_assets.manifest.secrets import (assigned_credentials, env_name_looks_secret, pattern_secret_kind,
                                        value_secret_kind)

# It is also a Kubernetes label value and names a Job: both must end in a letter or digit.
_RUN_ID = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?$")
# An environment name as a shell (the sbatch script's `export NAME=...`) and Kubernetes accept it.
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
BACKENDS = ("gloo", "nccl")
# Device lists, as the supervisor sets a replica group's share of the GPUs: GPU and MIG UUIDs are
# random by design (an old driver's MIG-GPU-<uuid>/1/0 reads as a key to the entropy rule), so only
# a known format or an assignment counts there.
_DEVICE_LISTS = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                           "ROCR_VISIBLE_DEVICES"})


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    run_id: str  # also the rendezvous id: two runs never join each other's rendezvous
    nnodes: int
    nproc_per_node: int
    module: str  # the worker, run as `python -m module`
    args: tuple[str, ...] = ()
    backend: str = "gloo"  # gloo on CPU, nccl on GPUs
    rdzv_host: str = "127.0.0.1"
    rdzv_port: int = 29400  # torchrun's default c10d port
    env: tuple[tuple[str, str], ...] = field(default=())  # non-secret settings only

    def __post_init__(self) -> None:
        if not _RUN_ID.match(self.run_id):
            raise ValueError("run_id must be 1-63 letters, digits, '-' or '_', first and last a letter or digit")
        if self.nnodes < 1:
            raise ValueError("nnodes must be >= 1")
        if self.nproc_per_node < 1:
            raise ValueError("nproc_per_node must be >= 1")
        if not _MODULE.match(self.module):
            raise ValueError("module must be a dotted Python module name")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}")
        if not 1 <= self.rdzv_port <= 65535:
            raise ValueError("rdzv_port must be a TCP port")
        _check_env(self.env)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def rdzv_endpoint(self) -> str:
        return f"{self.rdzv_host}:{self.rdzv_port}"


def _check_env(env: tuple[tuple[str, str], ...]) -> None:
    """The spec's environment is written out as it is (an sbatch script, a Job's manifest): a name
    that is no identifier would run as shell code there, and a secret would be readable by anyone
    who reads the script or the Job. On this machine and under Slurm the workers inherit the
    launching process's environment, secrets included, without writing it anywhere. A value is
    judged as a manifest's is, random-looking strings included (a key under a name no rule knows,
    S3_CREDS, or inside a connection string); it is never echoed: a refused one may be a secret."""
    for name, value in env:
        if not _ENV_NAME.match(name):
            raise ValueError("env names must be letters, digits and '_', not starting with a digit")
        if env_name_looks_secret(name):
            raise ValueError(f"env must hold non-secret settings only: {name} looks like a credential")
        kind = pattern_secret_kind(value) if name in _DEVICE_LISTS else value_secret_kind(value)
        if kind or assigned_credentials(value):
            raise ValueError(f"env must hold non-secret settings only: the value of {name} is a credential")


def torchrun_command(spec: LaunchSpec, *, python: str = sys.executable, rdzv_endpoint: str | None = None,
                     standalone: bool = False) -> list[str]:
    """`python -m torch.distributed.run ...` for `spec`, the one command every back end runs on
    every node. A c10d rendezvous (at `rdzv_endpoint`, else the spec's) lets the nodes agree on
    ranks without a static node rank, so the command is identical on every node; `standalone`
    (one node) lets torchrun host its own rendezvous on a free port instead."""
    if standalone and spec.nnodes != 1:
        raise ValueError("a standalone torchrun is one node")
    nodes = ["--standalone"] if standalone else [f"--nnodes={spec.nnodes}"]
    rendezvous = [] if standalone else ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint or spec.rdzv_endpoint}",
                                        f"--rdzv-id={spec.run_id}"]
    return [
        python, "-m", "torch.distributed.run",
        *nodes,
        f"--nproc-per-node={spec.nproc_per_node}",
        *rendezvous,
        "--max-restarts=0",  # restarts are the supervisor's decision (from the last good checkpoint)
        "-m",
        spec.module,
        *spec.args,
    ]


def direct_command(spec: LaunchSpec, *, python: str = sys.executable) -> list[str]:
    """`python -m module ...`: a world of one needs no launcher; the worker joins it alone."""
    if spec.world_size != 1:
        raise ValueError("only a world of one starts without torchrun")
    return [python, "-m", spec.module, *spec.args]
