"""The Kubernetes back end against a fake cluster (no cluster is reachable here): every body it
sends must round-trip through the client's own V1Job/V1Service models, and the fake answers with
V1Job and V1Pod models in the states and exit codes a cluster would give. The fake also plays the
controllers the back end relies on once its supervisor is gone: the Job controller (pods from the
template, the deadline, backoffLimit 0), the TTL-after-finished controller and the garbage
collector. Every call must bound its wait for an answer (`_request_timeout`) and every delete name
the uid of the object it means; the fake refuses a delete whose precondition fails (409), as the
API server does."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import random
import socket
import string
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import pytest

kubernetes = pytest.importorskip("kubernetes")  # the `cluster` extra
from kubernetes.client import ApiClient, V1DeleteOptions  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from urllib3.exceptions import MaxRetryError, ReadTimeoutError  # noqa: E402

from ito_assets.launch.backend import BackendKind, LaunchConfig  # noqa: E402
from ito_assets.launch.kubernetes import (  # noqa: E402
    DEADLINE_EXIT, INDEX_KEY, JOB_NAME_LABEL, MISSING_JOB_EXIT, REQUEST_TIMEOUT_S, KubernetesAttempt,
    KubernetesBackend, KubernetesSettings, headless_service, job_body, job_exit_code,
)
from ito_assets.launch.spec import LaunchSpec  # noqa: E402
from ito_assets.runtime.stage.config import RESULT_NAME, WorkerConfig  # noqa: E402
from ito_assets.training.layout import Layout  # noqa: E402
from ito_assets.runtime.supervision.launch import worker_spec  # noqa: E402
from ito_assets.runtime.supervision.supervisor import Supervisor, SupervisorConfig  # noqa: E402

CLIENT = ApiClient()
FINISHED = ("Succeeded", "Failed")


def _model(body: dict, kind: str):
    """`body` as the client's model; a body with a missing required field, a wrong type or a key the
    model does not know (it would be dropped silently on the wire) fails here."""
    model = CLIENT._ApiClient__deserialize(json.loads(json.dumps(body)), kind)
    assert CLIENT.sanitize_for_serialization(model) == body, f"{kind} has fields the API does not know"
    return model


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _not_found() -> ApiException:
    return ApiException(status=404, reason="Not Found")


def _no_answer(method: str) -> Exception:
    """What the real client (kubernetes 36, urllib3 2) raises against an API server that accepted
    the connection and never answered: a create (POST) is not retried; a GET or a DELETE is, three
    times, then gives up with MaxRetryError."""
    timeout = ReadTimeoutError(None, "/api", "Read timed out. (read timeout=30)")
    return timeout if method.startswith("create_") else MaxRetryError(None, "/api", timeout)


def _check_precondition(options: V1DeleteOptions, uid: str) -> None:
    if options.preconditions is not None and options.preconditions.uid not in (None, uid):
        raise ApiException(status=409, reason="Conflict")  # "Precondition failed: UID in precondition: ..."


@dataclass
class FakeJob:
    body: dict
    uid: str
    started: float
    finished: float | None = None
    condition: tuple[str, str] | None = None  # (type, reason) once finished
    lost_pod: bool = False  # a pod deleted before it finished: a failure, with backoffLimit 0

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]


@dataclass
class FakeCluster:
    """One namespace behind both APIs (the CoreV1Api and BatchV1Api methods the back end calls).
    `lingering` pods outlive a graceful delete (a rank that ignores SIGTERM) until deleted with
    grace 0. `now` is the cluster's clock (Unix seconds), moved by `tick`."""

    now: float = field(default_factory=time.time)
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    pods: dict[str, dict] = field(default_factory=dict)
    services: dict[str, dict] = field(default_factory=dict)
    calls: list[tuple] = field(default_factory=list)
    sent: list[dict] = field(default_factory=list)  # the Job bodies, as given
    lingering: set[str] = field(default_factory=set)
    unavailable: bool = False  # the API server answers 503
    hung: set[str] = field(default_factory=set)  # the API methods that get no answer
    requests: list[tuple[str, dict]] = field(default_factory=list)  # every API call's method and keyword arguments
    preconditions: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, name, uid) of each delete
    on_create: object = lambda pod: None  # what a pod's ranks do once it exists
    # A deleted Job, and the service the garbage collector deletes with it, keep their names for this
    # many more creates (finalizers, the collector's delay): each is refused 409, as by the API.
    removal_tries: int = 0
    removing: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, name): refusals left

    # --- BatchV1Api -----------------------------------------------------------------------------

    def create_namespaced_job(self, namespace, body, **kwargs):
        self._request("create_namespaced_job", kwargs)
        _model(body, "V1Job")
        name = body["metadata"]["name"]
        self._refuse_taken("job", name, name in self.jobs)
        self.calls.append(("create_job", name))
        self.sent.append(body)
        job = FakeJob(body=body, uid=f"uid-{name}-{len(self.calls)}", started=self.now)
        self.jobs[name] = job
        pods = [self._create_pod(job, index) for index in range(body["spec"]["completions"])]
        for pod in pods:
            self.on_create(pod)
        return self._read_job(name)

    def list_namespaced_job(self, namespace, label_selector, **kwargs):
        self._request("list_namespaced_job", kwargs)
        self._answer()
        key, value = label_selector.split("=")
        items = [CLIENT.sanitize_for_serialization(self._read_job(name)) for name, job in self.jobs.items()
                 if job.body["metadata"]["labels"].get(key) == value]
        return CLIENT._ApiClient__deserialize({"items": items}, "V1JobList")

    def read_namespaced_job(self, name, namespace, **kwargs):
        self._request("read_namespaced_job", kwargs)
        self._answer()
        return self._read_job(name)

    def _read_job(self, name):
        if name not in self.jobs:
            raise _not_found()
        job = self.jobs[name]
        metadata = {**job.body["metadata"], "uid": job.uid}
        return CLIENT._ApiClient__deserialize({**job.body, "metadata": metadata, "status": self._status(job)}, "V1Job")

    def delete_namespaced_job(self, name, namespace, body=None, **kwargs):
        self._request("delete_namespaced_job", kwargs)
        options = body or V1DeleteOptions()
        self.calls.append(("delete_job", name, options.propagation_policy))
        self._precondition("job", name, options)
        if name not in self.jobs:
            raise _not_found()
        _check_precondition(options, self.jobs[name].uid)
        self._delete_job(name, options.propagation_policy)

    # --- CoreV1Api ------------------------------------------------------------------------------

    def create_namespaced_service(self, namespace, body, **kwargs):
        self._request("create_namespaced_service", kwargs)
        _model(body, "V1Service")
        self._refuse_taken("service", body["metadata"]["name"], body["metadata"]["name"] in self.services)
        self.calls.append(("create_service", body["metadata"]["name"]))
        self.services[body["metadata"]["name"]] = body

    def list_namespaced_pod(self, namespace, label_selector, **kwargs):
        self._request("list_namespaced_pod", kwargs)
        self._answer()
        key, value = label_selector.split("=")
        items = [p for p in self.pods.values() if p["metadata"]["labels"].get(key) == value]
        return CLIENT._ApiClient__deserialize({"items": items}, "V1PodList")

    def delete_namespaced_pod(self, name, namespace, body=None, **kwargs):
        self._request("delete_namespaced_pod", kwargs)
        options = body or V1DeleteOptions()
        self.calls.append(("delete_pod", self.index_of(name), options.grace_period_seconds))
        self._precondition("pod", name, options)
        if name not in self.pods:
            raise _not_found()
        _check_precondition(options, self.pods[name]["metadata"]["uid"])
        self._delete_pod(name, force=options.grace_period_seconds == 0)
        self._sync()

    def read_namespaced_pod_log(self, name, namespace, **kwargs):
        self._request("read_namespaced_pod_log", kwargs)
        if name not in self.pods:
            raise _not_found()
        if self.pods[name]["status"]["phase"] == "Pending":
            raise ApiException(status=400, reason="container is waiting to start")
        return f"output of {name}"

    # --- what the tests do to it ----------------------------------------------------------------

    def pod(self, index: int, job: str | None = None) -> str:
        """The name of index `index`'s pod (the Job controller's `<job>-<index>-<random>`) of `job`,
        or of the one Job there is."""
        (name,) = [n for n, p in self.pods.items() if self.index_of(n) == index
                   and p["metadata"]["labels"][JOB_NAME_LABEL] == (job or p["metadata"]["labels"][JOB_NAME_LABEL])]
        return name

    def index_of(self, name: str) -> int:
        return int(name.rsplit("-", 2)[1])

    def set(self, name: str, phase: str, exit_code: int | None = None) -> None:
        status: dict = {"phase": phase}
        if exit_code is not None:
            status["containerStatuses"] = [{"name": "trainer", "image": "i", "imageID": "", "ready": False,
                                            "restartCount": 0, "state": {"terminated": {"exitCode": exit_code}}}]
        self.pods[name]["status"] = status
        self._sync()

    def tick(self, seconds: float) -> None:
        """Time passes on the cluster: deadlines and TTLs fall due."""
        self.now += seconds
        self._sync()

    def empty(self) -> bool:
        return not self.jobs and not self.pods and not self.services

    # --- the controllers ------------------------------------------------------------------------

    def _request(self, method: str, kwargs: dict) -> None:
        """A call's keyword arguments as sent; no answer where the method hangs."""
        assert set(kwargs) <= {"_request_timeout"}, f"{method}: {kwargs}"  # the rest travels in the body
        self.requests.append((method, kwargs))
        if method in self.hung:
            raise _no_answer(method)

    def _refuse_taken(self, kind: str, name: str, exists: bool) -> None:
        if exists or self.removing.get((kind, name), 0) > 0:
            self.removing[(kind, name)] = self.removing.get((kind, name), 1) - 1
            raise ApiException(status=409, reason="AlreadyExists")

    def _precondition(self, kind: str, name: str, options: V1DeleteOptions) -> None:
        uid = options.preconditions.uid if options.preconditions is not None else None
        self.preconditions.append((kind, name, uid))

    def _answer(self) -> None:
        if self.unavailable:
            raise ApiException(status=503, reason="Service Unavailable")

    def _create_pod(self, job: FakeJob, index: int) -> dict:
        template = copy.deepcopy(job.body["spec"]["template"])
        spec = template["spec"]
        spec["hostname"] = f"{job.name}-{index}"
        for container in spec["containers"]:
            container["env"] = [*container.get("env", []), {"name": "JOB_COMPLETION_INDEX", "valueFrom": {
                "fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}}]
        suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        labels = {**template["metadata"]["labels"], JOB_NAME_LABEL: job.name, INDEX_KEY: str(index)}
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job.name, "uid": job.uid, "controller": True,
                 "blockOwnerDeletion": True}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{job.name}-{index}-{suffix}", "namespace": job.body["metadata"]["namespace"],
                            "uid": f"uid-pod-{job.name}-{index}-{suffix}", "labels": labels,
                            "annotations": {INDEX_KEY: str(index)}, "ownerReferences": [owner]},
               "spec": spec}
        _model(pod, "V1Pod")
        self.pods[pod["metadata"]["name"]] = {**pod, "status": {"phase": "Pending"}}
        return pod

    def _pods_of(self, job: FakeJob) -> list[dict]:
        return [p for p in self.pods.values() if p["metadata"]["labels"][JOB_NAME_LABEL] == job.name]

    def _status(self, job: FakeJob) -> dict:
        phases = [p["status"]["phase"] for p in self._pods_of(job)]
        status = {"startTime": _stamp(job.started), "active": sum(p not in FINISHED for p in phases),
                  "succeeded": phases.count("Succeeded"), "failed": phases.count("Failed")}
        if job.condition is not None:
            kind, reason = job.condition
            status["conditions"] = [{"type": kind, "status": "True", "reason": reason,
                                     "lastTransitionTime": _stamp(job.finished)}]
        return status

    def _sync(self) -> None:
        for job in list(self.jobs.values()):
            if job.finished is None:
                self._sync_job(job)
        for job in list(self.jobs.values()):  # the TTL-after-finished controller
            ttl = job.body["spec"].get("ttlSecondsAfterFinished")
            if job.finished is not None and ttl is not None and self.now >= job.finished + ttl:
                self._delete_job(job.name, "Background")

    def _sync_job(self, job: FakeJob) -> None:
        deadline = job.body["spec"].get("activeDeadlineSeconds")
        phases = [p["status"]["phase"] for p in self._pods_of(job)]
        if deadline is not None and self.now >= job.started + deadline:
            self._fail(job, "DeadlineExceeded")
        elif job.lost_pod or "Failed" in phases:  # backoffLimit 0: the first failure ends the Job
            self._fail(job, "BackoffLimitExceeded")
        elif phases.count("Succeeded") == job.body["spec"]["completions"]:
            job.finished, job.condition = self.now, ("Complete", "")

    def _fail(self, job: FakeJob, reason: str) -> None:
        job.finished, job.condition = self.now, ("Failed", reason)
        for pod in self._pods_of(job):  # the controller deletes the pods still running
            if pod["status"]["phase"] not in FINISHED:
                self._delete_pod(pod["metadata"]["name"], force=False)

    def _delete_pod(self, name: str, *, force: bool) -> None:
        pod = self.pods[name]
        for job in self.jobs.values():
            if job.name == pod["metadata"]["labels"][JOB_NAME_LABEL] and pod["status"]["phase"] not in FINISHED:
                job.lost_pod = True
        if force or name not in self.lingering:  # else Terminating: listed until forced
            del self.pods[name]

    def _delete_job(self, name: str, propagation_policy: str | None) -> None:
        """The garbage collector: background or foreground deletes every object the Job owns;
        the API's default for a batch/v1 Job (orphan) leaves them behind, without their owner."""
        uid = self.jobs.pop(name).uid
        self.removing[("job", name)] = self.removal_tries
        for objects in (self.pods, self.services):
            for key, body in list(objects.items()):
                owners = body["metadata"].get("ownerReferences", [])
                if not any(owner["uid"] == uid for owner in owners):
                    continue
                if propagation_policy in ("Background", "Foreground"):
                    self._collect(objects, key)
                else:
                    body["metadata"]["ownerReferences"] = [o for o in owners if o["uid"] != uid]

    def _collect(self, objects: dict, key: str) -> None:
        if objects is self.pods:
            self._delete_pod(key, force=False)
        else:
            del objects[key]
            self.removing[("service", key)] = self.removal_tries


