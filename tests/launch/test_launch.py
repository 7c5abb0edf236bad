"""The launch back ends: a real two-"node" torchrun on loopback through the local back end, and
the rendered Slurm and Kubernetes forms of the same spec, all from one torchrun command."""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

from ito_assets.launch.backend import BackendKind, LaunchConfig
from ito_assets.launch.kubernetes import KubernetesSettings, headless_service, job_body, pod_hostname
from ito_assets.launch.local import LocalBackend, node_commands
from ito_assets.launch.slurm import SlurmSettings, exit_code_of, sbatch_script
from ito_assets.launch.spec import LaunchSpec, direct_command, torchrun_command

# Every rank joins the group and all-reduces its rank; rank 0 writes what each rank saw.
PROBE = """
import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank)])
dist.all_reduce(total)
ranks = [None] * world
dist.all_gather_object(ranks, {"rank": rank, "group_rank": os.environ.get("GROUP_RANK")})
if rank == 0:
    with open(sys.argv[1], "w") as out:
        json.dump({"world_size": world, "rank_sum": total.item(), "ranks": ranks}, out)
dist.destroy_process_group()
"""


def _wait(attempt, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    while (code := attempt.exit_code()) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if code is None:
        attempt.terminate(set(), grace_s=5)
    return code


# A world of one: the worker's own `distributed.init`, with no launcher's environment.
LONE_PROBE = """
import json, os, sys
from datetime import timedelta
import torch.distributed as dist
from ito_assets.runtime.worker import distributed
group = distributed.init(30.0)
# A replica group's torchft manager connects to the store the environment names, as a client.
client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                       timeout=timedelta(seconds=30))
client.set("probe", "seen")
with open(sys.argv[1], "w") as out:
    json.dump({"pid": os.getpid(), "world_size": group.world_size, "rank": group.rank,
               "env": {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}}, out)
distributed.shutdown()
"""


def test_a_world_of_one_starts_alone_and_hosts_the_store_torchrun_would(tmp_path, monkeypatch):
    # As if the supervisor were itself rank 3 of 8: the lone rank must not wait for the others.
    for name, value in (("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "3"), ("MASTER_ADDR", "10.9.9.9"),
                        ("MASTER_PORT", "1")):
        monkeypatch.setenv(name, value)
    (tmp_path / "lone.py").write_text(LONE_PROBE)
    out = tmp_path / "lone.json"
    spec = LaunchSpec(run_id="lone", nnodes=1, nproc_per_node=1, module="lone", args=(str(out),),
                      env=(("PYTHONPATH", str(tmp_path)),))
    attempt = LocalBackend().start(spec, number=0, log_path=tmp_path / "attempt.log")
    assert _wait(attempt, timeout_s=120) == 0, (tmp_path / "attempt.log").read_text()[-3000:]
    result = json.loads(out.read_text())
    assert result["pid"] == attempt.processes[0].pid  # no launcher between the supervisor and the rank
    assert (result["world_size"], result["rank"]) == (1, 0)
    assert result["env"] == {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}


@pytest.mark.slow
def test_two_node_torchrun_on_loopback(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    out = tmp_path / "probe.json"
    spec = LaunchSpec(run_id="two-node-test", nnodes=2, nproc_per_node=1, module="probe", args=(str(out),),
                      env=(("PYTHONPATH", str(tmp_path)),))
    attempt = LocalBackend().start(spec, number=0, log_path=tmp_path / "attempt.log")
    assert len(attempt.processes) == 2  # one launcher per node
    code = _wait(attempt, timeout_s=180)
    assert code == 0, (tmp_path / "attempt.log").read_text()[-3000:]
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


SPEC = LaunchSpec(run_id="run42", nnodes=4, nproc_per_node=8, module="ito_assets.runtime.worker.main",
                  args=("--config", "/tmp/x.json"), backend="nccl", env=(("ITO_STATE_DIR", "/var/lib/ito"),))


def test_the_torchrun_command_is_the_same_on_every_node():
    command = torchrun_command(SPEC, python="python3")
    assert command[:3] == ["python3", "-m", "torch.distributed.run"]
    assert "--nnodes=4" in command and "--nproc-per-node=8" in command and "--rdzv-backend=c10d" in command
    assert "--rdzv-id=run42" in command and not any(a.startswith("--node-rank") for a in command)
    assert "--rdzv-endpoint=127.0.0.1:29400" in command and "--max-restarts=0" in command
    assert command[-4:] == ["-m", "ito_assets.runtime.worker.main", "--config", "/tmp/x.json"]
    assert "--rdzv-endpoint=host:1" in torchrun_command(SPEC, rdzv_endpoint="host:1")


def test_one_node_on_this_machine_is_a_standalone_torchrun():
    one = LaunchSpec(run_id="r", nnodes=1, nproc_per_node=2, module="m", args=("--config", "c.json"))
    assert node_commands(one) == [[sys.executable, "-m", "torch.distributed.run", "--standalone",
                                   "--nproc-per-node=2", "--max-restarts=0", "-m", "m", "--config", "c.json"]]
    with pytest.raises(ValueError, match="one node"):
        torchrun_command(SPEC, standalone=True)


def test_a_world_of_one_is_the_worker_alone_and_two_ranks_are_torchrun():
    one = LaunchSpec(run_id="r", nnodes=1, nproc_per_node=1, module="m", args=("--config", "c.json"))
    assert node_commands(one) == [[sys.executable, "-m", "m", "--config", "c.json"]]
    assert direct_command(one, python="python3") == ["python3", "-m", "m", "--config", "c.json"]
    two_nodes = LaunchSpec(run_id="r", nnodes=2, nproc_per_node=1, module="m")
    assert all("torch.distributed.run" in command for command in node_commands(two_nodes))
    with pytest.raises(ValueError, match="world of one"):
        direct_command(two_nodes)


def test_several_nodes_on_this_machine_meet_on_a_free_loopback_port():
    commands = node_commands(SPEC)
    assert len(commands) == 4 and all(c == commands[0] for c in commands)
    endpoint = next(a for a in commands[0] if a.startswith("--rdzv-endpoint="))
    assert endpoint.startswith("--rdzv-endpoint=127.0.0.1:")


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


def test_kubernetes_job_and_service():
    job = job_body(SPEC, KubernetesSettings(image="ito-training:0.1.0", volume_claim="ito-runs",
                                            mount_path="/var/lib/ito", namespace="ito", gpus_per_node=8))
    assert job["metadata"]["name"] == "ito-run42" and job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    pod = job["spec"]["template"]["spec"]
    assert "--rdzv-endpoint=ito-run42-0.ito-run42.ito.svc:29400" in pod["containers"][0]["command"]
    assert pod["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == "ito-run42"
    service = headless_service(SPEC, "ito", "uid-1")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {"ito/run": "run42"}
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()


def test_kubernetes_names_are_dns_labels_for_ledger_run_ids():
    settings = KubernetesSettings(image="i", volume_claim="c", mount_path="/data", namespace="ito")
    spec = LaunchSpec(run_id="run_" + "Q" * 58, nnodes=12, nproc_per_node=1, module="m")
    job = job_body(spec, settings)
    # The Job controller names each pod's host `<job>-<index>`: the last index must fit a label too.
    names = [job["metadata"]["name"], headless_service(spec, "ito", "u")["metadata"]["name"], pod_hostname(spec, 11)]
    for name in names:
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, name
    assert len(pod_hostname(spec, 11)) == 63 and job["spec"]["template"]["spec"]["subdomain"] == names[0]
    # Cut names keep a digest of the whole id: two attempts of a long run id never share a Job.
    other = LaunchSpec(run_id="run_" + "Q" * 57 + "1", nnodes=12, nproc_per_node=1, module="m")
    assert job_body(other, settings)["metadata"]["name"] != names[0]
