"""torchft replica groups (`ito_assets.runtime.supervision.replicas`): how the data and the ranks split across
groups, and, for real on two one-rank groups, a group killed mid-stage that restarts and heals from
its peer while the other group trains on without a restart."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.record import events
from ito_assets.runtime.supervision import heartbeat
from ito_assets.runtime.worker.batches import BatchPlan, ResumableBatches
from ito_assets.runtime.stage.config import RESULT_NAME, WorkerConfig, group_shape
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.record.goodput import summarize, summarize_stage
from ito_assets.runtime.supervision.replicas import (ReplicaStage, group_supervision, group_worker, longest_wait_s,
                                                      replica_dir)
from ito_assets.runtime.stage.curriculum import StageSizing, replica_groups_for
from ito_assets.runtime.supervision.supervisor import REPORT_NAME, Supervisor, SupervisorConfig
from ito_assets.runtime.worker.main import data_rank
from ito_assets.runtime.worker.replica_sync import await_peers
from ito_assets.training.layout import Layout
from runtime_helpers import EXACT_DDP, run_worker, worker_config

# Long enough, on an idle machine, that the healthy group is still training when the killed one is
# back (start-up of a restarted worker: ~15 s on the 2-core machine; the healthy group alone: ~10
# steps a second); beside other tests it may not be, which `make test`'s version accepts.
STEPS = 400
# Two ranks per replica group that shard the model (FSDP2), two groups.
SHARDED_GROUPS = Layout(dp_replicate=2, dp_shard=2, precision="fp32", compile=False, micro_batch_size=2)
KILL_AT_STEP = 20
SUPERVISION = SupervisorConfig(nproc_per_node=2, hang_timeout_s=30.0, startup_timeout_s=90.0, poll_interval_s=0.2,
                               grace_s=5.0, max_restarts=2)


def _rows(plan: BatchPlan, tokens: np.ndarray) -> set[tuple[int, ...]]:
    _, x, _ = ResumableBatches(tokens, plan).next_batch()
    return {tuple(row) for row in x.tolist()}


def test_replica_groups_split_every_global_batch_into_disjoint_shares(tmp_path, tokens):
    data = np.load(tokens[0], mmap_mode="r")
    config = worker_config(tmp_path, tokens, replica_groups=2)
    whole = _rows(BatchPlan(batch_size=8, sequence_length=32, seed=0), data)
    shares = [_rows(BatchPlan(batch_size=8, sequence_length=32, seed=0, world_size=4,
                              rank=data_rank(replace(config, replica_id=group), rank, group_world_size=2)), data)
              for group in (0, 1) for rank in (0, 1)]
    assert [data_rank(replace(config, replica_id=g), r, group_world_size=2) for g in (0, 1) for r in (0, 1)] == [0, 1, 2, 3]
    assert all(len(share) == 2 for share in shares) and set().union(*shares) == whole


def test_the_ranks_split_into_groups_by_nodes_first():
    assert group_shape(4, 8, 2) == (2, 8)  # whole nodes per group
    assert group_shape(1, 2, 2) == (1, 1)  # one node: its ranks
    assert group_shape(3, 2, 2) is None
    assert replica_groups_for(Layout(dp_replicate=2), nnodes=1, nproc_per_node=2) == 2
    assert replica_groups_for(Layout(dp_replicate=2), nnodes=1, nproc_per_node=1) == 1  # nothing to split
    assert replica_groups_for(Layout(dp_shard=8), nnodes=1, nproc_per_node=8) == 1
    assert group_supervision(SUPERVISION, 2).nproc_per_node == 1
    with pytest.raises(ValueError, match="divisible by replica_groups"):
        StageSizing(model="micro", vocab_size=512, batch_size=6, world_size=3, replica_groups=2,
                    layout=Layout(dp_replicate=3))


def test_only_group_zero_keeps_the_stage_folder(tmp_path, tokens):
    config = worker_config(tmp_path, tokens, replica_groups=2)
    first, second = group_worker(config, 0), group_worker(config, 1)
    assert (first.stage_dir, first.heartbeat_dir) == (config.stage_dir, config.heartbeat_dir)
    assert Path(second.stage_dir) == Path(config.stage_dir) / "replica-1" and second.replica_id == 1
    assert Path(second.heartbeat_dir).parent == Path(second.stage_dir)
    assert first.resume_dir is None and second.resume_dir == config.stage_dir  # group 0's checkpoints
    assert first.peer_heartbeat_dirs == (second.heartbeat_dir,) and second.peer_heartbeat_dirs == (first.heartbeat_dir,)
    four = [group_worker(replace(config, replica_groups=4, batch_size=8), i) for i in range(4)]
    for group in four:
        assert set(group.peer_heartbeat_dirs) == {g.heartbeat_dir for g in four} - {group.heartbeat_dir}
    assert WorkerConfig.from_json(four[1].to_json()) == four[1]  # as the worker reads it
    with pytest.raises(ValueError, match="replica_id"):
        replace(config, replica_id=2)
    with pytest.raises(ValueError, match="below hang_timeout_s"):
        ReplicaStage(worker=replace(config, replica_timeout_s=60.0), config=SUPERVISION)


def test_a_group_s_longest_wait_on_a_hung_peer_stays_below_the_hang_bound(tmp_path, tokens):
    """The quorum's wait (half the timeout), the collective's (the timeout) and a dead peer's
    heartbeat (5 s): 10 s of timeout waits 20 s, so a 20 s hang bound is refused and 20.001 s taken."""
    config = worker_config(tmp_path, tokens, replica_groups=2, replica_timeout_s=10.0)
    assert longest_wait_s(10.0) == 20.0
    with pytest.raises(ValueError, match="below hang_timeout_s"):
        ReplicaStage(worker=config, config=replace(SUPERVISION, hang_timeout_s=20.0))
    ReplicaStage(worker=config, config=replace(SUPERVISION, hang_timeout_s=20.001))


def test_rows_with_targets_are_refused_across_replica_groups_before_any_launch(tmp_path, tokens):
    config = worker_config(tmp_path, tokens, replica_groups=2, replica_timeout_s=10.0)
    assert ReplicaStage(worker=config, config=SUPERVISION).groups == []  # a token stream is fine
    # An SFT shard and a DPO shard of pairs: every target takes a loss.
    for shape in ((8, 2, config.sequence_length), (8, 2, 2, config.sequence_length)):
        np.save(tmp_path / "rows.npy", np.zeros(shape, dtype=np.int32))
        with pytest.raises(ValueError, match="one replica group only"):
            ReplicaStage(worker=replace(config, tokens_path=str(tmp_path / "rows.npy")), config=SUPERVISION)


def _steps(folder: Path) -> dict[int, list[tuple[int, float]]]:
    """attempt -> [(step, at)] of the group's step events."""
    found: dict[int, list[tuple[int, float]]] = {}
    for event in events.read(folder):
        if event.kind is EventKind.STEP:
            found.setdefault(event.attempt, []).append((event.step, event.at))
    return found