SETTINGS = KubernetesSettings(image="ito-training:0.1.0", volume_claim="ito-runs", mount_path="/mnt/ito",
                              namespace="ito", gpus_per_node=8)
STAGE = Path("/mnt/ito/run_x/pretraining")
def _two_nodes_on(settings: KubernetesSettings) -> SupervisorConfig:
    """A supervisor's config for two nodes on the cluster, passed through JSON as the stage passes it."""
    return SupervisorConfig.from_dict(json.loads(json.dumps({
        "nnodes": 2, "poll_interval_s": 0.05, "grace_s": 0.2, "startup_timeout_s": 30,
        "launch": {"backend": "kubernetes", "kubernetes": asdict(settings)}})))


def _job_of(run_id: str) -> str:
    """A run id mapped to a label ("_" is "-") ends with a digest of the id itself."""
    return f"ito-{run_id.replace('_', '-')}-" + hashlib.sha256(run_id.encode()).hexdigest()[:8]


JOB = _job_of("run_x-pretraining-0")


def _start(cluster: FakeCluster, *, nnodes: int = 2, number: int = 0, stage: Path = STAGE,
           tmp_log: Path | None = None, settings: KubernetesSettings = SETTINGS):
    spec = worker_spec(stage / f"attempt-{number}.json", nnodes=nnodes, nproc_per_node=8,
                       rdzv_id=f"run_x-pretraining-{number}")
    log_path = tmp_log or stage / f"attempt-{number}.log"
    backend = KubernetesBackend(settings, api=cluster, batch=cluster)
    backend.poll_s = 0.01  # between creates refused while a deleted Job keeps its name
    return backend.start(spec, number=number, log_path=log_path)


