"""Kubernetes: one pod per node, each running the same torchrun command; a headless service gives
node 0's pod a stable name for the c10d rendezvous. Every attempt has pods and a service of its own
(named by the attempt's rendezvous id), so a restart never meets the old attempt's ranks.

`KubernetesBackend` creates them with the plain `kubernetes` client (CoreV1Api), reads the exit
codes from the pods' container statuses and stops an attempt by deleting its pods with a grace
period (SIGTERM: the ranks flush a checkpoint), force-deleting what is left after it. The attempt's
config, checkpoints and heartbeats live on a volume (a PersistentVolumeClaim) that the supervisor's
pod mounts at the same path as the trainer pods.

Not through dagster_k8s.PipesK8sClient: its `run` needs the Dagster context (the supervisor runs
out of process, without Dagster), starts one pod per Dagster step (named by run and op) and blocks
until it terminates, deleting it; it can neither start the other nodes' pods nor stop an attempt
mid-run with a grace period, and a restart would reuse its pod name. Rank 0 therefore writes its
metrics to the stage's JSONL file on the shared volume, not through Pipes.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from ito_assets.launch.spec import LaunchSpec, torchrun_command

_MAX_NAME = 63  # a DNS-1123 label
VOLUME_NAME = "ito-shared"
CONTAINER_NAME = "trainer"
# A pod gone from the API while its attempt ran (deleted by someone, evicted and collected): the
# attempt has lost a node, which is a failure whatever the pod's own code would have been.
MISSING_POD_EXIT = 1


@dataclass(frozen=True, kw_only=True)
class KubernetesSettings:
    image: str
    volume_claim: str  # the PersistentVolumeClaim shared by the supervisor's pod and the trainer pods
    mount_path: str  # where both mount it; the stage's folders must lie under it
    namespace: str = "default"
    gpus_per_node: int = 0  # nvidia.com/gpu per pod; 0: CPU pods (gloo)
    python: str = "python"  # the interpreter in the image
    rdzv_port: int = 29400  # torchrun's default c10d port, on node 0's pod

    def __post_init__(self) -> None:
        if not self.image or not self.volume_claim or not self.namespace:
            raise ValueError("image, volume_claim and namespace must be set")
        if not PurePosixPath(self.mount_path).is_absolute():
            raise ValueError("mount_path must be an absolute path")
        if self.gpus_per_node < 0:
            raise ValueError("gpus_per_node must be >= 0")
        if not 1 <= self.rdzv_port <= 65535:
            raise ValueError("rdzv_port must be a TCP port")


def _name(spec: LaunchSpec, suffix: str = "") -> str:
    """`ito-<run id>` as a DNS-1123 label: lower case, '-' for '_', short enough for its suffix; a
    name that had to be cut ends in a digest of the whole id, so two attempts never share one."""
    name = "ito-" + re.sub(r"[^a-z0-9-]", "-", spec.run_id.lower())
    limit = _MAX_NAME - len(suffix)
    if len(name) > limit:
        digest = hashlib.sha256(spec.run_id.encode()).hexdigest()[:8]
        name = name[: limit - len(digest) - 1].rstrip("-") + "-" + digest
    return name + suffix


def pod_name(spec: LaunchSpec, node: int) -> str:
    return _name(spec, f"-node{node}")


def rendezvous_host(spec: LaunchSpec, namespace: str) -> str:
    return f"{pod_name(spec, 0)}.{_name(spec)}.{namespace}.svc"


def headless_service(spec: LaunchSpec, namespace: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": _name(spec), "namespace": namespace, "labels": {"ito/run": spec.run_id}},
        "spec": {
            "clusterIP": "None",
            "selector": {"ito/run": spec.run_id},
            # Node 0's name resolves before its pod is ready: the other nodes join the rendezvous
            # while it starts, instead of failing to resolve it.
            "publishNotReadyAddresses": True,
            "ports": [{"name": "c10d", "port": spec.rdzv_port}],
        },
    }


def _container(spec: LaunchSpec, settings: KubernetesSettings) -> dict:
    endpoint = f"{rendezvous_host(spec, settings.namespace)}:{spec.rdzv_port}"
    # A quantity is a string in the API's models (V1ResourceRequirements.limits: dict[str, str]).
    resources = {"limits": {"nvidia.com/gpu": str(settings.gpus_per_node)}} if settings.gpus_per_node else {}
    return {
        "name": CONTAINER_NAME,
        "image": settings.image,
        "command": torchrun_command(spec, python=settings.python, rdzv_endpoint=endpoint),
        "env": [{"name": k, "value": v} for k, v in spec.env],
        "resources": resources,
        "ports": [{"containerPort": spec.rdzv_port, "name": "c10d"}],
        "volumeMounts": [{"name": VOLUME_NAME, "mountPath": settings.mount_path}],
    }


def pod_specs(spec: LaunchSpec, settings: KubernetesSettings) -> list[dict]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name(spec, node),
                "namespace": settings.namespace,
                "labels": {"ito/run": spec.run_id, "ito/node": str(node)},
            },
            "spec": {
                "hostname": pod_name(spec, node),
                "subdomain": _name(spec),
                "restartPolicy": "Never",  # restarts are the supervisor's decision, not the kubelet's
                "containers": [_container(spec, settings)],
                "volumes": [{"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": settings.volume_claim}}],
            },
        }
        for node in range(spec.nnodes)
    ]


def pod_exit_code(pod: Any | None) -> int | None:
    """A V1Pod's outcome: the trainer container's exit code once it terminated, 1 for a pod that
    failed without one (evicted), MISSING_POD_EXIT for no pod, None while it runs or waits."""
    if pod is None:
        return MISSING_POD_EXIT
    for status in (pod.status.container_statuses or []) if pod.status else []:
        if status.name == CONTAINER_NAME and status.state and status.state.terminated:
            return status.state.terminated.exit_code
    phase = pod.status.phase if pod.status else None
    return {"Failed": 1, "Succeeded": 0}.get(phase)


def _api_exception() -> type[Exception]:
    from kubernetes.client.exceptions import ApiException  # the `cluster` extra: imported where used

    return ApiException


def _not_found(call, *args, **kwargs) -> None:
    """Run a delete; an object already gone is what the delete wanted."""
    try:
        call(*args, **kwargs)
    except _api_exception() as error:
        if error.status != 404:
            raise


@dataclass
class KubernetesAttempt:
    number: int
    launched_at: float
    api: Any  # kubernetes.client.CoreV1Api
    namespace: str
    service: str
    pods: list[str]  # node order
    run_label: str
    log_path: Path
    poll_s: float = 1.0

    def _listed(self) -> dict[str, Any]:
        listed = self.api.list_namespaced_pod(self.namespace, label_selector=f"ito/run={self.run_label}")
        return {pod.metadata.name: pod for pod in listed.items}

    def exit_code(self) -> int | None:
        try:
            listed = self._listed()
        except _api_exception():  # an API server busy or restarting: ask again at the next poll
            return None
        codes = [pod_exit_code(listed.get(name)) for name in self.pods]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            return failed[0]
        return None if None in codes else 0

    def terminate(self, worker_pids: set[int], *, grace_s: float) -> float:
        """`worker_pids` live in the pods: the kubelet signals the containers itself."""
        started = time.monotonic()
        self._save_logs()
        for name in self.pods:  # the kubelet sends SIGTERM, then SIGKILL after the grace period
            _not_found(self.api.delete_namespaced_pod, name, self.namespace, grace_period_seconds=math.ceil(grace_s))
        while self._listed() and time.monotonic() < started + grace_s:
            time.sleep(self.poll_s)
        for name in self._listed():  # still there: force, so that the next attempt starts clean
            _not_found(self.api.delete_namespaced_pod, name, self.namespace, grace_period_seconds=0)
        _not_found(self.api.delete_namespaced_service, self.service, self.namespace)
        return time.monotonic() - started

    def release(self) -> None:
        self._save_logs()
        for name in self.pods:
            _not_found(self.api.delete_namespaced_pod, name, self.namespace)
        _not_found(self.api.delete_namespaced_service, self.service, self.namespace)

    def _save_logs(self) -> None:
        """The pods' output into the attempt's log before they go: a failed rank's traceback."""
        listed = self._listed()
        with open(self.log_path, "a") as log:
            for name in (n for n in self.pods if n in listed):
                try:
                    text = self.api.read_namespaced_pod_log(name, self.namespace)
                except _api_exception() as error:  # a container not started yet has no log (400)
                    text = f"(no log: {error.status} {error.reason})"
                log.write(f"--- {name}\n{text}\n")


