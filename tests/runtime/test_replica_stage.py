"""The replica stage (`ito_assets.runtime.supervision.replicas`) around its groups' real supervisors,
with a fake back end and a fake torchft lighthouse (no torchrun, no worker): what each group is launched
with, a stop request, the end of the stage when group 0 ends, the relay of group 0's metrics and the
comparison of the groups' final weights."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import pytest

from ito_assets.launch.backend import BackendKind, LaunchConfig
from ito_assets.launch.kubernetes import KubernetesSettings
from ito_assets.launch.slurm import SlurmSettings
from ito_assets.runtime.stage.config import CONFIG_NAME, RESULT_NAME
from ito_assets.runtime.supervision import heartbeat, launch
from ito_assets.runtime.supervision import replicas
from ito_assets.runtime.supervision.replicas import LIGHTHOUSE_ENV, ReplicaStage, group_supervision, replica_dir
from ito_assets.runtime.supervision.supervisor import (REPORT_NAME, Outcome, StageBusy, StageSuperseded, SupervisorConfig,
                                                        supervising)
from ito_assets.runtime.worker.reporting import PIPES_CONTEXT_ENV_VAR
from runtime_helpers import worker_config

pytestmark = pytest.mark.timeout(60)

CONFIG = SupervisorConfig(nproc_per_node=2, hang_timeout_s=30.0, startup_timeout_s=30.0, poll_interval_s=0.01,
                          grace_s=1.0, max_restarts=1)
POLL_LIMIT = 5_000  # an attempt polled this often was never ended: the test fails instead of hanging


class FakeLighthouse:
    def __init__(self, **_: object):
        self.stopped = False

    def address(self) -> str:
        return "http://lighthouse:1"

    def shutdown(self) -> None:
        self.stopped = True


@dataclass
class FakeAttempt:
    number: int
    group: int
    stage_dir: Path
    run: Callable[["FakeAttempt"], int | None]  # one poll -> exit code (None: running)
    launched_at: float = field(default_factory=time.time)
    code: int | None = None
    polls: int = 0
    terminated_at: float | None = None  # time.monotonic()

    def exit_code(self) -> int | None:
        self.polls += 1
        assert self.polls < POLL_LIMIT, f"group {self.group}'s attempt was never ended"
        if self.code is None:
            self.code = self.run(self)
        return self.code

    def wait(self, timeout_s: float) -> None:
        time.sleep(timeout_s)

    def terminate(self, worker_pids: set[int], *, grace_s: float) -> float:
        self.terminated_at = time.monotonic()
        self.code = -15 if self.code is None else self.code
        return 0.0

    def release(self) -> None:
        pass


def succeed(digest: str = "sha256:same", metrics: str = "") -> Callable[[FakeAttempt], int]:
    """Writes the group's result (and a metrics line rank 0 would append) and exits 0."""
    def run(attempt: FakeAttempt) -> int:
        (attempt.stage_dir / RESULT_NAME).write_text(json.dumps({"num_steps": 24, "parameters_sha256": digest}))
        if metrics:
            with open(metrics, "a") as out:
                out.write(json.dumps({"kind": "metrics", "step": 24, "at": 0.0, "loss": 1.5,
                                      "group": attempt.group}) + "\n")
        return 0
    return run


def running(attempt: FakeAttempt) -> None:
    return None


def after(polls: int, then: Callable[[FakeAttempt], int | None]) -> Callable[[FakeAttempt], int | None]:
    return lambda attempt: then(attempt) if attempt.polls > polls else None