def test_an_attempt_is_one_indexed_job_and_a_headless_service_it_owns():
    cluster = FakeCluster()
    attempt = _start(cluster)
    assert cluster.calls == [("create_job", JOB), ("create_service", JOB)]  # the Job first: the service needs its uid
    job = _model(cluster.sent[0], "V1Job")
    assert job.spec.completion_mode == "Indexed" and job.spec.completions == job.spec.parallelism == 2
    assert job.spec.backoff_limit == 0 and job.spec.template.spec.restart_policy == "Never"
    assert job.spec.active_deadline_seconds == 7 * 24 * 3600 and job.spec.ttl_seconds_after_finished == 3600
    assert job.spec.template.spec.subdomain == JOB
    container = job.spec.template.spec.containers[0]
    command = " ".join(container.command)
    assert "-m ito_assets.runtime.worker.main --config /mnt/ito/run_x/pretraining/attempt-0.json" in command
    assert "--rdzv-id=run_x-pretraining-0" in command and "--nnodes=2" in command and "--nproc-per-node=8" in command
    # The Job controller names index 0's host `<job>-0`; the service is the subdomain.
    assert f"--rdzv-endpoint={JOB}-0.{JOB}.ito.svc:29400" in command and "--node-rank" not in command
    assert job.spec.template.spec.volumes[0].persistent_volume_claim.claim_name == "ito-runs"
    assert container.volume_mounts[0].mount_path == "/mnt/ito" and container.resources.limits == {"nvidia.com/gpu": "8"}
    service = _model(cluster.services[JOB], "V1Service")
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses
    (owner,) = service.metadata.owner_references
    assert (owner.api_version, owner.kind, owner.name, owner.uid) == ("batch/v1", "Job", JOB, cluster.jobs[JOB].uid)
    pod = cluster.pods[cluster.pod(0)]
    assert pod["spec"]["hostname"] == f"{JOB}-0" and service.spec.selector.items() <= pod["metadata"]["labels"].items()
    assert attempt.job == JOB and attempt.nnodes == 2


def test_the_bodies_round_trip_through_the_client_models():
    spec = LaunchSpec(run_id="run42", nnodes=4, nproc_per_node=1, module="m")
    body = job_body(spec, SETTINGS)
    assert CLIENT.sanitize_for_serialization(_model(body, "V1Job")) == body
    service = headless_service(spec, "ito", "0b5e-uid")
    (owner,) = _model(service, "V1Service").metadata.owner_references
    assert owner.uid == "0b5e-uid" and owner.controller is False and owner.block_owner_deletion is False


@pytest.mark.parametrize("name", ["active_deadline_s", "ttl_after_finished_s"])
def test_the_deadline_and_ttl_must_be_positive_seconds(name):
    for refused in (0, -1):
        with pytest.raises(ValueError, match=name):
            KubernetesSettings(image="i", volume_claim="c", mount_path="/d", **{name: refused})
    settings = KubernetesSettings(image="i", volume_claim="c", mount_path="/d", **{name: 1})
    assert KubernetesSettings(**asdict(settings)) == settings  # the form the supervisor's JSON config carries
    spec = job_body(LaunchSpec(run_id="r", nnodes=1, nproc_per_node=1, module="m"), settings)["spec"]
    field_of = {"active_deadline_s": "activeDeadlineSeconds", "ttl_after_finished_s": "ttlSecondsAfterFinished"}
    assert spec[field_of[name]] == 1


