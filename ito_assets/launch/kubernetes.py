"""Kubernetes: each attempt is one Indexed `batch/v1` Job with a pod per node, each running the same
torchrun command, and a headless service that gives node 0's pod a stable name for the c10d
rendezvous. Every attempt has a Job and a service of its own (named by the attempt's rendezvous id),
so a restart never meets the old attempt's ranks. The c10d rendezvous assigns the node ranks, so
the pods need no rank of their own (the Job controller's JOB_COMPLETION_INDEX goes unused).

The cluster cleans up after an attempt whether or not its supervisor lives to do it:
- `backoffLimit: 0`: the first failed pod fails the Job, and the Job controller stops the other
  nodes' pods at once (restarts are the supervisor's decision, from a checkpoint);
- `activeDeadlineSeconds` (`active_deadline_s`): an attempt that hangs is failed and its pods are
  deleted once it ran that long. The pods' SIGTERM has the ranks flush a checkpoint and beat
  `stopped`, but the supervisor did not ask for that stop: it restarts the stage from that
  checkpoint within its restart budget (an unplanned end, `terminated`), as after a node drain;
- `ttlSecondsAfterFinished` (`ttl_after_finished_s`): a finished Job and its pods are deleted that
  long after it ended;
- the service names the Job as its owner, so the garbage collector deletes it with the Job.

`KubernetesBackend` drives it with the plain `kubernetes` client: BatchV1Api for the Job, CoreV1Api
for the service, the pods and their logs. It reads the exit codes from the pods' container statuses
and the Job's conditions, stops an attempt by deleting its pods with a grace period (SIGTERM: the
ranks flush a checkpoint), then the Job, forcing what is left after the grace period. Every call
has a `_request_timeout` (`request_timeout_s`): the supervisor runs unattended, and an API server
that accepted the connection but never answers would otherwise hold it forever. Every delete names
the uid of the object it means (a precondition): a name is the run's and attempt's, and a Job or pod
made later under the same name is not ours to delete. A start first deletes the Jobs that earlier
starts of the same stage left (one whose create got no answer and that appeared after the look for
it, one whose delete got no answer): the supervisor starts an attempt only after the one before
ended or was stopped, so such a Job runs unwatched, on nodes the new attempt needs, until its
deadline. The attempt's config, checkpoints and
heartbeats live on a volume (a PersistentVolumeClaim) that the supervisor's pod mounts at the same
path as the trainer pods. The supervisor's service account needs create, get, list and delete on
jobs (batch), services and pods, and get on pods/log.

Not through dagster_k8s.PipesK8sClient: its `run` needs the Dagster context (the supervisor runs
out of process, without Dagster), starts one pod per Dagster step (named by run and op) and blocks
until it terminates, deleting it; it can neither start the other nodes' pods nor stop an attempt
mid-run with a grace period, and a restart would reuse its pod name. Rank 0 therefore writes its
metrics to the stage's JSONL file on the shared volume, not through Pipes.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import secrets
import time
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from ito_assets.launch.spec import LaunchSpec, torchrun_command

_MAX_NAME = 63  # a DNS-1123 label
VOLUME_NAME = "ito-shared"
CONTAINER_NAME = "trainer"
# Set by the Job controller on every pod of an Indexed Job (the annotation exists since 1.21).
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
# The back end is not told the booking's wall time, so the default only bounds an attempt that
# nobody watches any more (a hung rank under a dead supervisor): a week, longer than any attempt
# we plan between checkpoints. A healthy attempt that outruns it is failed and restarted from its
# last checkpoint with a deadline of its own, so it is no end of the booking: keep it above the
# longest attempt you expect. It counts from the Job's start, pods waiting for nodes included.
ACTIVE_DEADLINE_S = 7 * 24 * 3600
# A finished attempt holds no GPU (its pods have terminated), only API objects and logs: an hour
# leaves time to read an orphaned attempt's logs (kubectl logs) and bounds how long they stay.
TTL_AFTER_FINISHED_S = 3600
# A Job gone from the API while its attempt ran (deleted by someone, or collected before the
# supervisor looked): the attempt's outcome is lost, which is a failure.
MISSING_JOB_EXIT = 1
# The Job ran past activeDeadlineSeconds and Kubernetes killed its pods: timeout(1)'s code for a
# command that ran out of time, so the log tells it from a rank's own failure.
DEADLINE_EXIT = 124
# The Job failed (a pod deleted, the pods' codes already gone) without a code of its own.
FAILED_JOB_EXIT = 1
# A healthy API server answers in well under a second; one silent this long has stopped answering.
# The client retries a GET or a DELETE that got no answer three times (urllib3's default), so such a
# call gives up after at most four times this; a create is not retried.
REQUEST_TIMEOUT_S = 30.0
# An annotation with a token of the start that created the Job: after a create that got no answer,
# it tells our Job from another one under the same name.
LAUNCH_KEY = "ito/launch"
# A label with a digest of the folder of the attempt's log: the attempts of one stage (of one replica
# group, where it has several) share it and no other supervisor's do. Replica groups run at once but
# log to folders of their own; one group's attempts run one after another.
SERIES_KEY = "ito/series"


@dataclass(frozen=True, kw_only=True)
class KubernetesSettings:
    image: str
    volume_claim: str  # the PersistentVolumeClaim shared by the supervisor's pod and the trainer pods
    mount_path: str  # where both mount it; the stage's folders must lie under it
    namespace: str = "default"
    gpus_per_node: int = 0  # nvidia.com/gpu per pod; 0: CPU pods (gloo)
    python: str = "python"  # the interpreter in the image
    rdzv_port: int = 29400  # torchrun's default c10d port, on node 0's pod
    active_deadline_s: int = ACTIVE_DEADLINE_S  # the Job's activeDeadlineSeconds, per attempt
    ttl_after_finished_s: int = TTL_AFTER_FINISHED_S  # the Job's ttlSecondsAfterFinished
    request_timeout_s: float = REQUEST_TIMEOUT_S  # every API call's _request_timeout

    def __post_init__(self) -> None:
        if not self.image or not self.volume_claim or not self.namespace:
            raise ValueError("image, volume_claim and namespace must be set")
        if not PurePosixPath(self.mount_path).is_absolute():
            raise ValueError("mount_path must be an absolute path")
        if self.gpus_per_node < 0:
            raise ValueError("gpus_per_node must be >= 0")
        if not 1 <= self.rdzv_port <= 65535:
            raise ValueError("rdzv_port must be a TCP port")
        if self.active_deadline_s < 1:
            raise ValueError("active_deadline_s must be >= 1")
        # 0 is valid for Kubernetes but would delete the pods before the supervisor reads their codes.
        if self.ttl_after_finished_s < 1:
            raise ValueError("ttl_after_finished_s must be >= 1")
        # The client reads 0 as no timeout at all; NaN and inf bound nothing either.
        if not math.isfinite(self.request_timeout_s) or self.request_timeout_s <= 0:
            raise ValueError("request_timeout_s must be a finite number of seconds > 0")


def _name(spec: LaunchSpec, room: int = 0) -> str:
    """`ito-<run id>` as a DNS-1123 label with `room` characters to spare: lower case, '-' for '_'.
    A name that had to be changed or cut ends in a digest of the whole id: `run_x`, `run-x` and
    `Run_X` would otherwise share one Job, and one attempt's stop would delete another's."""
    name = "ito-" + re.sub(r"[^a-z0-9-]", "-", spec.run_id.lower())
    limit = _MAX_NAME - room
    if name != "ito-" + spec.run_id or len(name) > limit:
        digest = hashlib.sha256(spec.run_id.encode()).hexdigest()[:8]
        name = name[: limit - len(digest) - 1].rstrip("-") + "-" + digest
    return name


def job_name(spec: LaunchSpec) -> str:
    """The Job's and the service's name, short enough for the pods' hostnames `<job>-<index>`."""
    return _name(spec, room=len(f"-{spec.nnodes - 1}"))