def _wait_for_step(folder: Path, step: int, timeout: float = 90.0) -> heartbeat.Heartbeat:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        beat = heartbeat.read_all(folder, attempt=0).get(0)
        if beat is not None and beat.step >= step:
            return beat
        time.sleep(0.01)
    raise AssertionError(f"the replica group in {folder} never reached step {step}")


def _kill_group_one(tmp_path: Path, tokens, *, layout: Layout = EXACT_DDP,
                    nproc_per_node: int = 2) -> tuple[Path, heartbeat.Heartbeat, float, dict]:
    """Both groups training, then SIGKILL of group 1's (first) worker; returns (stage folder, its
    last heartbeat before the kill, the kill's time, the stage's report) once the stage has ended."""
    config = worker_config(tmp_path, tokens, num_steps=STEPS, interval_steps=50, replica_groups=2,
                           replica_timeout_s=10.0, layout=layout)
    stage_dir = Path(config.stage_dir)
    stage = ReplicaStage(worker=config, config=replace(SUPERVISION, nproc_per_node=nproc_per_node))
    reports = []
    thread = threading.Thread(target=lambda: reports.append(stage.run()), daemon=True)
    thread.start()
    # Both groups must be training before the kill: on a loaded host group 0 can start late and
    # join (heal from) group 1 several steps in. torchrun starts each worker in a session of its
    # own: the worker's pid, from its heartbeat.
    joined = _wait_for_step(Path(config.heartbeat_dir), 1)
    beat = _wait_for_step(replica_dir(stage_dir, 1) / "heartbeats", max(KILL_AT_STEP, joined.step + 1))
    killed_at = time.time()
    os.kill(beat.pid, signal.SIGKILL)
    thread.join(timeout=240)
    (report,) = reports
    assert report.outcome == "succeeded" and report.result["num_steps"] == STEPS
    return stage_dir, beat, killed_at, json.loads((stage_dir / REPORT_NAME).read_text())