def _default_api() -> Any:
    """In-cluster credentials where the supervisor runs in a pod, else the local kubeconfig."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api()


@dataclass
class KubernetesBackend:
    settings: KubernetesSettings
    api: Any = None  # a CoreV1Api; None: built on first use from the cluster's credentials

    def start(self, spec: LaunchSpec, *, number: int, log_path: Path) -> KubernetesAttempt:
        self._require_on_volume(spec)
        self.api = self.api or _default_api()
        spec = replace(spec, rdzv_port=self.settings.rdzv_port)
        namespace = self.settings.namespace
        launched_at = time.time()
        self.api.create_namespaced_service(namespace, headless_service(spec, namespace))
        bodies = pod_specs(spec, self.settings)
        for body in bodies:
            self.api.create_namespaced_pod(namespace, body)
        return KubernetesAttempt(number=number, launched_at=launched_at, api=self.api, namespace=namespace,
                                 service=_name(spec), pods=[b["metadata"]["name"] for b in bodies],
                                 run_label=spec.run_id, log_path=log_path)

    def _require_on_volume(self, spec: LaunchSpec) -> None:
        """The pods see only the shared volume: the attempt's config (an absolute path among the
        worker's arguments) must lie under the mount path."""
        mount = PurePosixPath(self.settings.mount_path)
        outside = [a for a in spec.args if a.startswith("/") and not PurePosixPath(a).is_relative_to(mount)]
        if outside:
            raise ValueError(f"not under the shared volume's mount_path {mount}: {', '.join(outside)}")
