"""Training launch: one spec, several back ends (this machine, Kubernetes, Slurm), all running
`torch.distributed.run` with a c10d rendezvous, behind one interface (`backend`) the supervisor
starts its attempts through. No scheduler of our own."""