def _assert_the_survivor_trained_on(stage_dir: Path, beat: heartbeat.Heartbeat, killed_at: float) -> list[int]:
    """Group 0 was never restarted and never lost a step: one attempt, consecutive steps to the end,
    and a pause of at most the lighthouse dropping the dead group (5 s; generous bound)."""
    (survivor,) = _steps(stage_dir).values()
    steps = [s for s, _ in survivor]
    assert steps == list(range(steps[0], STEPS + 1)) and steps[0] <= beat.step
    pause = max(b - a for (_, a), (_, b) in zip(survivor, survivor[1:]) if a >= killed_at - 1.0)
    assert pause < 30.0
    return steps


def _assert_healed(stage_dir: Path, beat: heartbeat.Heartbeat, survivor_steps: list[int], *,
                   back_late: bool = True) -> None:
    """Group 1's second attempt started behind (from group 0's newest checkpoint or the first
    weights) and healed: its first step is the quorum's, one group 0 also took, after the kill; in
    step from then on, both groups end with the same weights, bit for bit. `back_late`: it may have
    been back only once group 0 had finished, resumed from group 0's final checkpoint, with no step
    left to train."""
    healed = _steps(replica_dir(stage_dir, 1)).get(1)
    if healed is None and back_late:
        resumed = [(e.step, e.detail) for e in events.read(replica_dir(stage_dir, 1))
                   if e.kind is EventKind.RESUME and e.attempt == 1]
        assert resumed == [(STEPS, f"from {markers.checkpoint_dir(stage_dir, STEPS)}")]
    else:
        first_step = healed[0][0]
        assert first_step > beat.step and first_step in survivor_steps
        assert [s for s, _ in healed] == list(range(first_step, STEPS + 1))
    digests = [json.loads((replica_dir(stage_dir, i) / RESULT_NAME).read_text())["parameters_sha256"] for i in (0, 1)]
    assert digests[0] is not None and digests[0] == digests[1]


@pytest.mark.slow
def test_a_killed_replica_group_restarts_and_never_stops_the_other(tmp_path, tokens):
    """`make test`'s version, beside other tests on a loaded machine: the restarted group may still
    be starting when the survivor finishes, and is then stopped (nothing is left to heal from);
    either way the stage succeeds and the survivor never waited. When it did catch up, it healed."""
    stage_dir, beat, killed_at, report = _kill_group_one(tmp_path, tokens)
    groups = [(g["replica_id"], g["outcome"], g["num_attempts"]) for g in report["replica_groups"]]
    assert groups in ([(0, "succeeded", 1), (1, "succeeded", 2)], [(0, "succeeded", 1), (1, "stopped", 2)])
    steps = _assert_the_survivor_trained_on(stage_dir, beat, killed_at)
    if groups[1][1] == "succeeded":
        _assert_healed(stage_dir, beat, steps)
    _assert_the_telemetry_counts_both_groups(stage_dir, healed=groups[1][1] == "succeeded")


def _assert_the_telemetry_counts_both_groups(stage_dir: Path, *, healed: bool) -> None:
    """The desk's figures hold group 1's device time and its kill; a group that healed forward
    wasted none of the steps it trained before the kill."""
    groups = events.read_groups(stage_dir)
    held = sum(e.seconds * e.num_devices for log in groups for e in log if e.kind is EventKind.ALLOCATION)
    stage = summarize_stage(groups)
    assert len(groups) == 2 and all(log for log in groups)
    assert stage.device_hours * 3600 >= held * (1 - 1e-12) and held > summarize(groups[0]).device_hours * 3600
    assert stage.num_unplanned_interruptions >= 1  # group 1's kill (group 0 never restarted)
    if healed:
        assert summarize(groups[1]).num_wasted_steps == 0