class Cluster:
    """The back end of every group (told apart by the folder of the attempt's log): records each
    launch's spec and plays the group's behaviour."""

    def __init__(self, stage_dir: Path, behaviours: dict[int, Callable[[FakeAttempt], int | None]]):
        self.stage_dir, self.behaviours = stage_dir, behaviours
        self.specs: dict[int, list] = {}
        self.attempts: dict[int, list[FakeAttempt]] = {}
        self.lock = threading.Lock()

    def group_of(self, folder: Path) -> int:
        return next(i for i in self.behaviours if replica_dir(self.stage_dir, i) == folder)

    def start(self, spec, *, number: int, log_path: Path) -> FakeAttempt:
        group = self.group_of(log_path.parent)
        run = self.behaviours[group]
        if group == 0:  # group 0 plays its part once every group has launched: an end before that
            run = self._once_all_launched(run)  # would stop the others before their first attempt
        attempt = FakeAttempt(number=number, group=group, stage_dir=log_path.parent, run=run)
        with self.lock:
            self.specs.setdefault(group, []).append(spec)
            self.attempts.setdefault(group, []).append(attempt)
        return attempt

    def _once_all_launched(self, run: Callable[[FakeAttempt], int | None]) -> Callable[[FakeAttempt], int | None]:
        return lambda attempt: run(attempt) if self.launched(*self.behaviours) else None

    def launched(self, *groups: int) -> bool:
        with self.lock:
            return all(g in self.attempts for g in groups)


def _stage(tmp_path, tokens, monkeypatch, behaviours, *, groups: int = 2, config: SupervisorConfig = CONFIG,
           **changes) -> tuple[ReplicaStage, Cluster]:
    worker = worker_config(tmp_path, tokens, replica_groups=groups, replica_timeout_s=10.0, **changes)
    cluster = Cluster(Path(worker.stage_dir), behaviours)
    monkeypatch.setattr(launch, "backend_for", lambda _: cluster)
    monkeypatch.setattr("torchft.coordination.LighthouseServer", FakeLighthouse)
    return ReplicaStage(worker=worker, config=replace(config, nproc_per_node=groups)), cluster


def _report(stage: ReplicaStage) -> dict:
    return json.loads((Path(stage.worker.stage_dir) / REPORT_NAME).read_text())


def _outcomes(stage: ReplicaStage) -> list[str]:
    return [g["outcome"] for g in _report(stage)["replica_groups"]]


def test_a_stop_requested_before_the_groups_exist_reaches_every_group(tmp_path, tokens, monkeypatch):
    """SIGTERM while the lighthouse starts (torchft's import alone takes seconds): no group
    supervisor exists yet to be told, and the stage must still stop, not train to its end."""
    behaviours = {0: after(200, succeed()), 1: running}  # a whole stage, were the stop lost
    stage, cluster = _stage(tmp_path, tokens, monkeypatch, behaviours)
    stage.request_stop()
    report = stage.run()
    assert report.outcome is Outcome.STOPPED
    assert _outcomes(stage) == ["stopped", "stopped"]


def test_a_stop_request_reaches_every_running_group(tmp_path, tokens, monkeypatch):
    stage, cluster = _stage(tmp_path, tokens, monkeypatch, {0: running, 1: running})
    threading.Thread(target=lambda: (_wait_for(lambda: cluster.launched(0, 1)), stage.request_stop()),
                     daemon=True).start()
    assert stage.run().outcome is Outcome.STOPPED
    assert _outcomes(stage) == ["stopped", "stopped"]
    assert all(a.terminated_at is not None for attempts in cluster.attempts.values() for a in attempts)


def _wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.005)


