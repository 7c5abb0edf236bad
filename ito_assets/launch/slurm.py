"""Slurm: an sbatch script where `srun` starts one torchrun launcher per node; the first node of
the allocation hosts the c10d rendezvous."""

from __future__ import annotations

import shlex

from ito_assets.launch.spec import LaunchSpec, torchrun_args


def sbatch_script(spec: LaunchSpec, *, partition: str, time_limit: str, gpus_per_node: int, workdir: str) -> str:
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in spec.env)
    command = " ".join(
        shlex.quote(a) for a in ["python", "-m", "torch.distributed.run", *torchrun_args(spec, rdzv_endpoint="RDZV")]
    ).replace("--rdzv-endpoint=RDZV", '--rdzv-endpoint="$RDZV_HOST:' + str(spec.rdzv_port) + '"')
    return (
        "#!/bin/bash\n"
        f"#SBATCH --job-name=ito-{spec.run_id}\n"
        f"#SBATCH --partition={partition}\n"
        f"#SBATCH --nodes={spec.nnodes}\n"
        "#SBATCH --ntasks-per-node=1\n"  # one launcher per node; torchrun forks the ranks
        f"#SBATCH --gpus-per-node={gpus_per_node}\n"
        f"#SBATCH --time={time_limit}\n"
        "#SBATCH --output=%x-%j.log\n"
        "set -euo pipefail\n"
        f"cd {shlex.quote(workdir)}\n"
        f"{exports}"
        'RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        f"srun --kill-on-bad-exit=1 {command}\n"
    )