@pytest.mark.slow
@pytest.mark.long
def test_fsdp2_inside_replica_groups_trains_heals_and_ends_on_one_set_of_weights(tmp_path, tokens):
    """Two groups of two ranks, each group sharding the model with FSDP2: gradients averaged across
    the groups shard by shard, a killed rank's group restarts (its peer rank with it) and heals
    from the shards of the live group's ranks (35 s here; `make test` trains groups of a rank each). A loaded machine may leave the restarted group still starting when the
    survivor finishes, as in `make test`'s version above."""
    stage_dir, beat, killed_at, report = _kill_group_one(tmp_path, tokens, layout=SHARDED_GROUPS, nproc_per_node=4)
    assert report["result"]["layout"]["ran"]["dp_shard"] == 2 and not report["result"]["layout"]["fallbacks"]
    groups = [(g["replica_id"], g["outcome"], g["num_attempts"]) for g in report["replica_groups"]]
    assert groups in ([(0, "succeeded", 1), (1, "succeeded", 2)], [(0, "succeeded", 1), (1, "stopped", 2)])
    steps = _assert_the_survivor_trained_on(stage_dir, beat, killed_at)
    if groups[1][1] == "succeeded":
        _assert_healed(stage_dir, beat, steps)


@pytest.mark.slow
@pytest.mark.long
def test_a_killed_replica_group_restarts_and_heals_while_the_other_trains_on(tmp_path, tokens):
    """Alone on the machine (`make test-long` runs one test at a time), the restarted group is back
    long before the survivor's last step, so it must heal."""
    stage_dir, beat, killed_at, report = _kill_group_one(tmp_path, tokens)
    assert [(g["replica_id"], g["outcome"], g["num_attempts"]) for g in report["replica_groups"]] == [
        (0, "succeeded", 1), (1, "succeeded", 2)]
    _assert_healed(stage_dir, beat, _assert_the_survivor_trained_on(stage_dir, beat, killed_at), back_late=False)
    _assert_the_telemetry_counts_both_groups(stage_dir, healed=True)