def test_groups_that_split_one_node_of_this_machine_get_gpus_of_their_own(tmp_path, tokens, monkeypatch):
    """torchrun numbers each group's ranks from local rank 0, and the worker takes `cuda:<local
    rank>`: without a device list of its own, every group would train on the first GPUs (NCCL
    refuses two ranks of one communicator on one GPU) while the others idle."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    stage, cluster = _stage(tmp_path, tokens, monkeypatch, {0: succeed(), 1: succeed()})
    stage.run()
    envs = {g: dict(cluster.specs[g][0].env) for g in (0, 1)}
    assert [envs[g].get("CUDA_VISIBLE_DEVICES") for g in (0, 1)] == ["0", "1"]
    assert envs[0][LIGHTHOUSE_ENV] == envs[1][LIGHTHOUSE_ENV] == "http://lighthouse:1"  # the one thing shared
    assert [(s.nnodes, s.nproc_per_node) for g in (0, 1) for s in cluster.specs[g]] == [(1, 1), (1, 1)]


def test_a_group_takes_its_share_of_the_gpus_this_machine_names():
    whole, devices = replace(CONFIG, nproc_per_node=8), replicas.group_devices
    named = {"CUDA_VISIBLE_DEVICES": "GPU-a, GPU-b,GPU-c,GPU-d,4,5,6,7"}
    assert [devices(whole, 2, i, named) for i in (0, 1)] == [{"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c,GPU-d"},
                                                             {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}]
    assert [devices(whole, 4, i, {}) for i in range(4)] == [{"CUDA_VISIBLE_DEVICES": f"{2 * i},{2 * i + 1}"}
                                                            for i in range(4)]
    assert devices(whole, 2, 1, {"CUDA_VISIBLE_DEVICES": "0,1"}) == {}  # fewer GPUs than ranks: as without groups
    assert devices(replace(whole, nnodes=2), 2, 1, {}) == {}  # loopback nodes share this machine's GPUs anyway
    slurm = LaunchConfig(backend=BackendKind.SLURM, slurm=SlurmSettings(partition="p", time_limit="01:00:00"))
    assert devices(replace(whole, launch=slurm), 2, 1, {}) == {}  # Slurm binds each job's own GPUs


def test_a_group_asks_a_cluster_for_its_share_of_a_node_and_rendezvous_on_a_port_of_its_own():
    """Two groups splitting one node each asked for the whole node's GPUs (using half), and, under
    Slurm, rendezvoused on the same port: two jobs on one node then share one c10d store (torchrun's
    agent that cannot bind the port joins the store on it), and one group's end takes the other's
    rendezvous with it."""
    slurm = LaunchConfig(backend=BackendKind.SLURM, slurm=SlurmSettings(partition="p", time_limit="01:00:00",
                                                                        gpus_per_node=8, rdzv_port=29400))
    node = replace(CONFIG, nnodes=1, nproc_per_node=8, launch=slurm)
    shares = [group_supervision(node, 2, i) for i in (0, 1)]
    assert [(s.nproc_per_node, s.launch.slurm.gpus_per_node, s.launch.slurm.rdzv_port) for s in shares] == [
        (4, 4, 29400), (4, 4, 29401)]
    nodes = group_supervision(replace(node, nnodes=2), 2, 1)  # whole nodes per group: the node's GPUs
    assert (nodes.nnodes, nodes.nproc_per_node, nodes.launch.slurm.gpus_per_node) == (1, 8, 8)
    cpu = replace(slurm, slurm=replace(slurm.slurm, gpus_per_node=0))
    assert group_supervision(replace(node, launch=cpu), 2, 1).launch.slurm.gpus_per_node == 0
    pods = LaunchConfig(backend=BackendKind.KUBERNETES, kubernetes=KubernetesSettings(
        image="i", volume_claim="c", mount_path="/m", gpus_per_node=8))
    share = group_supervision(replace(node, launch=pods), 4, 3).launch.kubernetes
    assert (share.gpus_per_node, share.rdzv_port) == (2, 29400)  # a pod's port is its own


def test_each_group_of_a_split_node_asks_slurm_for_its_own_gpus_and_rendezvous_port(tmp_path, tokens, monkeypatch):
    """What each group's supervisor launches its sbatch jobs with (the back end is built from it)."""
    stage, cluster = _stage(tmp_path, tokens, monkeypatch, {0: succeed(), 1: succeed()})
    launches = []
    monkeypatch.setattr(launch, "backend_for", lambda config: launches.append(config) or cluster)
    slurm = SlurmSettings(partition="p", time_limit="01:00:00", gpus_per_node=2, rdzv_port=29400)
    stage.config = replace(stage.config, launch=LaunchConfig(backend=BackendKind.SLURM, slurm=slurm))
    assert stage.run().outcome is Outcome.SUCCEEDED
    assert sorted((c.slurm.gpus_per_node, c.slurm.rdzv_port) for c in launches) == [(1, 29400), (1, 29401)]
    assert "CUDA_VISIBLE_DEVICES" not in dict(cluster.specs[1][0].env)  # Slurm binds each job's own GPUs


def _beat(folder: Path, step: int) -> None:
    heartbeat.HeartbeatWriter(folder, rank=0, attempt=0).beat(step, "training", force=True)


