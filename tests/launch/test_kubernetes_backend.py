"""The Kubernetes back end against a fake CoreV1Api (no cluster is reachable here): every body it
sends must round-trip through the client's own V1Pod/V1Service models, and the fake answers with
V1Pod models in the phases and exit codes a cluster would give."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

kubernetes = pytest.importorskip("kubernetes")  # the `cluster` extra
from kubernetes.client import ApiClient  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from ito_assets.launch.backend import BackendKind, LaunchConfig  # noqa: E402
from ito_assets.launch.kubernetes import KubernetesBackend, KubernetesSettings  # noqa: E402
from ito_assets.runtime.stage.config import RESULT_NAME, WorkerConfig  # noqa: E402
from ito_assets.training.layout import Layout  # noqa: E402
from ito_assets.runtime.supervision.launch import worker_spec  # noqa: E402
from ito_assets.runtime.supervision.supervisor import Supervisor, SupervisorConfig  # noqa: E402

CLIENT = ApiClient()


def _model(body: dict, kind: str):
    """`body` as the client's model; a body with a missing required field, a wrong type or a key the
    model does not know (it would be dropped silently on the wire) fails here."""
    model = CLIENT._ApiClient__deserialize(json.loads(json.dumps(body)), kind)
    assert CLIENT.sanitize_for_serialization(model) == body, f"{kind} has fields the API does not know"
    return model


class FakeCoreV1:
    """Pods and services of one namespace. `lingering` pods outlive a graceful delete (a rank that
    ignores SIGTERM) until deleted with grace 0."""

    def __init__(self) -> None:
        self.pods: dict[str, dict] = {}
        self.services: dict[str, dict] = {}
        self.calls: list[tuple] = []
        self.sent: list[dict] = []  # the pod bodies, as given
        self.lingering: set[str] = set()
        self.unavailable = False  # the API server answers 503
        self.on_create = lambda body: None

    def create_namespaced_service(self, namespace, body):
        _model(body, "V1Service")
        self.calls.append(("create_service", body["metadata"]["name"]))
        self.services[body["metadata"]["name"]] = body

    def create_namespaced_pod(self, namespace, body):
        _model(body, "V1Pod")
        self.calls.append(("create_pod", body["metadata"]["name"]))
        self.sent.append(body)
        self.pods[body["metadata"]["name"]] = {**body, "status": {"phase": "Pending"}}
        self.on_create(body)

    def set(self, name: str, phase: str, exit_code: int | None = None) -> None:
        status: dict = {"phase": phase}
        if exit_code is not None:
            status["containerStatuses"] = [{"name": "trainer", "image": "i", "imageID": "", "ready": False,
                                            "restartCount": 0, "state": {"terminated": {"exitCode": exit_code}}}]
        self.pods[name]["status"] = status

    def list_namespaced_pod(self, namespace, label_selector):
        if self.unavailable:
            raise ApiException(status=503, reason="Service Unavailable")
        key, value = label_selector.split("=")
        items = [p for p in self.pods.values() if p["metadata"]["labels"].get(key) == value]
        return CLIENT._ApiClient__deserialize({"items": items}, "V1PodList")

    def delete_namespaced_pod(self, name, namespace, grace_period_seconds=None):
        self.calls.append(("delete_pod", name, grace_period_seconds))
        if name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        if name in self.lingering and grace_period_seconds != 0:
            return  # Terminating: still listed until the kubelet gives up or a forced delete
        del self.pods[name]

    def delete_namespaced_service(self, name, namespace):
        self.calls.append(("delete_service", name))
        if self.services.pop(name, None) is None:
            raise ApiException(status=404, reason="Not Found")

    def read_namespaced_pod_log(self, name, namespace):
        if self.pods[name]["status"]["phase"] == "Pending":
            raise ApiException(status=400, reason="container is waiting to start")
        return f"output of {name}"


SETTINGS = KubernetesSettings(image="ito-training:0.1.0", volume_claim="ito-runs", mount_path="/mnt/ito",
                              namespace="ito", gpus_per_node=8)
STAGE = Path("/mnt/ito/run_x/pretraining")


def _start(api: FakeCoreV1, *, nnodes: int = 2, number: int = 0, stage: Path = STAGE, tmp_log: Path | None = None):
    spec = worker_spec(stage / f"attempt-{number}.json", nnodes=nnodes, nproc_per_node=8,
                       rdzv_id=f"run_x-pretraining-{number}")
    log_path = tmp_log or stage / f"attempt-{number}.log"
    return KubernetesBackend(SETTINGS, api=api).start(spec, number=number, log_path=log_path)


def test_an_attempt_is_a_headless_service_and_one_pod_per_node_on_the_shared_volume():
    api = FakeCoreV1()
    attempt = _start(api)
    assert api.calls == [("create_service", "ito-run-x-pretraining-0"), ("create_pod", "ito-run-x-pretraining-0-node0"),
                         ("create_pod", "ito-run-x-pretraining-0-node1")]
    pod = _model(api.sent[1], "V1Pod")
    container = pod.spec.containers[0]
    command = " ".join(container.command)
    assert "-m ito_assets.runtime.worker.main --config /mnt/ito/run_x/pretraining/attempt-0.json" in command
    assert "--rdzv-id=run_x-pretraining-0" in command and "--nnodes=2" in command and "--nproc-per-node=8" in command
    assert "--rdzv-endpoint=ito-run-x-pretraining-0-node0.ito-run-x-pretraining-0.ito.svc:29400" in command
    assert pod.spec.volumes[0].persistent_volume_claim.claim_name == "ito-runs"
    assert container.volume_mounts[0].mount_path == "/mnt/ito" and container.resources.limits == {"nvidia.com/gpu": "8"}
    service = _model(api.services["ito-run-x-pretraining-0"], "V1Service")
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses
    assert attempt.pods == ["ito-run-x-pretraining-0-node0", "ito-run-x-pretraining-0-node1"]


def test_a_config_outside_the_shared_volume_is_refused_before_any_pod():
    api = FakeCoreV1()
    with pytest.raises(ValueError, match="mount_path"):
        _start(api, stage=Path("/tmp/elsewhere"))
    assert api.calls == []


def test_the_exit_code_is_the_first_failed_nodes_else_zero_once_all_succeeded(tmp_path):
    api = FakeCoreV1()
    attempt = _start(api, tmp_log=tmp_path / "a.log")
    node0, node1 = attempt.pods
    assert attempt.exit_code() is None  # pending
    api.set(node0, "Running")
    api.set(node1, "Succeeded", exit_code=0)
    assert attempt.exit_code() is None  # one node still runs
    api.set(node0, "Running", exit_code=137)  # terminated, phase not yet updated
    api.unavailable = True
    assert attempt.exit_code() is None  # unknown is not an end: ask again at the next poll
    api.unavailable = False
    assert attempt.exit_code() == 137
    api.set(node0, "Failed")  # evicted: no container status
    assert attempt.exit_code() == 1
    api.set(node0, "Succeeded", exit_code=0)
    assert attempt.exit_code() == 0
    del api.pods[node1]  # deleted behind the supervisor's back: a lost node
    assert attempt.exit_code() == 1


def test_terminate_deletes_with_the_grace_period_then_forces_what_is_left(tmp_path):
    api = FakeCoreV1()
    attempt = _start(api, tmp_log=tmp_path / "attempt-0.log")
    attempt.poll_s = 0.05
    node0, node1 = attempt.pods
    api.lingering.add(node0)
    api.set(node0, "Running")  # node 1 still pending: it has no log yet

    seconds = attempt.terminate({1234}, grace_s=0.5)

    deletes = [c for c in api.calls if c[0].startswith("delete")]
    assert deletes == [("delete_pod", node0, 1), ("delete_pod", node1, 1), ("delete_pod", node0, 0),
                       ("delete_service", "ito-run-x-pretraining-0")]
    assert 0.5 <= seconds < 5.0 and api.pods == {} and api.services == {}
    log = (tmp_path / "attempt-0.log").read_text()
    assert f"output of {node0}" in log and f"--- {node1}\n(no log: 400" in log
    attempt.release()  # already gone: nothing raises


def test_the_supervisor_restarts_a_failed_pod_attempt_with_fresh_pods(tmp_path):
    """Through the supervisor's JSON config: attempt 0 loses node 1 (exit 137), its pods go, attempt 1
    runs on new pods with its own rendezvous id and finishes."""
    api = FakeCoreV1()
    settings = KubernetesSettings(image="i", volume_claim="c", mount_path=str(tmp_path), namespace="ito")
    stage_dir = tmp_path / "checkpoints" / "pretraining"

    def on_create(body: dict) -> None:  # what the pods' ranks would do
        name = body["metadata"]["name"]
        if name.endswith("-0-node1"):
            api.set(name, "Failed", exit_code=137)
        elif "-1-node" in name:
            api.set(name, "Succeeded", exit_code=0)
            (stage_dir / RESULT_NAME).write_text(json.dumps({"num_steps": 24}))

    api.on_create = on_create
    config = SupervisorConfig.from_dict(json.loads(json.dumps({
        "nnodes": 2, "poll_interval_s": 0.05, "grace_s": 0.2, "startup_timeout_s": 30,
        "launch": {"backend": "kubernetes", "kubernetes": settings.__dict__}})))
    assert config.launch == LaunchConfig(backend=BackendKind.KUBERNETES, kubernetes=settings)
    supervisor = Supervisor(worker=_worker(tmp_path), config=config, backend=KubernetesBackend(settings, api=api))
    report = supervisor.run()

    assert report.outcome == "succeeded" and report.num_attempts == 2 and report.faults[0].kind == "dead"
    created = [c[1] for c in api.calls if c[0] == "create_pod"]
    assert created == [f"ito-run-x-pretraining-{n}-node{i}" for n in (0, 1) for i in (0, 1)]
    assert api.pods == {} and api.services == {}  # the failed attempt terminated, the finished one released
    command = " ".join(_model(api.sent[2], "V1Pod").spec.containers[0].command)  # attempt 1, node 0
    assert f"--config {stage_dir}/attempt-1.json" in command and "--rdzv-id=run_x-pretraining-1" in command


def _worker(root: Path) -> WorkerConfig:
    return WorkerConfig(run_key="run_x", stage="pretraining", model="micro", vocab_size=512,
                        tokens_path=str(root / "train.npy"), heldout_path=None,
                        stage_dir=str(root / "checkpoints" / "pretraining"), heartbeat_dir=str(root / "heartbeats"),
                        metrics_path=str(root / "metrics.jsonl"), num_steps=24, batch_size=8, sequence_length=32,
                        interval_steps=8, keep_last=3, launched_at=time.time(), layout=Layout(dp_shard=2))