def pod_hostname(spec: LaunchSpec, index: int) -> str:
    """What the Job controller names index `index`'s pod's host when the template sets a subdomain."""
    return f"{job_name(spec)}-{index}"


def rendezvous_host(spec: LaunchSpec, namespace: str) -> str:
    return f"{pod_hostname(spec, 0)}.{job_name(spec)}.{namespace}.svc"


def headless_service(spec: LaunchSpec, namespace: str, job_uid: str) -> dict:
    name = job_name(spec)
    # The garbage collector deletes the service with its Job. Not blockOwnerDeletion: it only
    # orders a foreground delete, and setting it needs update on jobs/finalizers where the
    # OwnerReferencesPermissionEnforcement admission plugin runs.
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job_uid,
             "blockOwnerDeletion": False, "controller": False}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": {"ito/run": spec.run_id},
                     "ownerReferences": [owner]},
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


def job_body(spec: LaunchSpec, settings: KubernetesSettings) -> dict:
    name = job_name(spec)
    labels = {"ito/run": spec.run_id}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {
            "completionMode": "Indexed",  # one pod per index, hostname `<job>-<index>`
            "completions": spec.nnodes,
            "parallelism": spec.nnodes,
            "backoffLimit": 0,  # restarts are the supervisor's decision, not the Job controller's
            "activeDeadlineSeconds": settings.active_deadline_s,
            "ttlSecondsAfterFinished": settings.ttl_after_finished_s,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "subdomain": name,  # the headless service: `<job>-0.<service>.<namespace>.svc`
                    "restartPolicy": "Never",  # nor the kubelet's
                    "containers": [_container(spec, settings)],
                    "volumes": [{"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": settings.volume_claim}}],
                },
            },
        },
    }