def test_a_group_behind_a_finished_group_zero_is_stopped_at_once(tmp_path, tokens, monkeypatch):
    """Group 1 reached the last step with group 0 and gets the grace period to write its result;
    group 2 is behind (restarting): nobody is left to heal it, so it is stopped at once, not after
    group 1's grace period."""
    def in_step(attempt):
        _beat(attempt.stage_dir / "heartbeats", 24)  # the last step, its result not yet written

    def behind(attempt):
        _beat(attempt.stage_dir / "heartbeats", 3)

    def first(attempt):  # ends once the other groups are where the test puts them
        beating = all(heartbeat.read_all(replica_dir(attempt.stage_dir, g) / "heartbeats") for g in (1, 2))
        return succeed()(attempt) if cluster.launched(1, 2) and beating else None

    behaviours = {0: first, 1: in_step, 2: behind}
    stage, cluster = _stage(tmp_path, tokens, monkeypatch, behaviours, groups=3, config=replace(CONFIG, grace_s=2.0),
                            batch_size=12)
    assert stage.run().outcome is Outcome.SUCCEEDED
    (finishing,), (restarting,) = cluster.attempts[1], cluster.attempts[2]
    assert restarting.terminated_at < finishing.terminated_at  # not kept waiting behind group 1's grace
    assert _outcomes(stage) == ["succeeded", "stopped", "stopped"]


def test_groups_that_end_with_different_weights_are_reported(tmp_path, tokens, monkeypatch, capsys):
    """Groups in step end bit-identical; one that trained on other weights (it never healed, or
    healed from stale ones) ends with another digest, which the report and stderr must say."""
    stage, _ = _stage(tmp_path, tokens, monkeypatch, {0: succeed("sha256:aaaa"), 1: succeed("sha256:bbbb")})
    assert stage.run().outcome is Outcome.SUCCEEDED  # group 0's weights are the stage's, whole
    report = _report(stage)
    assert report["parameters_agree"] is False
    assert [g["parameters_sha256"] for g in report["replica_groups"]] == ["sha256:aaaa", "sha256:bbbb"]
    assert "ended with different weights" in capsys.readouterr().err


def test_groups_that_end_with_the_same_weights_agree(tmp_path, tokens, monkeypatch, capsys):
    stage, _ = _stage(tmp_path, tokens, monkeypatch, {0: succeed(), 1: succeed()})
    stage.run()
    assert _report(stage)["parameters_agree"] is True and capsys.readouterr().err == ""
    stopped, _ = _stage(tmp_path / "other", tokens, monkeypatch, {0: succeed(), 1: running})
    stopped.run()
    assert _report(stopped)["parameters_agree"] is None  # one group finished: nothing to compare


def test_group_zeros_metrics_are_relayed_to_pipes_when_the_ranks_run_remotely(tmp_path, tokens, monkeypatch):
    """Under Slurm or Kubernetes rank 0 has no Pipes channel: it appends to metrics.jsonl and the
    supervising process relays the lines, as `supervisor.main` does; only group 0's (one writer
    per stage)."""
    received = []

    class Context:
        def report_custom_message(self, message):
            received.append(message)

    @contextlib.contextmanager
    def open_dagster_pipes():
        yield Context()

    monkeypatch.setattr("dagster_pipes.open_dagster_pipes", open_dagster_pipes)
    monkeypatch.setenv(PIPES_CONTEXT_ENV_VAR, "set by the step")
    monkeypatch.setattr(signal, "signal", lambda number, handler: None)
    worker = worker_config(tmp_path, tokens, replica_groups=2, replica_timeout_s=10.0)
    group_metrics = {0: worker.metrics_path, 1: str(replica_dir(Path(worker.stage_dir), 1) / "metrics.jsonl")}
    cluster = Cluster(Path(worker.stage_dir), {g: succeed(metrics=group_metrics[g]) for g in (0, 1)})
    monkeypatch.setattr(launch, "backend_for", lambda _: cluster)
    monkeypatch.setattr("torchft.coordination.LighthouseServer", FakeLighthouse)
    slurm = LaunchConfig(backend=BackendKind.SLURM, slurm=SlurmSettings(partition="p", time_limit="01:00:00"))
    config = replace(CONFIG, launch=slurm)
    assert replicas.main(["--worker", worker.to_json(), "--supervisor", json.dumps(asdict(config))]) == 0
    assert received == [{"kind": "metrics", "step": 24, "loss": 1.5, "group": 0}]


