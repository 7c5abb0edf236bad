"""A stage as torchft replica groups: the plan replicates (dp_replicate > 1), so the attempt's ranks
form `replica_groups` groups that each train a full copy of the model, average their gradients
every step, and heal each other.

    python -m ito_assets.runtime.supervision.replicas --worker W.json --supervisor S.json

The same arguments and the same report (`supervision.json` in the stage folder) as
`ito_assets.runtime.supervision.supervisor`, whose `Supervisor` runs each group here, one thread per group,
around one torchft lighthouse (the quorum's coordinator) in this process:

    <stage>/                 group 0: checkpoints, events, result.json, attempt logs, heartbeats/
    <stage>/replica-<i>/     group i > 0: its attempt logs, heartbeats/, events, metrics, result.json

- A dead or hung group is restarted by its own supervisor (the same bounds and restart budget as a
  stage without replicas) while the other groups keep training: they wait at most the lighthouse's
  heartbeat timeout for the dead group to leave the quorum, then go on without it.
- Groups share the lighthouse, group 0's checkpoints and their heartbeat folders (a group about to
  join waits for the others to load: `replica_sync.await_peers`). Where they split one node's ranks, each gets its share of
  the node's GPUs: on this machine its own `CUDA_VISIBLE_DEVICES` (every group's local rank 0
  would otherwise take GPU 0), under Slurm or Kubernetes its share of `gpus_per_node` (the job or
  pod asks for no more than its ranks use). Under Slurm each group's rendezvous has a port of its
  own (`rdzv_port + i`): two groups' jobs may share a node, and torchrun's agent that finds the
  port taken joins the store already on it, the other group's, and dies with it.
- A restarted group heals: it joins the quorum behind the quorum's step and torchft loads an
  up-to-date peer's weights, optimizer, step and data position into it (`replica_sync`). Group
  0 resumes from its newest whole checkpoint first (so that it can carry the stage alone when no
  peer is ahead), then heals forward to the quorum's step if its peers are ahead. The other groups
  never write checkpoints (one lineage per stage) and resume from group 0's newest: at or behind
  group 0's step on group 0's weights (group 0 may save another before a slower group loads one),
  never from their first weights, from which they could reach group 0's step unhealed.
- A spike restart the desk approved restarts every group: group 0's supervisor sets the later
  checkpoints aside and marks it applied, the others end their attempts once it is applied, group
  0 launches again once they have (at most a poll interval and a grace period), and all resume on
  the rewound lineage (group 0's newest checkpoint, at or behind the proposal's) and skip its
  batches. Were group 0 alone to rewind, it would heal forward from a peer that did not.
- The outcome is group 0's: its checkpoints are the stage's. When group 0 ends, a group that
  reached the last step with it is given the grace period (`grace_s`) to write its result; any
  other group is stopped at once: a group behind a finished, failed or stopped group 0 has nobody
  to heal from and nothing the stage keeps to write. A group other than 0 that exhausts its
  restarts leaves group 0 training alone: recorded in the report, not a failure of the stage.
- A stop request (SIGTERM/SIGINT) reaches every group, also one that arrives before the groups'
  supervisors exist. Under Slurm or Kubernetes group 0's metrics are relayed to this process's
  Pipes channel, as the supervisor relays a stage's (`relay`).
- Groups that train in step to the end end with the same weights, bit for bit (`parameters_sha256`
  of each group's result). The report compares the digests of the groups that finished
  (`parameters_agree`); false, also said on stderr, means that they did not: a group finished
  while group 0 was restarting (group 0 then trained the last steps alone), or a group trained on
  other weights than its peers (it never healed, or healed from stale ones). The outcome stays
  group 0's: its checkpoints are whole, and the eval gate judges its weights.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping

import numpy as np

from ito_assets.launch.backend import BackendKind
from ito_assets.runtime.supervision import heartbeat
from ito_assets.runtime.supervision.relay import MetricsRelay
from ito_assets.runtime.stage.config import WorkerConfig, group_shape
from ito_assets.runtime.record.events import replica_dir
from ito_assets.runtime.record.storage import write_atomic
from ito_assets.runtime.supervision.supervisor import (REPORT_NAME, Outcome, SupervisionReport, Supervisor, SupervisorConfig,
                                                      print_outcome, refused_arguments, supervised, supervising)

# What torchft's Manager reads for the lighthouse's address (torchft.manager, `TORCHFT_LIGHTHOUSE`).
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
# The lighthouse waits for groups that heartbeat but have not asked for the next quorum (mid-step,
# or loading a checkpoint) at most this share of the groups' quorum timeout (`replica_timeout_s`),
# which must answer first. Two groups at one step in two quorums each train that step on other
# rows and meet again at equal steps on different weights, which torchft never heals: a group that
# resumed from group 0's checkpoint is at group 0's step. 100 ms split three groups at step 8
# into {1, 2} and {0} (tests/runtime/test_replica_quorum.py). Two groups never split (a quorum
# without the previous one's members needs more than half of those heartbeating); three or more
# still can where one is slower to load than the workers wait for it (`replica_sync.await_peers`)
# and another's step outlasts this wait meanwhile (30 s at the default 60 s timeout; a first step
# that compiles may), and only `parameters_agree` shows it.
JOIN_TIMEOUT_SHARE = 0.5
# A group whose manager stops heartbeating leaves the quorum after this long: torchft's default
# (5 s), far below any supervisor hang bound, which is what the survivors' pause costs at most.
HEARTBEAT_TIMEOUT_MS = 5_000
# torchft's Rust side (lighthouse, managers) logs every quorum at INFO, several lines a step; its
# warnings and errors are what an attempt log needs. `RUST_LOG` set by the operator wins.
RUST_LOG_DEFAULT = "warn"
# How often group 0's supervisor looks whether the other groups ended their attempts for a restart
# (in-process flags: a cheap look).
FOLLOW_POLL_S = 0.05
# The GPUs a process on this machine may use (torch numbers the visible ones from 0).
DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


def longest_wait_s(replica_timeout_s: float) -> float:
    """The longest a healthy group goes without a step on a hung peer (torchft's thread still
    heartbeating): the lighthouse's wait for it, a collective's timeout, then its heartbeat's."""
    return replica_timeout_s * (1 + JOIN_TIMEOUT_SHARE) + HEARTBEAT_TIMEOUT_MS / 1000


