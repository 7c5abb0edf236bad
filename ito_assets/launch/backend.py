"""One interface for starting a stage attempt, whatever runs it: this machine, Slurm or Kubernetes.

A back end turns a `LaunchSpec` (the worker, its attempt config, the node and rank counts, a
rendezvous id of its own per attempt) into a running attempt. The supervisor only asks the attempt
three things: has it ended and how (`exit_code`), and stop it (`terminate`), then `release` what
it still holds once it ended on its own. Which back end runs is `LaunchConfig.backend`, chosen by
the `training_launcher` resource and carried in the supervisor's JSON config.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ito_assets.launch.kubernetes import KubernetesSettings
from ito_assets.launch.slurm import SlurmSettings
from ito_assets.launch.spec import LaunchSpec


class BackendKind(str, enum.Enum):
    LOCAL = "local"  # torch.distributed.run on this machine (one launcher per node on loopback)
    SLURM = "slurm"  # an sbatch script: srun starts one torchrun per node
    KUBERNETES = "kubernetes"  # one Indexed Job (a pod per node) behind a headless service


class Attempt(Protocol):
    """One started attempt: `local.LocalAttempt`, `slurm.SlurmAttempt` or `kubernetes.KubernetesAttempt`."""

    @property
    def number(self) -> int: ...

    @property
    def launched_at(self) -> float:
        """Unix seconds from which the start-up bound runs (a job's wait in a queue excluded)."""

    def exit_code(self) -> int | None:
        """The first non-zero exit of any node, 0 once every node finished cleanly, None while running."""

    def wait(self, timeout_s: float) -> None:
        """Return after `timeout_s`, or sooner once a node has exited where the back end can tell
        cheaply (this machine's launchers), so that a finished or dead attempt is seen at once."""

    def terminate(self, worker_pids: set[int], *, grace_s: float) -> float:
        """Ask every rank to stop (SIGTERM: the workers flush a checkpoint), force it after `grace_s`;
        returns the seconds spent. `worker_pids` are the heartbeats' pids, meaningful on this machine only."""

    def release(self) -> None:
        """Free what an attempt that ended on its own still holds (a Job, its pods and service); idempotent."""


class Backend(Protocol):
    """`local.LocalBackend`, `slurm.SlurmBackend` or `kubernetes.KubernetesBackend`."""

    def start(self, spec: LaunchSpec, *, number: int, log_path: Path) -> Attempt:
        """Start attempt `number` of `spec`; its launchers' output goes to `log_path` where the back end can."""


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    backend: BackendKind = BackendKind.LOCAL
    slurm: SlurmSettings | None = None  # required when backend is slurm
    kubernetes: KubernetesSettings | None = None  # required when backend is kubernetes

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", BackendKind(self.backend))
        if self.backend is BackendKind.SLURM and self.slurm is None:
            raise ValueError("slurm settings are required when backend is 'slurm'")
        if self.backend is BackendKind.KUBERNETES and self.kubernetes is None:
            raise ValueError("kubernetes settings are required when backend is 'kubernetes'")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchConfig:
        """From JSON (`dataclasses.asdict` of one), the form the supervisor's config travels in."""
        slurm, kubernetes = data.get("slurm"), data.get("kubernetes")
        return cls(backend=data.get("backend", BackendKind.LOCAL),
                   slurm=SlurmSettings(**slurm) if slurm is not None else None,
                   kubernetes=KubernetesSettings(**kubernetes) if kubernetes is not None else None)