def test_a_config_outside_the_shared_volume_is_refused_before_any_job():
    cluster = FakeCluster()
    with pytest.raises(ValueError, match="mount_path"):
        _start(cluster, stage=Path("/tmp/elsewhere"))
    assert cluster.calls == []


def test_a_refused_service_takes_its_job_with_it():
    cluster = FakeCluster()

    def refuse(namespace, body, **kwargs):
        raise ApiException(status=403, reason="Forbidden")

    cluster.create_namespaced_service = refuse
    with pytest.raises(ApiException):
        _start(cluster)
    assert cluster.calls[-1] == ("delete_job", JOB, "Background") and cluster.empty()


def test_the_exit_code_is_the_first_failed_index_else_zero_once_all_succeeded(tmp_path):
    cluster = FakeCluster()
    attempt = _start(cluster, tmp_log=tmp_path / "a.log")
    node0, node1 = cluster.pod(0), cluster.pod(1)
    assert attempt.exit_code() is None  # pending
    cluster.set(node0, "Running")
    cluster.set(node1, "Succeeded", exit_code=0)
    assert attempt.exit_code() is None  # one node still runs
    cluster.set(node0, "Running", exit_code=137)  # terminated, phase not yet updated
    cluster.unavailable = True
    assert attempt.exit_code() is None  # unknown is not an end: ask again at the next poll
    cluster.unavailable = False
    assert attempt.exit_code() == 137
    cluster.set(node0, "Failed")  # evicted: no container status; the Job fails with it
    assert cluster.jobs[JOB].condition == ("Failed", "BackoffLimitExceeded") and attempt.exit_code() == 1

    finished = _start(cluster, number=1, tmp_log=tmp_path / "b.log")
    cluster.set(cluster.pod(0, finished.job), "Succeeded", exit_code=0)
    assert finished.exit_code() is None
    cluster.set(cluster.pod(1, finished.job), "Succeeded", exit_code=0)
    assert finished.exit_code() == 0


def test_a_deleted_pod_or_job_is_a_failed_attempt(tmp_path):
    cluster = FakeCluster()
    attempt = _start(cluster, tmp_log=tmp_path / "a.log")
    cluster.set(cluster.pod(0), "Running")
    cluster.delete_namespaced_pod(cluster.pod(1), "ito")  # behind the supervisor's back, its code with it
    assert cluster.jobs[JOB].condition == ("Failed", "BackoffLimitExceeded") and attempt.exit_code() == 1
    cluster.delete_namespaced_job(JOB, "ito", body=V1DeleteOptions(propagation_policy="Background"))
    assert attempt.exit_code() == 1 and cluster.empty()


def test_past_its_deadline_the_job_fails_and_its_pods_go(tmp_path):
    cluster = FakeCluster()
    settings = KubernetesSettings(image="i", volume_claim="c", mount_path="/mnt/ito", namespace="ito",
                                  active_deadline_s=600)
    attempt = _start(cluster, tmp_log=tmp_path / "a.log", settings=settings)
    for index in (0, 1):
        cluster.set(cluster.pod(index), "Running")  # a hung rank: it never ends on its own
    cluster.tick(599)
    assert attempt.exit_code() is None
    cluster.tick(1)
    assert cluster.jobs[JOB].condition == ("Failed", "DeadlineExceeded") and not cluster.pods
    assert attempt.exit_code() == DEADLINE_EXIT != 0


@pytest.mark.parametrize(("kind", "reason", "code"), [
    ("FailureTarget", "DeadlineExceeded", DEADLINE_EXIT),  # Kubernetes 1.31+: before Failed, while pods stop
    ("Failed", "DeadlineExceeded", DEADLINE_EXIT),
    ("Failed", "BackoffLimitExceeded", 1),
    ("Complete", "CompletionsReached", 0),
])
def test_the_jobs_conditions_as_exit_codes(kind, reason, code):
    condition = {"type": kind, "status": "True", "reason": reason}
    job = CLIENT._ApiClient__deserialize({"status": {"conditions": [condition]}}, "V1Job")
    assert job_exit_code(job, [], nnodes=2) == code
    condition["status"] = "False"
    assert job_exit_code(CLIENT._ApiClient__deserialize({"status": {"conditions": [condition]}}, "V1Job"), [], 2) is None


def _abandon(cluster: FakeCluster, tmp_path: Path, settings: KubernetesSettings) -> None:
    """A supervisor that started an attempt and died: nobody calls terminate or release."""
    _start(cluster, tmp_log=tmp_path / "a.log", settings=settings)
    assert cluster.jobs and len(cluster.pods) == 2 and cluster.services


def test_a_dead_supervisors_finished_attempt_is_collected_after_its_ttl(tmp_path):
    cluster = FakeCluster()
    _abandon(cluster, tmp_path, SETTINGS)
    cluster.tick(60)
    for index in (0, 1):
        cluster.set(cluster.pod(index), "Succeeded", exit_code=0)
    cluster.tick(3599)
    assert len(cluster.pods) == 2  # an hour to read the logs
    cluster.tick(1)
    assert cluster.empty()  # the Job by its TTL, the pods and the service by the garbage collector


def test_a_dead_supervisors_hung_attempt_is_collected_after_its_deadline_and_ttl(tmp_path):
    cluster = FakeCluster()
    settings = KubernetesSettings(image="i", volume_claim="c", mount_path="/mnt/ito", namespace="ito",
                                  active_deadline_s=7200, ttl_after_finished_s=600)
    _abandon(cluster, tmp_path, settings)
    for index in (0, 1):
        cluster.set(cluster.pod(index), "Running")
    cluster.tick(7200)
    assert not cluster.pods and cluster.jobs and cluster.services  # the deadline frees the nodes
    cluster.tick(600)
    assert cluster.empty()


def test_a_dead_supervisors_failed_rank_stops_the_other_nodes(tmp_path):
    cluster = FakeCluster()
    _abandon(cluster, tmp_path, SETTINGS)
    cluster.set(cluster.pod(0), "Running")
    cluster.set(cluster.pod(1), "Failed", exit_code=137)
    assert [cluster.index_of(n) for n in cluster.pods] == [1]  # node 0 no longer waits in a collective
    cluster.tick(3600)
    assert cluster.empty()


