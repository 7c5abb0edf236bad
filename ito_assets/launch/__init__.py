"""Training launch: one spec, several back ends (this machine, Kubernetes, Slurm), all running
the same `torch.distributed.run` command (`spec.torchrun_command`), behind one interface
(`backend`) the supervisor starts its attempts through. No scheduler of our own."""