def pod_exit_code(pod: Any) -> int | None:
    """A V1Pod's outcome: the trainer container's exit code once it terminated, 1 for a pod that
    failed without one (evicted), None while it runs or waits."""
    for status in (pod.status.container_statuses or []) if pod.status else []:
        if status.name == CONTAINER_NAME and status.state and status.state.terminated:
            return status.state.terminated.exit_code
    phase = pod.status.phase if pod.status else None
    return {"Failed": 1, "Succeeded": 0}.get(phase)


def pod_index(pod: Any) -> int:
    return int((pod.metadata.annotations or {}).get(INDEX_KEY, -1))


def _condition(job: Any, *types: str) -> Any | None:
    """The Job's first true condition among `types` (FailureTarget precedes Failed on 1.31+)."""
    for condition in (job.status.conditions or []) if job.status else []:
        if condition.type in types and condition.status == "True":
            return condition
    return None


def job_exit_code(job: Any, pods: list[Any], nnodes: int) -> int | None:
    """A V1Job's outcome from it and its pods: DEADLINE_EXIT past its deadline, else the first
    failed index's code, FAILED_JOB_EXIT for a Job failed without one, 0 once every index
    succeeded, None while it runs."""
    failed = _condition(job, "FailureTarget", "Failed")
    if failed is not None and failed.reason == "DeadlineExceeded":
        return DEADLINE_EXIT
    codes = [(pod_index(pod), pod_exit_code(pod)) for pod in sorted(pods, key=pod_index)]
    bad = [code for _, code in codes if code not in (None, 0)]
    if bad:
        return bad[0]
    if failed is not None:
        return FAILED_JOB_EXIT
    succeeded = {index for index, code in codes if code == 0}
    return 0 if len(succeeded) >= nnodes or _condition(job, "Complete") else None


def _api_exception() -> type[Exception]:
    from kubernetes.client.exceptions import ApiException  # the `cluster` extra: imported where used

    return ApiException


def _no_answer() -> type[Exception]:
    """What the client raises where the API did not answer: urllib3's own error, not an
    ApiException (a read timeout: ReadTimeoutError for a create, MaxRetryError around it for a GET
    or a DELETE, which the client retries; a refused connection likewise)."""
    from urllib3.exceptions import HTTPError

    return HTTPError


def _api_errors() -> tuple[type[Exception], ...]:
    return _api_exception(), _no_answer()


def _unavailable(error: Exception) -> bool:
    """No answer in time, or an API server that answered that it cannot serve now (5xx, or 429 from
    its priority and fairness throttling): what a later try may get past, unlike a refusal (another
    4xx: a permission, or a request the back end got wrong)."""
    status = getattr(error, "status", None) or 0
    return isinstance(error, _no_answer()) or status == 429 or status >= 500


def _why(error: Exception) -> str:
    """An API error for the attempt's log."""
    if isinstance(error, _api_exception()):
        return f"{error.status} {error.reason}"
    return f"no answer: {type(getattr(error, 'reason', None) or error).__name__}"