def test_terminate_deletes_with_the_grace_period_then_the_job_then_forces_what_is_left(tmp_path):
    cluster = FakeCluster()
    attempt = _start(cluster, tmp_log=tmp_path / "attempt-0.log")
    attempt.poll_s = 0.05
    node0, node1 = cluster.pod(0), cluster.pod(1)
    cluster.lingering.add(node0)
    cluster.set(node0, "Running")  # node 1 still pending: it has no log yet

    seconds = attempt.terminate({1234}, grace_s=0.5)

    deletes = [c for c in cluster.calls if c[0].startswith("delete")]
    assert deletes == [("delete_pod", 0, 1), ("delete_pod", 1, 1), ("delete_job", JOB, "Background"),
                       ("delete_pod", 0, 0)]
    assert 0.5 <= seconds < 5.0 and cluster.empty()
    log = (tmp_path / "attempt-0.log").read_text()
    assert f"output of {node0}" in log and f"--- {node1}\n(no log: 400" in log
    attempt.release()  # already gone: nothing raises


def test_release_deletes_the_job_with_its_pods_and_service(tmp_path):
    cluster = FakeCluster()
    attempt = _start(cluster, tmp_log=tmp_path / "a.log")
    for index in (0, 1):
        cluster.set(cluster.pod(index), "Succeeded", exit_code=0)
    attempt.release()
    # The API's default propagation for a Job would orphan its pods: the back end names one.
    assert cluster.calls[-1] == ("delete_job", JOB, "Background") and cluster.empty()
    assert (tmp_path / "a.log").read_text().count("output of") == 2


def test_the_supervisor_restarts_a_failed_attempt_with_a_fresh_job(tmp_path):
    """Through the supervisor's JSON config: attempt 0 loses node 1 (exit 137), its Job goes, attempt 1
    runs as a new Job with its own rendezvous id and finishes."""
    cluster = FakeCluster()
    settings = KubernetesSettings(image="i", volume_claim="c", mount_path=str(tmp_path), namespace="ito")
    stage_dir = tmp_path / "checkpoints" / "pretraining"

    def on_create(pod: dict) -> None:  # what the pods' ranks would do
        name = pod["metadata"]["name"]
        if name.startswith(_job_of("run_x-pretraining-0") + "-1-"):
            cluster.set(name, "Failed", exit_code=137)
        elif name.startswith(_job_of("run_x-pretraining-1") + "-"):
            cluster.set(name, "Succeeded", exit_code=0)
            (stage_dir / RESULT_NAME).write_text(json.dumps({"num_steps": 24}))

    cluster.on_create = on_create
    config = _two_nodes_on(settings)
    assert config.launch == LaunchConfig(backend=BackendKind.KUBERNETES, kubernetes=settings)
    backend = KubernetesBackend(settings, api=cluster, batch=cluster)
    report = Supervisor(worker=_worker(tmp_path), config=config, backend=backend).run()

    assert report.outcome == "succeeded" and report.num_attempts == 2 and report.faults[0].kind == "dead"
    assert [c[1] for c in cluster.calls if c[0] == "create_job"] == [_job_of(f"run_x-pretraining-{n}") for n in (0, 1)]
    assert cluster.empty()  # the failed attempt terminated, the finished one released
    command = " ".join(_model(cluster.sent[1], "V1Job").spec.template.spec.containers[0].command)  # attempt 1
    assert f"--config {stage_dir}/attempt-1.json" in command and "--rdzv-id=run_x-pretraining-1" in command


def _worker(root: Path) -> WorkerConfig:
    return WorkerConfig(run_key="run_x", stage="pretraining", model="micro", vocab_size=512,
                        tokens_path=str(root / "train.npy"), heldout_path=None,
                        stage_dir=str(root / "checkpoints" / "pretraining"), heartbeat_dir=str(root / "heartbeats"),
                        metrics_path=str(root / "metrics.jsonl"), num_steps=24, batch_size=8, sequence_length=32,
                        interval_steps=8, keep_last=3, launched_at=time.time(), layout=Layout(dp_shard=2))


# --- request timeouts and uid preconditions ------------------------------------------------------

API_METHODS = {"create_namespaced_job", "list_namespaced_job", "read_namespaced_job", "delete_namespaced_job", "create_namespaced_service",
               "list_namespaced_pod", "delete_namespaced_pod", "read_namespaced_pod_log"}


def test_every_api_call_waits_at_most_the_request_timeout(tmp_path):
    """Every path through the back end, each API method at least once: a call added without
    `_request_timeout` fails here (the fake takes no other keyword argument)."""
    cluster = FakeCluster()
    settings = replace(SETTINGS, request_timeout_s=7.5)
    attempt = _start(cluster, tmp_log=tmp_path / "a.log", settings=settings)
    attempt.poll_s = 0.05
    cluster.set(cluster.pod(0), "Running")
    cluster.lingering.add(cluster.pod(0))
    assert attempt.exit_code() is None
    attempt.terminate({1}, grace_s=0.1)  # logs, graceful pod deletes, the Job, the forced delete
    attempt.release()
    cluster.hung = {"create_namespaced_service"}
    with pytest.raises(ReadTimeoutError):  # the Job it needed is deleted
        _start(cluster, number=1, tmp_log=tmp_path / "b.log", settings=settings)
    cluster.hung = {"create_namespaced_job"}
    with pytest.raises(RuntimeError):  # a lost create is looked for
        _start(cluster, number=2, tmp_log=tmp_path / "c.log", settings=settings)

    assert {method for method, _ in cluster.requests} == API_METHODS
    assert all(kwargs == {"_request_timeout": 7.5} for _, kwargs in cluster.requests), cluster.requests
    assert KubernetesSettings(image="i", volume_claim="c", mount_path="/d").request_timeout_s == REQUEST_TIMEOUT_S == 30


@pytest.mark.parametrize("refused", [0, 0.0, -1, -1e-9, float("nan"), float("inf"), float("-inf")])
def test_the_request_timeout_must_be_finite_seconds_above_zero(refused):
    with pytest.raises(ValueError, match="request_timeout_s"):  # the client reads 0 as no timeout
        KubernetesSettings(image="i", volume_claim="c", mount_path="/d", request_timeout_s=refused)


@pytest.mark.parametrize("accepted", [1e-9, 1, 30.0, 86400])
def test_any_finite_positive_request_timeout_is_accepted(accepted):
    import urllib3

    settings = KubernetesSettings(image="i", volume_claim="c", mount_path="/d", request_timeout_s=accepted)
    assert KubernetesSettings(**json.loads(json.dumps(asdict(settings)))) == settings  # the supervisor's JSON
    assert urllib3.Timeout(total=settings.request_timeout_s).total == accepted  # what the client makes of it


