"""Where a stage's ranks run, as a Dagster resource (key `training_launcher`).

The plan's node and GPU counts drive it: a field left unset takes the plan's. `backend` picks who
starts each attempt (`ito_assets.launch.backend`): `local` runs torchrun on this machine (several
nodes are launchers on loopback joined by a c10d rendezvous: the multi-node path, run for real
without a cluster); `slurm` submits an sbatch script per attempt (srun starts one torchrun per
node); `kubernetes` creates one Indexed Job per attempt (a pod per node) and a headless service,
which the cluster deletes `k8s_ttl_after_finished_s` after the attempt ended (or failed at
`k8s_active_deadline_s`), whether or not the supervisor lives. With `local`, a host without CUDA
trains one rank per node (gloo): it is a laptop or a test, not the booked hardware; the other back
ends run on the booked nodes, so they take the plan's GPUs per node whatever this host has.

The remote back ends need the stage's folders on storage that the nodes share with the supervisor
(Slurm: a shared filesystem; Kubernetes: the `k8s_volume_claim` mounted at `k8s_mount_path` in the
supervisor's pod and in every trainer pod). No secret is configured here: the Kubernetes client
uses the pod's service account (or the kubeconfig), Slurm the submitting user.
"""

from typing import Optional

from ito_assets.defs.resources import StrictResource
from ito_assets.launch.backend import BackendKind, LaunchConfig
from ito_assets.launch.kubernetes import ACTIVE_DEADLINE_S, REQUEST_TIMEOUT_S, TTL_AFTER_FINISHED_S, KubernetesSettings
from ito_assets.launch.slurm import SlurmSettings
from ito_assets.training.planner import Hardware

RDZV_PORT = 29400  # torchrun's default c10d port


class TrainingLauncherResource(StrictResource):
    nnodes: Optional[int] = None  # None: the plan's num_nodes
    nproc_per_node: Optional[int] = None  # None: the plan's gpus_per_node on GPU nodes, else 1
    backend: BackendKind = BackendKind.LOCAL
    # GPUs requested per node by the remote back ends; None: one per rank (nproc_per_node).
    gpus_per_node: Optional[int] = None
    remote_python: str = "python"  # the interpreter on the nodes (Slurm) or in the image (Kubernetes)
    rdzv_port: int = RDZV_PORT
    slurm_partition: Optional[str] = None
    slurm_time_limit: Optional[str] = None  # sbatch --time, e.g. "02:00:00"
    slurm_workdir: Optional[str] = None  # None: where the supervisor runs
    k8s_namespace: str = "default"
    k8s_image: Optional[str] = None
    k8s_volume_claim: Optional[str] = None
    k8s_mount_path: Optional[str] = None
    k8s_active_deadline_s: int = ACTIVE_DEADLINE_S  # each attempt's Job is failed after this long
    k8s_ttl_after_finished_s: int = TTL_AFTER_FINISHED_S  # a finished Job and its pods go after this long
    k8s_request_timeout_s: float = REQUEST_TIMEOUT_S  # each Kubernetes API call's bound

    def counts(self, hardware: Hardware, *, has_cuda: bool) -> tuple[int, int]:
        """(nodes, ranks per node) of one attempt of a stage."""
        on_booked_nodes = has_cuda or self.backend is not BackendKind.LOCAL
        nnodes = self.nnodes or hardware.num_nodes
        nproc = self.nproc_per_node or (hardware.gpus_per_node if on_booked_nodes else 1)
        if nnodes < 1 or nproc < 1:
            raise ValueError("nnodes and nproc_per_node must be positive")
        return nnodes, nproc

    def launch_config(self, nproc_per_node: int) -> LaunchConfig:
        """The supervisor's `launch` for attempts of `nproc_per_node` ranks per node."""
        gpus = nproc_per_node if self.gpus_per_node is None else self.gpus_per_node
        if self.backend is BackendKind.SLURM:
            return LaunchConfig(backend=self.backend, slurm=self._slurm(gpus))
        if self.backend is BackendKind.KUBERNETES:
            return LaunchConfig(backend=self.backend, kubernetes=self._kubernetes(gpus))
        return LaunchConfig()

    def _slurm(self, gpus: int) -> SlurmSettings:
        if not self.slurm_partition or not self.slurm_time_limit:
            raise ValueError("backend 'slurm' needs slurm_partition and slurm_time_limit")
        return SlurmSettings(partition=self.slurm_partition, time_limit=self.slurm_time_limit, gpus_per_node=gpus,
                             python=self.remote_python, workdir=self.slurm_workdir, rdzv_port=self.rdzv_port)

    def _kubernetes(self, gpus: int) -> KubernetesSettings:
        if not self.k8s_image or not self.k8s_volume_claim or not self.k8s_mount_path:
            raise ValueError("backend 'kubernetes' needs k8s_image, k8s_volume_claim and k8s_mount_path")
        return KubernetesSettings(image=self.k8s_image, volume_claim=self.k8s_volume_claim,
                                  mount_path=self.k8s_mount_path, namespace=self.k8s_namespace, gpus_per_node=gpus,
                                  python=self.remote_python, rdzv_port=self.rdzv_port,
                                  active_deadline_s=self.k8s_active_deadline_s,
                                  ttl_after_finished_s=self.k8s_ttl_after_finished_s,
                                  request_timeout_s=self.k8s_request_timeout_s)
