"""The launch back ends: a real two-"node" torchrun on loopback, and the rendered Slurm and
Kubernetes forms of the same spec."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from ito_assets.launch.backend import BackendKind, LaunchConfig
from ito_assets.launch.kubernetes import KubernetesSettings, headless_service, pod_specs
from ito_assets.launch.local import launch_local
from ito_assets.launch.slurm import SlurmSettings, exit_code_of, sbatch_script
from ito_assets.launch.spec import LaunchSpec, torchrun_args

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_node_torchrun_on_loopback(tmp_path):
    out = tmp_path / "preflight.json"
    spec = LaunchSpec(
        run_id="two-node-test", nnodes=2, nproc_per_node=1, module="ito_assets.launch.preflight",
        args=("--out", str(out)), rdzv_port=_free_port(),
    )
    results = launch_local(spec, cwd=ROOT, log_dir=tmp_path / "logs", timeout_s=180)
    logs = "\n".join(Path(r.log_path).read_text() for r in results)
    assert [r.returncode for r in results] == [0, 0], logs[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["rank_sum"] == 1.0
    assert sorted(r["group_rank"] for r in result["ranks"]) == ["0", "1"]


def test_spec_validation():
    with pytest.raises(ValueError, match="nnodes"):
        LaunchSpec(run_id="r", nnodes=0, nproc_per_node=1, module="m")
    with pytest.raises(ValueError, match="module"):
        LaunchSpec(run_id="r", nnodes=1, nproc_per_node=1, module="m; rm -rf /")
    with pytest.raises(ValueError, match="run_id"):
        LaunchSpec(run_id="../x", nnodes=1, nproc_per_node=1, module="m")
    with pytest.raises(ValueError, match="backend"):
        LaunchSpec(run_id="r", nnodes=1, nproc_per_node=1, module="m", backend="mpi")


SPEC = LaunchSpec(run_id="run42", nnodes=4, nproc_per_node=8, module="ito_assets.launch.preflight",
                  args=("--out", "/tmp/x.json"), backend="nccl", env=(("ITO_STATE_DIR", "/var/lib/ito"),))


def test_torchrun_args_are_the_same_on_every_node():
    args = torchrun_args(SPEC)
    assert "--nnodes=4" in args and "--nproc-per-node=8" in args and "--rdzv-backend=c10d" in args
    assert "--rdzv-id=run42" in args and not any(a.startswith("--node-rank") for a in args)


def test_slurm_script():
    settings = SlurmSettings(partition="gpu", time_limit="02:00:00", gpus_per_node=8, workdir="/opt/ito")
    script = sbatch_script(SPEC, settings)
    assert "#SBATCH --nodes=4" in script and "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --gpus-per-node=8" in script and "cd /opt/ito\n" in script
    assert '--rdzv-endpoint="$RDZV_HOST:29400"' in script
    assert "srun --kill-on-bad-exit=1 python -m torch.distributed.run" in script
    assert "export ITO_STATE_DIR=/var/lib/ito" in script
    assert "| head" not in script  # under pipefail a SIGPIPE would fail the job


def test_slurm_settings_refuse_what_would_break_an_sbatch_line():
    with pytest.raises(ValueError, match="partition"):
        SlurmSettings(partition="gpu\n#SBATCH --account=x", time_limit="1:00:00")
    with pytest.raises(ValueError, match="time_limit"):
        SlurmSettings(partition="gpu", time_limit="two hours")


@pytest.mark.parametrize(("line", "code"), [
    ("COMPLETED|0:0", 0), ("FAILED|1:0", 1), ("FAILED|0:9", 137), ("CANCELLED by 1000|0:15", 143),
    ("TIMEOUT|0:0", 1), ("NODE_FAIL|0:0", 1), ("RUNNING|0:0", None),
    ("PENDING|0:0", None), ("COMPLETED|2:0", 2),
])
def test_sacct_states_as_exit_codes(line, code):
    assert exit_code_of(line) == code


def test_launch_config_needs_the_chosen_back_ends_settings():
    with pytest.raises(ValueError, match="slurm settings"):
        LaunchConfig(backend="slurm")
    with pytest.raises(ValueError, match="kubernetes settings"):
        LaunchConfig(backend=BackendKind.KUBERNETES)
    assert LaunchConfig.from_dict({}) == LaunchConfig()
    with pytest.raises(ValueError, match="mount_path"):
        KubernetesSettings(image="i", volume_claim="c", mount_path="relative")


def test_kubernetes_pods_and_service():
    pods = pod_specs(SPEC, KubernetesSettings(image="ito-training:0.1.0", volume_claim="ito-runs",
                                              mount_path="/var/lib/ito", namespace="ito", gpus_per_node=8))
    assert [p["metadata"]["name"] for p in pods] == [f"ito-run42-node{i}" for i in range(4)]
    commands = {tuple(p["spec"]["containers"][0]["command"]) for p in pods}
    assert len(commands) == 1  # the same command on every node
    assert "--rdzv-endpoint=ito-run42-node0.ito-run42.ito.svc:29400" in next(iter(commands))
    assert pods[0]["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert all(p["spec"]["restartPolicy"] == "Never" for p in pods)
    service = headless_service(SPEC, "ito")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {"ito/run": "run42"}


def test_kubernetes_names_are_dns_labels_for_ledger_run_ids():
    spec = LaunchSpec(run_id="run_" + "Q" * 58, nnodes=2, nproc_per_node=1, module="m")
    pods = pod_specs(spec, KubernetesSettings(image="i", volume_claim="c", mount_path="/data", namespace="ito"))
    names = [p["metadata"]["name"] for p in pods] + [headless_service(spec, "ito")["metadata"]["name"]]
    for name in names:
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, name
    assert len(set(names)) == 3
    # Cut names keep a digest of the whole id: two attempts of a long run id never share a pod.
    other = pod_specs(LaunchSpec(run_id="run_" + "Q" * 57 + "1", nnodes=1, nproc_per_node=1, module="m"),
                      KubernetesSettings(image="i", volume_claim="c", mount_path="/data"))
    assert other[0]["metadata"]["name"] != pods[0]["metadata"]["name"]