@pytest.mark.parametrize("method", ["read_namespaced_job", "list_namespaced_pod"])
def test_a_status_read_without_an_answer_is_asked_again_at_the_next_poll(tmp_path, method):
    cluster = FakeCluster()
    attempt = _start(cluster, tmp_log=tmp_path / "a.log")
    for index in (0, 1):
        cluster.set(cluster.pod(index), "Succeeded", exit_code=0)
    cluster.hung = {method}
    assert attempt.exit_code() is None  # like a 503: unknown, not an end
    cluster.hung = set()
    assert attempt.exit_code() == 0


def test_a_stop_whose_log_folder_is_gone_still_deletes_the_job(tmp_path):
    """The supervisor ends its attempt when the stage folder's storage failed: the attempt's log is
    in that folder, and a write there must not keep the Job (and its nodes) alive to its deadline."""
    cluster = FakeCluster()
    folder = tmp_path / "stage"
    folder.mkdir()
    attempt = _start(cluster, tmp_log=folder / "attempt-0.log")
    attempt.poll_s = 0.01
    folder.rename(tmp_path / "gone")  # the stage folder vanished (a volume unmounted under it)
    attempt.terminate(set(), grace_s=0.1)
    assert ("delete_job", JOB, "Background") in cluster.calls and cluster.empty()


def test_a_stop_against_an_api_that_does_not_answer_returns_and_says_so(tmp_path):
    cluster = FakeCluster()
    attempt = _start(cluster, tmp_log=tmp_path / "a.log")
    attempt.poll_s = 0.05
    cluster.hung = set(API_METHODS)
    attempt.terminate({1}, grace_s=0.1)  # no traceback: the supervisor goes on
    attempt.release()
    log = (tmp_path / "a.log").read_text()
    assert "(no pods listed: no answer: ReadTimeoutError)" in log
    assert f"the Job {JOB} was not deleted (no answer: ReadTimeoutError): its deadline or TTL removes it" in log
    assert cluster.jobs[JOB]  # left to its deadline


def test_deletes_without_an_answer_do_not_stop_the_stop(tmp_path):
    """No answer to a pod's delete: the other pods are not asked (each would wait as long), the Job's
    delete is; no answer to that either is noted in the attempt's log."""
    cluster = FakeCluster()
    attempt = _start(cluster, tmp_log=tmp_path / "a.log")
    attempt.poll_s = 0.05
    cluster.hung = {"delete_namespaced_pod", "delete_namespaced_job"}
    attempt.terminate({1}, grace_s=0.1)
    deletes = [method for method, _ in cluster.requests if method.startswith("delete")]
    assert deletes == ["delete_namespaced_pod", "delete_namespaced_job", "delete_namespaced_pod"]
    log = (tmp_path / "a.log").read_text()
    assert log.count("was not deleted (no answer: ReadTimeoutError)") == 3 and len(cluster.pods) == 2
    cluster.hung = {"delete_namespaced_pod"}
    attempt.terminate({1}, grace_s=0.1)  # the Job answers now and takes its pods with it
    assert cluster.empty()


def test_a_log_read_without_an_answer_skips_the_other_logs_not_the_delete(tmp_path):
    cluster = FakeCluster()
    attempt = _start(cluster, tmp_log=tmp_path / "a.log")
    attempt.poll_s = 0.05
    cluster.hung = {"read_namespaced_pod_log"}
    attempt.terminate({1}, grace_s=0.1)
    assert [method for method, _ in cluster.requests].count("read_namespaced_pod_log") == 1
    assert "the other pods' logs are not read" in (tmp_path / "a.log").read_text() and cluster.empty()


def test_a_create_whose_answer_was_lost_deletes_the_job_it_made(tmp_path):
    cluster = FakeCluster()
    create = cluster.create_namespaced_job

    def lost(namespace, body, **kwargs):  # the API made the Job; its answer never came
        create(namespace, body, **kwargs)
        raise _no_answer("create_namespaced_job")

    cluster.create_namespaced_job = lost
    with pytest.raises(RuntimeError, match="did not create attempt 0's Job"):
        _start(cluster, tmp_log=tmp_path / "a.log")
    assert cluster.empty() and ("delete_job", JOB, "Background") in cluster.calls


def _foreign_job(cluster: FakeCluster) -> str:
    """A Job under attempt 0's name made by someone else (no launch token of ours): its uid."""
    spec = worker_spec(STAGE / "attempt-0.json", nnodes=2, nproc_per_node=8, rdzv_id="run_x-pretraining-0")
    cluster.create_namespaced_job("ito", job_body(spec, SETTINGS))
    return cluster.jobs[JOB].uid


def test_a_create_without_an_answer_leaves_another_job_by_the_name_alone(tmp_path):
    cluster = FakeCluster()
    other = _foreign_job(cluster)
    cluster.hung = {"create_namespaced_job"}
    with pytest.raises(RuntimeError, match="no answer: ReadTimeoutError"):
        _start(cluster, tmp_log=tmp_path / "a.log")
    assert cluster.jobs[JOB].uid == other and len(cluster.pods) == 2
    assert not [c for c in cluster.calls if c[0].startswith("delete")]


def test_a_job_that_took_our_jobs_name_is_neither_read_nor_deleted(tmp_path):
    cluster = FakeCluster()
    attempt = _start(cluster, tmp_log=tmp_path / "a.log")
    attempt.poll_s = 0.05
    ours = cluster.jobs[JOB].uid
    cluster._delete_job(JOB, "Background")  # behind the supervisor's back; then someone reuses the name
    other = _foreign_job(cluster)
    assert other != ours and attempt.exit_code() == MISSING_JOB_EXIT  # not the other Job's status
    attempt.terminate({1}, grace_s=0.1)
    attempt.release()
    assert cluster.jobs[JOB].uid == other and len(cluster.pods) == 2 and cluster.services == {}
    # Our uid named in each delete: the API refuses it (409), which is "already gone".
    assert [p for p in cluster.preconditions if p[0] == "job"] == [("job", JOB, ours)] * 2
    assert not [p for p in cluster.preconditions if p[0] == "pod"]  # its pods are not listed as ours


# --- Jobs that earlier starts left ----------------------------------------------------------------