def test_on_kubernetes_the_ranks_reach_the_lighthouse_at_this_pods_ip(tmp_path, tokens, monkeypatch):
    """A pod's name (torchft's host in the address) resolves only inside that pod: the trainer pods
    could not reach the supervisor pod's lighthouse by it."""
    stage, cluster = _stage(tmp_path, tokens, monkeypatch, {0: succeed(), 1: succeed()})
    monkeypatch.setattr(replicas.socket, "gethostname", lambda: "supervisor-7f9c")
    monkeypatch.setattr(replicas.socket, "getaddrinfo", _hosts({"supervisor-7f9c": "10.4.2.17"}))
    pods = LaunchConfig(backend=BackendKind.KUBERNETES, kubernetes=KubernetesSettings(
        image="i", volume_claim="c", mount_path="/m", gpus_per_node=2))
    stage.config = replace(stage.config, launch=pods)
    assert stage.run().outcome is Outcome.SUCCEEDED
    assert {dict(cluster.specs[g][0].env)[LIGHTHOUSE_ENV] for g in (0, 1)} == {"http://10.4.2.17:1"}


def test_elsewhere_the_ranks_reach_the_lighthouse_where_torchft_says(monkeypatch):
    for backend in (BackendKind.LOCAL, BackendKind.SLURM):
        assert replicas.lighthouse_url("http://head-node:29510", backend) == "http://head-node:29510"
    monkeypatch.setattr(replicas.socket, "gethostname", lambda: "supervisor-7f9c")
    monkeypatch.setattr(replicas.socket, "getaddrinfo", _hosts({"supervisor-7f9c": "fd00::2a"}))
    assert replicas.lighthouse_url("http://supervisor-7f9c:29510", BackendKind.KUBERNETES) == "http://[fd00::2a]:29510"


def _hosts(table: dict[str, str]):
    """getaddrinfo over `table` (name -> address), as a pod's /etc/hosts answers it."""
    def getaddrinfo(name, port, *args, **kwargs):
        ip = table[name]
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (ip, port) if family == socket.AF_INET else (ip, port, 0, 0))]
    return getaddrinfo


def test_a_second_replica_stage_of_the_stage_starts_nothing_and_says_who_holds_it(tmp_path, tokens, monkeypatch, capsys):
    stage, cluster = _stage(tmp_path, tokens, monkeypatch, {0: succeed(), 1: succeed()})
    folder = Path(stage.worker.stage_dir)
    folder.mkdir(parents=True)
    with supervising(folder):  # the first replica stage of this stage runs
        with pytest.raises(StageBusy):
            stage.run()
        assert cluster.attempts == {}
        monkeypatch.setattr(signal, "signal", lambda number, handler: None)
        monkeypatch.setattr(replicas, "refused_arguments", lambda module, argv: (stage.worker, stage.config))
        assert replicas.main([]) == 1
    err = capsys.readouterr().err
    assert "already supervises the attempts in" in err and "Traceback" not in err
    assert stage.run().outcome is Outcome.SUCCEEDED  # the groups run under the stage's one lock


def test_a_replica_stage_whose_config_a_later_launch_rewrote_starts_no_group(tmp_path, tokens, monkeypatch):
    stage, cluster = _stage(tmp_path, tokens, monkeypatch, {0: succeed(), 1: succeed()})
    folder = Path(stage.worker.stage_dir)
    folder.mkdir(parents=True)
    (folder / CONFIG_NAME).write_text(replace(stage.worker, launch_id="b" * 32).to_json())
    stage.config = replace(stage.config, launch_id="a" * 32)
    with pytest.raises(StageSuperseded):
        stage.run()
    assert cluster.attempts == {} and stage.groups == []


def test_a_pod_name_without_an_address_keeps_torchfts_own(monkeypatch):
    def nowhere(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(replicas.socket, "getaddrinfo", nowhere)
    assert replicas.lighthouse_url("http://supervisor-7f9c:29510", BackendKind.KUBERNETES) == "http://supervisor-7f9c:29510"
