"""The replica stage's lighthouse keeps groups at one step in one quorum: two quorums at one step
would each train it on other rows and meet again at equal steps on different weights, which
torchft never heals (it heals only a group behind). Groups that resumed from group 0's checkpoint
are at group 0's step while group 0 may be mid-step."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from ito_assets.runtime.supervision.replicas import ReplicaStage
from ito_assets.runtime.supervision.supervisor import SupervisorConfig
from runtime_helpers import worker_config

STEP = 8


def _quorums(stage: ReplicaStage, mid_step_s: float) -> dict[str, object]:
    """Group 0 alone in a quorum at STEP (the others still loading), then groups 1 and 2 ask for
    the next at STEP while group 0 finishes its step (`mid_step_s` more); each group's quorum's
    members, or the error."""
    # Imported here, as the stage does: torchft brings in importlib_metadata, whose finder, once
    # imported, answers the standard library's metadata look-ups for every module collected after.
    from torchft.coordination import LighthouseClient

    lighthouse = stage.lighthouse()
    try:
        clients = {g: LighthouseClient(lighthouse.address(), connect_timeout=timedelta(seconds=5)) for g in "012"}
        clients["0"].quorum(replica_id="0", timeout=timedelta(seconds=5), step=STEP)
        for group, client in clients.items():
            client.heartbeat(group)
        found: dict[str, object] = {}

        def ask(group: str, delay: float) -> None:
            time.sleep(delay)
            try:
                quorum = clients[group].quorum(replica_id=group, timeout=timedelta(seconds=2), step=STEP)
                found[group] = sorted(p.replica_id for p in quorum.participants)
            except Exception as error:  # noqa: BLE001 - a quorum that never formed, as the test reports it
                found[group] = type(error).__name__

        threads = [threading.Thread(target=ask, args=a) for a in (("1", 0.0), ("2", 0.0), ("0", mid_step_s))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return found
    finally:
        lighthouse.shutdown()


def test_groups_at_one_step_wait_for_a_group_still_in_its_step(tmp_path, tokens):
    config = worker_config(tmp_path, tokens, replica_groups=2, replica_timeout_s=10.0)  # a wait of 5 s
    stage = ReplicaStage(worker=config, config=SupervisorConfig(nproc_per_node=2, hang_timeout_s=60))
    assert _quorums(stage, 0.3) == {"0": ["0", "1", "2"], "1": ["0", "1", "2"], "2": ["0", "1", "2"]}


def test_a_wait_shorter_than_the_step_splits_them(tmp_path, tokens):
    """What the wait prevents, with the 100 ms the stage once used: groups 1 and 2 train step 9
    without group 0, which trains it alone."""
    config = worker_config(tmp_path, tokens, replica_groups=2, replica_timeout_s=0.2)
    stage = ReplicaStage(worker=config, config=SupervisorConfig(nproc_per_node=2, hang_timeout_s=60))
    found = _quorums(stage, 1.0)
    assert found["1"] == found["2"] == ["1", "2"] and found["0"] != ["0", "1", "2"]