def _left_over(cluster: FakeCluster, tmp_path: Path) -> str:
    """Attempt 0 running with nobody watching it (its supervisor died, or its create's answer was
    lost): its Job's uid."""
    _start(cluster, tmp_log=tmp_path / "attempt-0.log")
    for index in (0, 1):
        cluster.set(cluster.pod(index), "Running")
    return cluster.jobs[JOB].uid


def _taken(cluster: FakeCluster, tmp_path: Path, whose: str) -> str:
    """A Job under attempt 0's name that no earlier start of the stage logging to `tmp_path` left: its uid."""
    if whose == "another stage's":  # our launcher's, for a supervisor logging elsewhere (another replica group)
        (tmp_path / "replica-1").mkdir()
        _start(cluster, tmp_log=tmp_path / "replica-1" / "attempt-0.log")
        return cluster.jobs[JOB].uid
    other = _foreign_job(cluster)
    if whose == "labelled, without our token":  # a label anyone could copy
        (ours,) = _started_bodies(tmp_path)
        cluster.jobs[JOB].body["metadata"]["labels"]["ito/series"] = ours["metadata"]["labels"].get("ito/series", "")
    return other


def _started_bodies(tmp_path: Path) -> list[dict]:
    """The Job bodies a start logging to `tmp_path` sends."""
    cluster = FakeCluster()
    _start(cluster, tmp_log=tmp_path / "elsewhere.log")
    return cluster.sent


@pytest.mark.parametrize("number", [0, 1])  # the same attempt again (the same name); the next attempt
def test_a_job_an_earlier_start_left_is_deleted_by_its_uid_before_the_create(tmp_path, number):
    cluster = FakeCluster()
    stale = _left_over(cluster, tmp_path)
    cluster.calls.clear()
    cluster.preconditions.clear()
    attempt = _start(cluster, number=number, tmp_log=tmp_path / f"attempt-{number}.log")
    name = _job_of(f"run_x-pretraining-{number}")
    assert cluster.preconditions == [("job", JOB, stale)]  # by its uid, its pods and service with it
    assert cluster.calls == [("delete_job", JOB, "Background"), ("create_job", name), ("create_service", name)]
    assert list(cluster.jobs) == [name] and cluster.jobs[name].uid == attempt.job_uid != stale
    assert all(pod["metadata"]["ownerReferences"][0]["uid"] == attempt.job_uid for pod in cluster.pods.values())
    assert f"--- deleted the Job {JOB} (uid {stale}), left by an earlier start" in (
        tmp_path / f"attempt-{number}.log").read_text()


@pytest.mark.parametrize("whose", ["someone else's", "labelled, without our token", "another stage's"])
def test_a_job_under_the_name_that_is_not_ours_is_left_alone_and_the_start_fails(tmp_path, whose):
    cluster = FakeCluster()
    other = _taken(cluster, tmp_path, whose)
    cluster.calls.clear()
    with pytest.raises(RuntimeError, match=f"the Job {JOB} in namespace ito is already there, not left by an "
                                           "earlier start of this stage: not deleted"):
        _start(cluster, tmp_log=tmp_path / "attempt-0.log")
    assert cluster.jobs[JOB].uid == other and len(cluster.pods) == 2
    assert not [c for c in cluster.calls if c[0].startswith("delete")]


def test_a_name_the_deleted_job_still_holds_is_tried_again_within_the_request_timeout(tmp_path):
    """The deleted Job and its service keep their names for three more creates each."""
    cluster = FakeCluster(removal_tries=3)
    stale = _left_over(cluster, tmp_path)
    attempt = _start(cluster, tmp_log=tmp_path / "attempt-0.log", settings=replace(SETTINGS, request_timeout_s=5))
    creates = [method for method, _ in cluster.requests if method.startswith("create")]
    assert creates.count("create_namespaced_job") == creates.count("create_namespaced_service") == 1 + 4
    assert cluster.jobs[JOB].uid == attempt.job_uid != stale and JOB in cluster.services and len(cluster.pods) == 2


def test_a_name_still_held_past_the_request_timeout_fails_the_start(tmp_path):
    cluster = FakeCluster(removal_tries=10**9)
    _left_over(cluster, tmp_path)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=f"the Job {JOB} in namespace ito is still there 0.2 s after its delete"):
        _start(cluster, tmp_log=tmp_path / "attempt-0.log", settings=replace(SETTINGS, request_timeout_s=0.2))
    assert 0.2 <= time.monotonic() - started < 2
    tries = [method for method, _ in cluster.requests].count("create_namespaced_job") - 1
    assert 2 <= tries <= 0.2 / 0.01 + 1  # a try every poll_s while the bound lasts, no more
    assert not cluster.jobs and not cluster.pods  # the left-over Job is gone, no attempt started


@pytest.mark.parametrize("method", ["list_namespaced_job", "delete_namespaced_job"])
def test_a_look_for_left_over_jobs_without_an_answer_fails_the_start_before_the_create(tmp_path, method):
    cluster = FakeCluster()
    stale = _left_over(cluster, tmp_path)
    cluster.hung = {method}
    asked = len(cluster.requests)
    with pytest.raises(RuntimeError, match=r"did not clear the Jobs left before attempt 1 \(no answer: "
                                           r"ReadTimeoutError\): not started"):
        _start(cluster, number=1, tmp_log=tmp_path / "attempt-1.log")
    assert [job.uid for job in cluster.jobs.values()] == [stale]
    assert not [m for m, _ in cluster.requests[asked:] if m.startswith("create")]


def _lose_creates(cluster: FakeCluster) -> list[tuple]:
    """Creates that get no answer while the API stores their Job only after the look for it (404):
    the (namespace, body) of each, for the test to make the Job appear."""
    lost: list[tuple] = []

    def late(namespace, body, **kwargs):
        lost.append((namespace, body))
        raise _no_answer("create_namespaced_job")

    cluster.create_namespaced_job = late
    return lost


@pytest.mark.parametrize("number", [0, 1])  # the same attempt again (the same name); the next attempt
def test_a_job_that_appears_after_its_lost_create_was_looked_for_is_deleted_by_the_next_start(tmp_path, number):
    cluster = FakeCluster()
    lost = _lose_creates(cluster)
    with pytest.raises(RuntimeError, match="did not create attempt 0's Job"):
        _start(cluster, tmp_log=tmp_path / "attempt-0.log")
    assert not cluster.jobs and ("read_namespaced_job", {"_request_timeout": 30.0}) in cluster.requests  # 404
    del cluster.create_namespaced_job  # the fake's own again
    cluster.create_namespaced_job(*lost[0])  # now it appears and runs, nobody watching it
    orphan = cluster.jobs[JOB].uid
    attempt = _start(cluster, number=number, tmp_log=tmp_path / f"attempt-{number}.log")
    assert ("job", JOB, orphan) in cluster.preconditions
    assert [job.uid for job in cluster.jobs.values()] == [attempt.job_uid] != [orphan] and len(cluster.pods) == 2