def group_worker(stage: WorkerConfig, replica_id: int) -> WorkerConfig:
    """Group 0 keeps the stage's folders; group i > 0 gets its own sub-folder of the stage folder
    and resumes from group 0's checkpoints. Each knows the others' heartbeat folders."""
    heartbeats = [stage.heartbeat_dir, *(str(replica_dir(Path(stage.stage_dir), i) / "heartbeats")
                                         for i in range(1, stage.replica_groups))]
    peers = tuple(folder for i, folder in enumerate(heartbeats) if i != replica_id)
    if replica_id == 0:
        return replace(stage, replica_id=0, peer_heartbeat_dirs=peers)
    folder = replica_dir(Path(stage.stage_dir), replica_id)
    return replace(stage, replica_id=replica_id, stage_dir=str(folder), heartbeat_dir=heartbeats[replica_id],
                   metrics_path=str(folder / "metrics.jsonl"), resume_dir=stage.stage_dir, peer_heartbeat_dirs=peers)


def group_supervision(config: SupervisorConfig, groups: int, replica_id: int = 0) -> SupervisorConfig:
    """Group `replica_id`'s share of the attempt's nodes and ranks (`config.group_shape`); where the
    groups split one node's ranks, of its GPUs per node too; under Slurm, a rendezvous port of its own."""
    shape = group_shape(config.nnodes, config.nproc_per_node, groups)
    if shape is None:
        raise ValueError(f"{config.nnodes} node(s) x {config.nproc_per_node} rank(s) do not split into {groups} "
                         "equal replica groups")
    share = lambda gpus: -(-gpus * shape[1] // config.nproc_per_node)  # the group's ranks' share, rounded up
    launch = config.launch
    if launch.slurm is not None:
        launch = replace(launch, slurm=replace(launch.slurm, gpus_per_node=share(launch.slurm.gpus_per_node),
                                               rdzv_port=launch.slurm.rdzv_port + replica_id))
    if launch.kubernetes is not None:  # each Job's pods have addresses of their own: the port may be shared
        launch = replace(launch, kubernetes=replace(launch.kubernetes,
                                                    gpus_per_node=share(launch.kubernetes.gpus_per_node)))
    return replace(config, nnodes=shape[0], nproc_per_node=shape[1], launch=launch)


def lighthouse_url(address: str, backend: BackendKind) -> str:
    """The lighthouse's address as the groups' ranks reach it. torchft gives this machine's host
    name; a Kubernetes pod's name resolves only inside the pod itself, so there the pod's IP, which
    the kubelet writes beside the name into the pod's /etc/hosts (other pods reach it directly)."""
    if backend is not BackendKind.KUBERNETES:
        return address
    url = urllib.parse.urlsplit(address)
    try:
        ip = socket.getaddrinfo(socket.gethostname(), url.port, type=socket.SOCK_STREAM)[0][4][0]
    except OSError:  # no entry for the pod's name: torchft's own address, the best left
        return address
    host = f"[{ip}]" if ":" in ip else ip  # an IPv6-only cluster's
    return url._replace(netloc=f"{host}:{url.port}").geturl()


def group_devices(config: SupervisorConfig, groups: int, replica_id: int,
                  environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Group `replica_id`'s `CUDA_VISIBLE_DEVICES` where the groups split the ranks of this machine
    (`config`: the whole attempt's): its consecutive share of the GPUs visible here, the first
    `nproc_per_node` where none are named. Nothing elsewhere (Slurm and Kubernetes give each job or
    pod its own), on loopback nodes (each node's ranks take the same GPUs, with or without groups),
    or where fewer GPUs are named than ranks run (as without groups, the ranks find out)."""
    if config.launch.backend is not BackendKind.LOCAL or config.nnodes != 1:
        return {}
    named = environ.get(DEVICES_ENV)
    devices = ([d.strip() for d in named.split(",") if d.strip()] if named is not None
               else [str(i) for i in range(config.nproc_per_node)])
    if len(devices) < config.nproc_per_node:
        return {}
    per_group = config.nproc_per_node // groups
    return {DEVICES_ENV: ",".join(devices[replica_id * per_group:(replica_id + 1) * per_group])}


@dataclass(frozen=True, kw_only=True)
class GroupSummary:
    replica_id: int
    outcome: Outcome | None  # None: the group's supervisor raised (`error`)
    num_attempts: int
    num_faults: int
    error: str = ""
    parameters_sha256: str | None = None  # from the group's result, when it finished


class _Group:
    """One replica group's supervisor on its own thread."""

    def __init__(self, supervisor: Supervisor, replica_id: int):
        self.supervisor, self.replica_id = supervisor, replica_id
        self.report: SupervisionReport | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"replica-{replica_id}", daemon=True)

    def _run(self) -> None:
        try:
            self.report = self.supervisor.run()
        except BaseException as error:  # recorded: the stage's outcome still follows group 0
            self.error = error

    def summary(self) -> GroupSummary:
        if self.report is None:
            return GroupSummary(replica_id=self.replica_id, outcome=None, num_attempts=0, num_faults=0,
                                error=repr(self.error))
        return GroupSummary(replica_id=self.replica_id, outcome=self.report.outcome,
                            num_attempts=self.report.num_attempts, num_faults=len(self.report.faults),
                            parameters_sha256=(self.report.result or {}).get("parameters_sha256"))


@dataclass
class ReplicaStage:
    worker: WorkerConfig  # the stage's, with `replica_groups` > 1
    config: SupervisorConfig  # for the whole attempt: every group's nodes and ranks together
    relay: MetricsRelay | None = None  # group 0's metrics to this process's Pipes channel (remote ranks)
    stop_requested: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.worker.replica_groups < 2:
            raise ValueError("replica_groups must be at least 2: one group runs under the supervisor alone")
        if longest_wait_s(self.worker.replica_timeout_s) >= self.config.hang_timeout_s:
            raise ValueError("replica_timeout_s must leave a group's longest wait on its peers (the quorum's wait, "
                             "then the collective's, then a dead peer's heartbeat timeout) below hang_timeout_s: "
                             "a healthy group waiting on a hung peer would be taken for hung")
        if np.load(self.worker.tokens_path, mmap_mode="r").ndim > 1:
            # Each group would weigh its own rows' targets, and torchft averages the groups alike;
            # DPO's pairs would average right, but no test has trained them across groups yet.
            raise ValueError("rows with targets (an SFT or DPO shard) train in one replica group only")
        self.groups: list[_Group] = []

    def request_stop(self, *_: object) -> None:
        self.stop_requested = True  # for groups not yet built (a signal while the lighthouse starts)
        for group in self.groups:
            group.supervisor.request_stop()

    def run(self) -> SupervisionReport:
        """Raises StageBusy, before anything starts, where another supervisor holds the stage folder
        (StageSuperseded where a later launch rewrote its config)."""
        Path(self.worker.stage_dir).mkdir(parents=True, exist_ok=True)
        with supervising(Path(self.worker.stage_dir), launch_id=self.config.launch_id):  # for every group: theirs run inside the stage's folder
            return self._run()

    def _run(self) -> SupervisionReport:
        os.environ.setdefault("RUST_LOG", RUST_LOG_DEFAULT)  # read by torchft's Rust logger, here and in the workers
        lighthouse = self.lighthouse()
        try:
            self.groups = self._build_groups(lighthouse_url(lighthouse.address(), self.config.launch.backend))
            if self.stop_requested:  # asked before the groups existed
                self.request_stop()
            for group in self.groups:
                group.thread.start()
            self._wait()
        finally:
            lighthouse.shutdown()
        return self._report()

    def lighthouse(self):
        """The stage's torchft lighthouse, serving on a free port."""
        from torchft.coordination import LighthouseServer  # the optional `ft` extra: only this path needs it

        join_timeout_ms = int(self.worker.replica_timeout_s * 1000 * JOIN_TIMEOUT_SHARE)
        return LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=join_timeout_ms,
                                heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)

    def _build_groups(self, address: str) -> list[_Group]:
        """One supervisor per group, its threads not started; group 0's waits for the others after
        it applies a spike restart."""
        groups = self.worker.replica_groups
        return [_Group(Supervisor(worker=group_worker(self.worker, i), config=group_supervision(self.config, groups, i),
                                  env={LIGHTHOUSE_ENV: address, **group_devices(self.config, groups, i)},
                                  relay=self.relay if i == 0 else None, lock=False,
                                  after_apply=self._await_followers if i == 0 else None), i)
                for i in range(groups)]

    def _wait(self) -> None:
        first, others = self.groups[0], self.groups[1:]
        first.thread.join()
        succeeded = first.report is not None and first.report.outcome is Outcome.SUCCEEDED
        finishing = [g for g in others if succeeded and self._finishing(g)]
        for group in others:
            if group not in finishing:
                group.supervisor.request_stop()  # behind group 0 (e.g. restarting): nothing left to heal from
        deadline = time.monotonic() + self.config.grace_s  # one grace period for all of them
        for group in finishing:
            group.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        for group in others:
            group.supervisor.request_stop()
            group.thread.join()

    def _await_followers(self, proposal_id: str) -> None:
        """Group 0's supervisor, once it applied a restart: wait until every other live group has
        ended its attempt for it, at most a poll interval and a grace period (a follower's detection
        and its workers' exit). Group 0's next attempt would otherwise join the quorum behind a group
        still training on, and heal forward from it."""
        deadline = time.monotonic() + self.config.poll_interval_s + self.config.grace_s
        for group in self.groups[1:]:
            while (group.thread.is_alive() and not group.supervisor.followed(proposal_id)
                   and not self.stop_requested and time.monotonic() < deadline):
                time.sleep(FOLLOW_POLL_S)

    def _finishing(self, group: _Group) -> bool:
        """Whether every rank of the group reached the stage's last step, as group 0 did: in step
        with it, the group has only its result left to write."""
        beats = heartbeat.read_all(Path(group.supervisor.worker.heartbeat_dir))
        return bool(beats) and all(b.step >= self.worker.num_steps for b in beats.values())

    def _report(self) -> SupervisionReport:
        first = self.groups[0]
        if first.report is None:
            raise RuntimeError("replica group 0's supervisor failed") from first.error
        summaries = [g.summary() for g in self.groups]
        finished = [s for s in summaries if s.outcome is Outcome.SUCCEEDED and s.parameters_sha256]
        agree = None if len(finished) < 2 else len({s.parameters_sha256 for s in finished}) == 1
        if agree is False:
            print(f"replica groups of {self.worker.stage} ended with different weights ("
                  + ", ".join(f"group {s.replica_id}: {s.parameters_sha256}" for s in finished)
                  + "): they did not train in step to the end (a group finished while another restarted, or "
                  "trained on other weights); group 0's are the stage's",
                  file=sys.stderr, flush=True)
        body = asdict(first.report) | {"replica_groups": [asdict(s) for s in summaries], "parameters_agree": agree}
        write_atomic(Path(self.worker.stage_dir) / REPORT_NAME, json.dumps(body, sort_keys=True).encode())
        return first.report


def main(argv: list[str] | None = None) -> int:
    """`python -m ito_assets.runtime.supervision.replicas --worker W.json --supervisor S.json` (what Pipes runs)."""
    arguments = refused_arguments("ito_assets.runtime.supervision.replicas", argv)
    if arguments is None:
        return 1
    worker, config = arguments  # config: the whole attempt's
    stage = ReplicaStage(worker=worker, config=config)
    report = supervised(stage, worker, config)  # group 0's rank 0 reports to the relay
    if report is None:
        return 1
    print_outcome({"stage": report.stage, "outcome": report.outcome.value, "num_attempts": report.num_attempts,
                   "replica_groups": stage.worker.replica_groups})
    return 0 if report.outcome is Outcome.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
