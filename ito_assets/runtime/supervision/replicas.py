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
- A restarted group heals: it joins the quorum behind the quorum's step and torchft loads an
  up-to-date peer's weights, optimizer, step and data position into it (`replica_sync`). Group
  0 resumes from its newest whole checkpoint first (so that it can carry the stage alone when no
  peer is ahead), then heals forward to the quorum's step if its peers are ahead. The other groups
  never write checkpoints (one lineage per stage) and start from the stage's initial weights.
- The outcome is group 0's: its checkpoints are the stage's. When group 0 ends, a group that
  reached the last step with it is given the grace period (`grace_s`) to write its result; any
  other group is stopped at once: a group behind a finished, failed or stopped group 0 has nobody
  to heal from and nothing the stage keeps to write. A group other than 0 that exhausts its
  restarts leaves group 0 training alone: recorded in the report, not a failure of the stage.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ito_assets.runtime.supervision import heartbeat
from ito_assets.runtime.stage.config import WorkerConfig, group_shape
from ito_assets.runtime.record.storage import write_atomic
from ito_assets.runtime.supervision.supervisor import (REPORT_NAME, Outcome, SupervisionReport, Supervisor, SupervisorConfig, print_outcome,
                                                      stage_arguments)

# What torchft's Manager reads for the lighthouse's address (torchft.manager, `TORCHFT_LIGHTHOUSE`).
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
# The lighthouse waits this long for stragglers before it forms a quorum without them. torchft's
# own default (60 s) suits a cluster where groups start minutes apart; here a late group is not
# worth a stalled step: it joins at the next step and heals (measured: a heal of the micro model
# takes well under a second).
JOIN_TIMEOUT_MS = 100
# A group whose manager stops heartbeating leaves the quorum after this long: torchft's default
# (5 s), far below any supervisor hang bound, which is what the survivors' pause costs at most.
HEARTBEAT_TIMEOUT_MS = 5_000
# torchft's Rust side (lighthouse, managers) logs every quorum at INFO, several lines a step; its
# warnings and errors are what an attempt log needs. `RUST_LOG` set by the operator wins.
RUST_LOG_DEFAULT = "warn"


def replica_dir(stage_dir: Path, replica_id: int) -> Path:
    return stage_dir if replica_id == 0 else stage_dir / f"replica-{replica_id}"


def group_worker(stage: WorkerConfig, replica_id: int) -> WorkerConfig:
    """Group 0 keeps the stage's folders; group i > 0 gets its own sub-folder of the stage folder."""
    if replica_id == 0:
        return replace(stage, replica_id=0)
    folder = replica_dir(Path(stage.stage_dir), replica_id)
    return replace(stage, replica_id=replica_id, stage_dir=str(folder), heartbeat_dir=str(folder / "heartbeats"),
                   metrics_path=str(folder / "metrics.jsonl"))


def group_supervision(config: SupervisorConfig, groups: int) -> SupervisorConfig:
    """One group's share of the attempt's nodes and ranks (`config.group_shape`)."""
    shape = group_shape(config.nnodes, config.nproc_per_node, groups)
    if shape is None:
        raise ValueError(f"{config.nnodes} node(s) x {config.nproc_per_node} rank(s) do not split into {groups} "
                         "equal replica groups")
    return replace(config, nnodes=shape[0], nproc_per_node=shape[1])


@dataclass(frozen=True, kw_only=True)
class GroupSummary:
    replica_id: int
    outcome: Outcome | None  # None: the group's supervisor raised (`error`)
    num_attempts: int
    num_faults: int
    error: str = ""


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
                            num_attempts=self.report.num_attempts, num_faults=len(self.report.faults))


@dataclass
class ReplicaStage:
    worker: WorkerConfig  # the stage's, with `replica_groups` > 1
    config: SupervisorConfig  # for the whole attempt: every group's nodes and ranks together

    def __post_init__(self) -> None:
        if self.worker.replica_groups < 2:
            raise ValueError("replica_groups must be at least 2: one group runs under the supervisor alone")
        if self.worker.replica_timeout_s >= self.config.hang_timeout_s:
            raise ValueError("replica_timeout_s must be below hang_timeout_s: a group waiting on a dead peer "
                             "would be taken for hung")
        if np.load(self.worker.tokens_path, mmap_mode="r").ndim > 1:
            # Each group would weigh its own rows' targets, and torchft averages the groups alike;
            # DPO's pairs would average right, but no test has trained them across groups yet.
            raise ValueError("rows with targets (an SFT or DPO shard) train in one replica group only")
        self.groups: list[_Group] = []

    def request_stop(self, *_: object) -> None:
        for group in self.groups:
            group.supervisor.request_stop()

    def run(self) -> SupervisionReport:
        os.environ.setdefault("RUST_LOG", RUST_LOG_DEFAULT)  # read by torchft's Rust logger, here and in the workers
        from torchft.coordination import LighthouseServer  # the optional `ft` extra: only this path needs it

        lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=JOIN_TIMEOUT_MS,
                                      heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
        try:
            per_group = group_supervision(self.config, self.worker.replica_groups)
            env = {LIGHTHOUSE_ENV: lighthouse.address()}
            self.groups = [_Group(Supervisor(worker=group_worker(self.worker, i), config=per_group, env=env), i)
                           for i in range(self.worker.replica_groups)]
            for group in self.groups:
                group.thread.start()
            self._wait()
        finally:
            lighthouse.shutdown()
        return self._report()

    def _wait(self) -> None:
        first, others = self.groups[0], self.groups[1:]
        first.thread.join()
        succeeded = first.report is not None and first.report.outcome is Outcome.SUCCEEDED
        for group in others:
            if not (succeeded and self._finishing(group)):
                group.supervisor.request_stop()  # behind group 0 (e.g. restarting): nothing left to heal from
            group.thread.join(timeout=self.config.grace_s)
            group.supervisor.request_stop()
            group.thread.join()

    def _finishing(self, group: _Group) -> bool:
        """Whether every rank of the group reached the stage's last step, as group 0 did: in step
        with it, the group has only its result left to write."""
        beats = heartbeat.read_all(Path(group.supervisor.worker.heartbeat_dir))
        return bool(beats) and all(b.step >= self.worker.num_steps for b in beats.values())

    def _report(self) -> SupervisionReport:
        first = self.groups[0]
        if first.report is None:
            raise RuntimeError("replica group 0's supervisor failed") from first.error
        body = asdict(first.report) | {"replica_groups": [asdict(g.summary()) for g in self.groups]}
        write_atomic(Path(self.worker.stage_dir) / REPORT_NAME, json.dumps(body, sort_keys=True).encode())
        return first.report


def main(argv: list[str] | None = None) -> int:
    """`python -m ito_assets.runtime.supervision.replicas --worker W.json --supervisor S.json` (what Pipes runs)."""
    worker, config = stage_arguments("ito_assets.runtime.supervision.replicas", argv)  # config: the whole attempt's
    stage = ReplicaStage(worker=worker, config=config)
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, stage.request_stop)
    report = stage.run()
    print_outcome({"stage": report.stage, "outcome": report.outcome.value, "num_attempts": report.num_attempts,
                   "replica_groups": stage.worker.replica_groups})
    return 0 if report.outcome is Outcome.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