def _resumes(folder: Path) -> list[tuple[int, int | None, str]]:
    return [(e.attempt, e.step, e.detail) for e in events.read(folder) if e.kind is EventKind.RESUME]


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "nproc_per_node"), [
    # A rank a group, each half of the batch of 8.
    (Layout(dp_replicate=2, precision="fp32", compile=False, micro_batch_size=4), 2),
    # Two ranks a group that shard the model (FSDP2), from a sharded checkpoint: `make test-long`
    # (two torchruns of two ranks: 45 CPU-seconds on the 2-core VM against 15 for a rank a group).
    pytest.param(SHARDED_GROUPS, 4, marks=pytest.mark.long),
])
def test_every_replica_group_of_a_resumed_stage_starts_from_group_zeros_checkpoint(tmp_path, tokens, layout,
                                                                                  nproc_per_node):
    """A stage resumed with a checkpoint at step 8: group 1 (whose folder holds none) starts from
    group 0's checkpoints too, not from the first weights at step 0, from which it could reach
    group 0's step before group 0 joins and never be healed. Group 0 trains alone while group 1
    starts, so group 1 loads step 8's or a later one; once both train, they train in step and end
    on the same weights."""
    config = worker_config(tmp_path, tokens, num_steps=8, interval_steps=8, replica_timeout_s=10.0,
                           layout=layout)
    first = run_worker(config, nproc=nproc_per_node // 2)
    assert first.returncode == 0, first.stderr[-2000:]
    stage_dir = Path(config.stage_dir)
    checkpoint = markers.checkpoint_dir(stage_dir, 8)
    assert checkpoint.is_dir()
    end = 48
    report = ReplicaStage(worker=replace(config, num_steps=end, replica_groups=2),
                          config=replace(SUPERVISION, nproc_per_node=nproc_per_node, hang_timeout_s=60.0)).run()
    assert report.outcome == "succeeded" and report.result["num_steps"] == end
    assert report.result["layout"]["ran"]["dp_shard"] == layout.dp_shard and not report.result["layout"]["fallbacks"]
    assert _resumes(stage_dir)[-1] == (0, 8, f"from {checkpoint}")
    # The first run's steps, then the resumed ones: from 9, or from a later step healed from group 1
    # where group 1 started first and trained alone meanwhile (from the same checkpoint).
    trained = [s for s, _ in _steps(stage_dir)[0]]
    assert trained[:8] == list(range(1, 9)) and trained[8] >= 9 and trained[8:] == list(range(trained[8], end + 1))
    (_, step, source), = _resumes(replica_dir(stage_dir, 1))
    assert step >= 8 and source == f"from {markers.checkpoint_dir(stage_dir, step)}"
    theirs, ours = _steps(replica_dir(stage_dir, 1)).get(0, []), _steps(stage_dir)[0]
    if theirs:  # on from where it resumed (or from a peer's step it healed to), step by step
        first = theirs[0][0]
        assert first > step and [s for s, _ in theirs] == list(range(first, first + len(theirs)))
    if theirs and theirs[0][1] < ours[-1][1]:  # group 1 trained while group 0 did: in one quorum, in step
        digests = [json.loads((replica_dir(stage_dir, i) / RESULT_NAME).read_text())["parameters_sha256"]
                   for i in (0, 1)]
        assert digests[0] is not None and digests[0] == digests[1]


def test_a_group_about_to_join_waits_for_its_peers_to_load_at_most_the_bound(tmp_path):
    """Before its first quorum: a group that asked before its peers' Managers existed would form a
    quorum of its own and keep it while they, at its step, formed another; one that asked while a
    peer still loaded would wait inside torchft, up to the quorum's timeout."""
    peers = (tmp_path / "a", tmp_path / "b")
    heartbeat.HeartbeatWriter(peers[0], rank=0, attempt=3).beat(-1, heartbeat.JOINING, force=True)
    heartbeat.HeartbeatWriter(peers[1], rank=0, attempt=0).beat(-1, "starting", force=True)  # still loading
    started = time.monotonic()
    assert await_peers(tuple(map(str, peers)), 0.5) == [str(peers[1])]  # b never got further: the bound
    assert 0.5 <= time.monotonic() - started < 5
    threading.Timer(0.3, lambda: heartbeat.HeartbeatWriter(peers[1], rank=0, attempt=0).beat(
        -1, heartbeat.JOINING, force=True)).start()
    looks = []
    started = time.monotonic()
    assert await_peers(tuple(map(str, peers)), 30.0, on_wait=lambda: looks.append(1)) == []
    assert 0.25 <= time.monotonic() - started < 10 and looks
    heartbeat.clear(peers[1])  # its supervisor launches it again
    assert await_peers(tuple(map(str, peers)), 0.2) == [str(peers[1])]
    started = time.monotonic()
    assert await_peers(tuple(map(str, peers)), 30.0, stopped=lambda: True) == [str(peers[1])]  # a stop ends it
    assert time.monotonic() - started < 5
    # A peer already training: the groups' quorum exists, a restarted group joins it behind and heals.
    silent = tmp_path / "gone"
    heartbeat.HeartbeatWriter(peers[1], rank=1, attempt=1).beat(57, "training", force=True)
    started = time.monotonic()
    assert await_peers((str(silent), *map(str, peers)), 30.0) == [] and await_peers((), 30.0) == []
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("ready", [0, 1, 2, 3])
def test_a_peer_group_is_loaded_once_each_of_its_ranks_is(tmp_path, ready):
    """Groups of three ranks: a group's Manager asks for a quorum once all its ranks have, so a
    peer with one rank past loading and two still loading is still loading."""
    peer = tmp_path / "peer"
    for rank in range(3):
        heartbeat.HeartbeatWriter(peer, rank=rank, attempt=0).beat(-1, heartbeat.JOINING if rank < ready else "starting",
                                                                   force=True)
    assert await_peers((str(peer),), 0.1, ranks=3) == ([] if ready == 3 else [str(peer)])
    assert await_peers((str(peer),), 0.1) == ([] if ready else [str(peer)])  # one rank a group: any


def test_a_group_joining_has_the_start_up_bound_not_the_hang_bound(tmp_path, tokens):
    """Its first quorum, a heal from a peer and a first step that compiles come before its first
    training beat."""
    config = worker_config(tmp_path, tokens)
    supervisor = Supervisor(worker=config, config=SupervisorConfig(hang_timeout_s=10, startup_timeout_s=100))
    attempt = SimpleNamespace(launched_at=time.time() - 50)
    quiet = time.time() - 20  # past the hang bound, within the start-up bound

    def beat(phase: str, step: int) -> dict:
        return {0: heartbeat.Heartbeat(rank=0, pid=1, attempt=0, step=step, phase=phase, at=quiet)}

    assert not supervisor._hung(attempt, beat(heartbeat.JOINING, -1))
    assert not supervisor._hung(attempt, beat("starting", -1))
    assert supervisor._hung(attempt, beat("training", 3))