def _delete(call, name: str, namespace: str, *, uid: str, timeout_s: float, **options) -> None:
    """Delete `name` only while it is the object `uid`. Gone (404) or another object by now (409:
    the precondition failed) is what the delete wanted: ours is not there."""
    from kubernetes.client import V1DeleteOptions, V1Preconditions

    body = V1DeleteOptions(preconditions=V1Preconditions(uid=uid), **options)
    try:
        call(name, namespace, body=body, _request_timeout=timeout_s)
    except _api_exception() as error:
        if error.status not in (404, 409):
            raise


def _delete_job(batch: Any, name: str, namespace: str, *, uid: str, timeout_s: float) -> None:
    # The API's default for a batch/v1 Job orphans its pods: name the propagation. Background: the
    # Job goes at once, the garbage collector deletes its pods and service after it.
    _delete(batch.delete_namespaced_job, name, namespace, uid=uid, timeout_s=timeout_s,
            propagation_policy="Background")


def series(log_path: Path) -> str:
    """The SERIES_KEY label of the Jobs whose attempts log to `log_path`'s folder."""
    return hashlib.sha256(str(Path(log_path).parent).encode()).hexdigest()[:32]


def _owned_by(pod: Any, uid: str) -> bool:
    return any(owner.uid == uid for owner in pod.metadata.owner_references or [])


@dataclass
class KubernetesAttempt:
    number: int
    launched_at: float
    api: Any  # kubernetes.client.CoreV1Api: the pods and their logs
    batch: Any  # kubernetes.client.BatchV1Api: the Job
    namespace: str
    job: str
    job_uid: str  # the Job create_namespaced_job made: every delete names it
    nnodes: int
    log_path: Path
    request_timeout_s: float
    poll_s: float = 1.0

    def _pods(self) -> list[Any]:
        """Listed by the Job's name, kept where our Job owns them: a later Job by the name has its own."""
        listed = self.api.list_namespaced_pod(self.namespace, label_selector=f"{JOB_NAME_LABEL}={self.job}",
                                              _request_timeout=self.request_timeout_s)
        return sorted((pod for pod in listed.items if _owned_by(pod, self.job_uid)), key=pod_index)

    def exit_code(self) -> int | None:
        try:
            job = self.batch.read_namespaced_job(self.job, self.namespace, _request_timeout=self.request_timeout_s)
            pods = self._pods()
        except _api_errors() as error:
            # A busy or restarting API server, or one that did not answer in time: unknown is not
            # an end, ask again at the next poll (the heartbeats still tell a hung attempt).
            return MISSING_JOB_EXIT if getattr(error, "status", None) == 404 else None
        if job.metadata.uid != self.job_uid:  # ours is gone, another Job took its name
            return MISSING_JOB_EXIT
        return job_exit_code(job, pods, self.nnodes)

    def wait(self, timeout_s: float) -> None:
        """The whole interval: each look at the job asks the scheduler's API, which is not polled faster."""
        time.sleep(timeout_s)

    def terminate(self, worker_pids: set[int], *, grace_s: float) -> float:
        """`worker_pids` live in the pods: the kubelet signals the containers itself. An API error
        while saving the logs or listing the pods does not stop the Job's delete: a Job left running
        would hold its nodes until its deadline (a week by default). A delete the API did not answer
        (or answered 5xx) is noted in the attempt's log, not raised: the supervisor goes on to its
        restart or its report, whose next call to the API finds out whether it is back."""
        started = time.monotonic()
        self._save_logs()
        self._delete_pods(self._listed(), math.ceil(grace_s))  # the kubelet: SIGTERM, SIGKILL after the grace
        while self._listed() and time.monotonic() < started + grace_s:
            time.sleep(self.poll_s)
        self._delete_job()
        self._delete_pods(self._listed(), 0)  # still there: force, so that no rank outlives its attempt
        return time.monotonic() - started

    def release(self) -> None:
        """The attempt ended: a Job whose delete got no answer goes by its TTL."""
        self._save_logs()
        self._delete_job()

    def _listed(self) -> list[Any]:
        """The pods, or none where the API would not list them: the Job's delete takes them with it."""
        try:
            return self._pods()
        except _api_errors():
            return []

    def _delete_job(self) -> None:
        try:
            _delete_job(self.batch, self.job, self.namespace, uid=self.job_uid, timeout_s=self.request_timeout_s)
        except _api_errors() as error:
            if not _unavailable(error):
                raise
            self._note(f"--- the Job {self.job} was not deleted ({_why(error)}): its deadline or TTL removes it")

    def _delete_pods(self, pods: list[Any], grace_s: int) -> None:
        """The first pod delete the API does not answer ends the loop: each of the others would wait
        as long, and the Job's delete takes them with it."""
        for pod in pods:
            try:
                _delete(self.api.delete_namespaced_pod, pod.metadata.name, self.namespace, uid=pod.metadata.uid,
                        timeout_s=self.request_timeout_s, grace_period_seconds=grace_s)
            except _api_errors() as error:
                if not _unavailable(error):
                    raise
                self._note(f"--- pod {pod.metadata.name} was not deleted ({_why(error)}): the Job's delete takes it")
                return

    def _note(self, line: str) -> None:
        with contextlib.suppress(OSError):  # a log that cannot be written must not stop a cleanup
            with open(self.log_path, "a") as log:
                log.write(line + "\n")

    def _save_logs(self) -> None:
        """The pods' output into the attempt's log before they go: a failed rank's traceback. Best
        effort: pods the API would not list leave a line saying so, and the cleanup goes on; after a
        log read the API did not answer, the other pods' logs are not asked for (each would wait as
        long, before the Job's delete); a log that cannot be written (the stage folder's storage
        failed) is skipped, and the Job is deleted all the same."""
        with contextlib.suppress(OSError), open(self.log_path, "a") as log:
            try:
                pods = self._pods()
            except _api_errors() as error:
                log.write(f"--- (no pods listed: {_why(error)})\n")
                return
            for pod in pods:
                name = pod.metadata.name
                try:
                    text = self.api.read_namespaced_pod_log(name, self.namespace,
                                                            _request_timeout=self.request_timeout_s)
                except _api_exception() as error:  # a container not started yet has no log (400)
                    text = f"(no log: {_why(error)})"
                except _no_answer() as error:
                    log.write(f"--- {name}\n(no log: {_why(error)}; the other pods' logs are not read)\n")
                    return
                log.write(f"--- {name}\n{text}\n")