def test_a_retried_stage_deletes_the_job_its_lost_create_left(tmp_path):
    """Through the supervisor: attempt 0's create gets no answer and its Job appears only after the
    look for it, failing the stage (no restart left); the step's retry starts attempt 1 (another
    name), which deletes that Job before its own."""
    cluster = FakeCluster()
    settings = KubernetesSettings(image="i", volume_claim="c", mount_path=str(tmp_path), namespace="ito")
    stage_dir = tmp_path / "checkpoints" / "pretraining"

    def on_create(pod: dict) -> None:
        name = pod["metadata"]["name"]
        if name.startswith(_job_of("run_x-pretraining-1") + "-"):
            cluster.set(name, "Succeeded", exit_code=0)
            (stage_dir / RESULT_NAME).write_text(json.dumps({"num_steps": 24}))

    cluster.on_create = on_create
    config = replace(_two_nodes_on(settings), max_restarts=0)
    backend = KubernetesBackend(settings, api=cluster, batch=cluster)
    lost = _lose_creates(cluster)
    failed = Supervisor(worker=_worker(tmp_path), config=config, backend=backend).run()
    assert failed.outcome == "failed" and [f.kind for f in failed.faults] == ["not_started"]
    assert "did not create attempt 0's Job" in failed.error
    del cluster.create_namespaced_job
    cluster.create_namespaced_job(*lost[0])
    assert cluster.jobs[JOB].uid and len(cluster.pods) == 2  # attempt 0's Job holds the nodes, unwatched

    report = Supervisor(worker=_worker(tmp_path), config=config, backend=backend).run()
    assert report.outcome == "succeeded" and report.num_attempts == 1
    assert cluster.empty()  # attempt 0's Job deleted at attempt 1's start, attempt 1's released
    assert f"--- deleted the Job {JOB}" in (stage_dir / "attempt-1.log").read_text()


def test_deletes_name_the_uids_of_our_job_and_pods(tmp_path):
    cluster = FakeCluster()
    attempt = _start(cluster, tmp_log=tmp_path / "a.log")
    attempt.poll_s = 0.05
    node0, node1 = cluster.pod(0), cluster.pod(1)
    uid0, uid1 = (cluster.pods[n]["metadata"]["uid"] for n in (node0, node1))
    cluster.lingering.add(node0)
    job_uid = cluster.jobs[JOB].uid
    attempt.terminate({1}, grace_s=0.1)
    assert cluster.preconditions == [("pod", node0, uid0), ("pod", node1, uid1), ("job", JOB, job_uid),
                                     ("pod", node0, uid0)]
    assert cluster.empty()


@pytest.mark.parametrize("status", [404, 409])
def test_a_pod_or_job_delete_refused_as_gone_or_not_ours_is_swallowed(tmp_path, status):
    cluster = FakeCluster()
    attempt = _start(cluster, tmp_log=tmp_path / "a.log")
    attempt.poll_s = 0.05

    def refused(name, namespace, **kwargs):
        raise ApiException(status=status, reason="Conflict" if status == 409 else "Not Found")

    cluster.delete_namespaced_pod = cluster.delete_namespaced_job = refused
    attempt.terminate({1}, grace_s=0.1)
    attempt.release()
    assert "was not deleted" not in (tmp_path / "a.log").read_text()


@pytest.fixture
def silent_api():
    """An API server that accepts connections and never answers, for the real client."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.getsockname()[1]}"
    yield kubernetes.client.ApiClient(configuration)
    server.close()
    for connection in accepted:
        connection.close()


def test_the_real_client_against_an_api_that_never_answers(tmp_path, silent_api):
    """What kubernetes 36 really raises (urllib3's errors, not ApiException) and that it takes the
    back end's keyword arguments: no call waits past its timeout, no stop raises."""
    settings = replace(SETTINGS, request_timeout_s=0.05)
    core, batch = kubernetes.client.CoreV1Api(silent_api), kubernetes.client.BatchV1Api(silent_api)
    spec = worker_spec(STAGE / "attempt-0.json", nnodes=2, nproc_per_node=8, rdzv_id="run_x-pretraining-0")
    started = time.monotonic()
    backend = KubernetesBackend(settings, api=core, batch=batch)
    with pytest.raises(RuntimeError, match=r"did not clear the Jobs left before attempt 0 \(no answer: ReadTimeoutError\)"):
        backend.start(spec, number=0, log_path=tmp_path / "a.log")  # the look for left-over Jobs comes first
    with pytest.raises(RuntimeError, match=r"did not create attempt 0's Job \(no answer: ReadTimeoutError\)"):
        backend._create_job(spec, 0, tmp_path / "a.log", wait_s=0.0)
    attempt = KubernetesAttempt(number=0, launched_at=time.time(), api=core, batch=batch, namespace="ito", job=JOB,
                                job_uid="uid-0", nnodes=2, log_path=tmp_path / "a.log", request_timeout_s=0.05)
    assert attempt.exit_code() is None
    attempt.terminate({1}, grace_s=1.0)
    assert time.monotonic() - started < 10  # each GET or DELETE tries four times, a create once
    log = (tmp_path / "a.log").read_text()
    assert "(no pods listed: no answer: ReadTimeoutError)" in log and f"the Job {JOB} was not deleted" in log


@pytest.mark.parametrize(("status", "noted"), [(429, True), (500, True), (503, True), (403, False), (422, False)])
def test_a_throttled_or_failing_delete_is_noted_and_a_refused_one_raises(tmp_path, status, noted):
    """429 (the API server's priority and fairness throttling) is a busy server, as a 5xx is: the
    release of a finished stage notes it and goes on; a refusal (403: a permission) still raises."""
    cluster = FakeCluster()
    attempt = _start(cluster, tmp_log=tmp_path / "a.log")

    def refuse(name, namespace, body=None, **kwargs):
        raise ApiException(status=status, reason="answered")

    cluster.delete_namespaced_job = refuse
    if noted:
        attempt.release()
        assert f"the Job {JOB} was not deleted ({status} answered)" in (tmp_path / "a.log").read_text()
    else:
        with pytest.raises(ApiException):
            attempt.release()
