"""What the runtime launches (the worker on an attempt's config) and which back end of
`ito_assets.launch` starts it for a `LaunchConfig`: this machine, Slurm or Kubernetes.
"""

from __future__ import annotations

from pathlib import Path

from ito_assets.launch.backend import Backend, BackendKind, LaunchConfig
from ito_assets.launch.kubernetes import KubernetesBackend
from ito_assets.launch.local import LocalBackend, node_commands
from ito_assets.launch.slurm import SlurmBackend
from ito_assets.launch.spec import LaunchSpec

WORKER_MODULE = "ito_assets.runtime.worker.main"


def worker_spec(config_path: Path, *, nnodes: int, nproc_per_node: int, rdzv_id: str) -> LaunchSpec:
    """The worker on the attempt's config: what every back end launches."""
    return LaunchSpec(run_id=rdzv_id, nnodes=nnodes, nproc_per_node=nproc_per_node, module=WORKER_MODULE,
                      args=("--config", str(config_path)))


def worker_command(config_path: Path, nproc_per_node: int) -> list[str]:
    """The worker on one node of this machine, as the local back end would start it, for a run
    without a supervisor (tests, benchmarks)."""
    (command,) = node_commands(worker_spec(config_path, nnodes=1, nproc_per_node=nproc_per_node, rdzv_id="standalone"))
    return command


def backend_for(config: LaunchConfig) -> Backend:
    if config.backend is BackendKind.SLURM:
        return SlurmBackend(config.slurm)
    if config.backend is BackendKind.KUBERNETES:
        return KubernetesBackend(config.kubernetes)
    return LocalBackend()
