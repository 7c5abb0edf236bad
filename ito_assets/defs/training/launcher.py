"""Where a stage's ranks run, as a Dagster resource (key `training_launcher`).

The plan's node and GPU counts drive it: a field left unset takes the plan's. On this machine the
nodes are torchrun launchers on loopback joined by a c10d rendezvous (the multi-node path, run for
real without a cluster); Kubernetes pods and Slurm scripts for the same counts are rendered by
`ito_assets.launch`. A host without CUDA trains one rank per node (gloo): it is a laptop or a test,
not the booked hardware.
"""

from typing import Optional

import dagster as dg

from ito_assets.training.planner import Hardware


class TrainingLauncherResource(dg.ConfigurableResource):
    nnodes: Optional[int] = None  # None: the plan's num_nodes
    nproc_per_node: Optional[int] = None  # None: the plan's gpus_per_node on CUDA, else 1

    def counts(self, hardware: Hardware, *, has_cuda: bool) -> tuple[int, int]:
        """(nodes, ranks per node) of one attempt of a stage."""
        nnodes = self.nnodes or hardware.num_nodes
        nproc = self.nproc_per_node or (hardware.gpus_per_node if has_cuda else 1)
        if nnodes < 1 or nproc < 1:
            raise ValueError("nnodes and nproc_per_node must be positive")
        return nnodes, nproc