def _client() -> Any:
    """The client module, configured with in-cluster credentials where the supervisor runs in a
    pod, else with the local kubeconfig."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client


@dataclass
class KubernetesBackend:
    settings: KubernetesSettings
    api: Any = None  # a CoreV1Api; None: built on first use from the cluster's credentials
    batch: Any = None  # a BatchV1Api; likewise
    poll_s: float = 1.0  # between creates refused while a deleted Job still holds the name

    def start(self, spec: LaunchSpec, *, number: int, log_path: Path) -> KubernetesAttempt:
        self._require_on_volume(spec)
        self._connect()
        spec = replace(spec, rdzv_port=self.settings.rdzv_port)
        namespace, name, timeout_s = self.settings.namespace, job_name(spec), self.settings.request_timeout_s
        took_name = self._delete_left_over(series(log_path), name, number, log_path)
        launched_at = time.time()  # the sweep's calls are no start-up time of the attempt
        # A Job deleted under this very name may keep it a moment (finalizers; the garbage collector
        # deletes its service after it): the creates wait as long as one call may, no longer.
        wait_s = timeout_s if took_name else 0.0
        # The Job first: a supervisor that dies before the service leaves a Job whose rendezvous
        # times out and which its deadline and TTL collect; a service created first would have no
        # owner to go with.
        uid = self._create_job(spec, number, log_path, wait_s)
        try:
            # One that got no answer may exist all the same: it is the Job's, and goes with it.
            body = headless_service(spec, namespace, uid)
            self._create(lambda: self.api.create_namespaced_service(namespace, body, _request_timeout=timeout_s),
                         f"service {name}", wait_s)
        except Exception:
            with contextlib.suppress(*_api_errors()):  # the service's error is the one to raise
                _delete_job(self.batch, name, namespace, uid=uid, timeout_s=timeout_s)
            raise
        return KubernetesAttempt(number=number, launched_at=launched_at, api=self.api, batch=self.batch,
                                 namespace=namespace, job=name, job_uid=uid, nnodes=spec.nnodes, log_path=log_path,
                                 request_timeout_s=timeout_s)

    def _delete_left_over(self, label: str, name: str, number: int, log_path: Path) -> bool:
        """Delete, by uid, the Jobs of this series that our launcher made (the label alone anyone
        could set; LAUNCH_KEY is ours) and return whether one had this start's name. The supervisor
        starts an attempt only once the one before ended or was stopped: any such Job is left over.
        A Job under the name without both is not ours: the create's 409 fails the start.

        An API that does not answer the list or a delete fails the start (each call bounded by the
        request timeout): the create would hardly get an answer either, and an attempt started
        without the look could run beside a left-over Job that holds the nodes it needs."""
        namespace, timeout_s = self.settings.namespace, self.settings.request_timeout_s
        took_name = False
        try:
            listed = self.batch.list_namespaced_job(namespace, label_selector=f"{SERIES_KEY}={label}",
                                                    _request_timeout=timeout_s)
            for job in listed.items:
                if LAUNCH_KEY not in (job.metadata.annotations or {}):
                    continue
                _delete_job(self.batch, job.metadata.name, namespace, uid=job.metadata.uid, timeout_s=timeout_s)
                with open(log_path, "a") as log:
                    log.write(f"--- deleted the Job {job.metadata.name} (uid {job.metadata.uid}), left by an "
                              f"earlier start of this stage, before attempt {number}'s\n")
                took_name = took_name or job.metadata.name == name
        except _api_errors() as error:
            if not _unavailable(error):
                raise
            raise RuntimeError(f"the Kubernetes API did not clear the Jobs left before attempt {number} "
                               f"({_why(error)}): not started") from error
        return took_name

    def _create(self, create, what: str, wait_s: float) -> Any:
        """create(), tried again every `poll_s` while the name is taken (409) and `wait_s` has not
        passed. A name still taken fails the start: it is not ours to delete."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return create()
            except _api_exception() as error:
                if error.status != 409:
                    raise
                if time.monotonic() >= deadline:
                    taken = (f"still there {wait_s:g} s after its delete" if wait_s
                             else "already there, not left by an earlier start of this stage: not deleted")
                    raise RuntimeError(f"the {what} in namespace {self.settings.namespace} is {taken}") from error
            time.sleep(self.poll_s)

    def _create_job(self, spec: LaunchSpec, number: int, log_path: Path, wait_s: float) -> str:
        """The Job's uid. A create that got no answer (or a 5xx) may have made the Job all the same:
        it is deleted where it carries this start's token, so that no attempt runs unwatched beside
        the next one, and the start fails. One that appears only after that look carries its series'
        label: the next start deletes it."""
        body, token = job_body(spec, self.settings), secrets.token_hex(8)
        body["metadata"]["annotations"] = {LAUNCH_KEY: token}
        body["metadata"]["labels"] = {**body["metadata"]["labels"], SERIES_KEY: series(log_path)}
        namespace, timeout_s = self.settings.namespace, self.settings.request_timeout_s
        try:
            return self._create(lambda: self.batch.create_namespaced_job(namespace, body, _request_timeout=timeout_s),
                                f"Job {job_name(spec)}", wait_s).metadata.uid
        except _api_errors() as error:
            if not _unavailable(error):
                raise
            self._delete_lost(job_name(spec), token)
            raise RuntimeError(f"the Kubernetes API did not create attempt {number}'s Job ({_why(error)})") from error

    def _delete_lost(self, name: str, token: str) -> None:
        """Our Job by its token (another under the name is not ours), deleted by its uid. An API that
        still does not answer leaves it to its deadline."""
        namespace, timeout_s = self.settings.namespace, self.settings.request_timeout_s
        with contextlib.suppress(*_api_errors()):  # not there, or no answer: the create's error is the one to raise
            job = self.batch.read_namespaced_job(name, namespace, _request_timeout=timeout_s)
            if (job.metadata.annotations or {}).get(LAUNCH_KEY) == token:
                _delete_job(self.batch, name, namespace, uid=job.metadata.uid, timeout_s=timeout_s)

    def _connect(self) -> None:
        if self.api is None or self.batch is None:
            client = _client()
            self.api = self.api or client.CoreV1Api()
            self.batch = self.batch or client.BatchV1Api()

    def _require_on_volume(self, spec: LaunchSpec) -> None:
        """The pods see only the shared volume: the attempt's config (an absolute path among the
        worker's arguments) must lie under the mount path."""
        mount = PurePosixPath(self.settings.mount_path)
        outside = [a for a in spec.args if a.startswith("/") and not PurePosixPath(a).is_relative_to(mount)]
        if outside:
            raise ValueError(f"not under the shared volume's mount_path {mount}: {', '.join(outside)}")
