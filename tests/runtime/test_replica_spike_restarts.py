"""A spike restart the desk approves restarts every replica group, not group 0 alone: group 0's
supervisor sets the later checkpoints aside, the other groups' supervisors follow it, and every
group resumes from the proposal's checkpoint and skips its batches. Were group 0 alone to rewind,
it would heal forward from a peer that did not, and the rewind would be undone."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from ito_assets.launch import local
from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.record.goodput import summarize
from ito_assets.runtime.stage.config import RESULT_NAME
from ito_assets.runtime.supervision import launch, proposals
from ito_assets.runtime.supervision.proposals import ProposalState, ProposalStore
from ito_assets.runtime.supervision.replicas import ReplicaStage, group_worker, replica_dir
from ito_assets.runtime.supervision.spikes import Spike, SpikeConfig
from ito_assets.runtime.supervision.supervisor import Supervisor, SupervisorConfig
from runtime_helpers import worker_config

QUICK = SupervisorConfig(hang_timeout_s=60, poll_interval_s=0.05, grace_s=2)


def _approved(stage_dir: Path, config, restart: int) -> str:
    spike = Spike(step=40, metric="loss", value=9.0, mean=3.0, std=0.1)
    proposal = ProposalStore(stage_dir).add(proposals.propose(
        spike, run_key=config.run_key, stage=config.stage, restart_from_step=restart, skip_first=restart,
        skip_end=41))
    proposals.decide(stage_dir, proposal.proposal_id, approve=True, actor="desk:alice")
    return proposal.proposal_id


def _sleeping(tmp_path: Path, number: int):
    return local.start([["sleep", "60"]], number=number, log_path=tmp_path / f"attempt-{number}.log",
                       worker_module=launch.WORKER_MODULE)


def test_a_follower_group_restarts_for_each_restart_group_zero_applies_and_only_once(tmp_path, tokens):
    config = worker_config(tmp_path, tokens, replica_groups=2)
    stage_dir = Path(config.stage_dir)
    for step in (8, 16, 24):  # group 0's whole checkpoints
        folder = markers.checkpoint_dir(stage_dir, step)
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(b"m")
        markers.write_marker(folder, step)
    leader, follower = (Supervisor(worker=group_worker(config, i), config=QUICK, lock=False) for i in (0, 1))
    assert leader.leads_restarts and not follower.leads_restarts
    assert follower.proposals_dir == stage_dir and follower.stage_dir == replica_dir(stage_dir, 1)

    past = _approved(stage_dir, config, 24)
    follower.stage_dir.mkdir(parents=True)  # as its supervisor's `run` makes it
    leader._apply_approved(0)  # carried out before the follower started: already in what it resumes from
    follower._apply_approved(0)
    attempt = _sleeping(tmp_path, 0)
    try:
        assert follower._poll(attempt).kind is None

        # Group 0's supervisor applies the next one before the follower's poll sees it approved.
        ordered = _approved(stage_dir, config, 8)
        leader._apply_approved(1)
        (follower.stage_dir / RESULT_NAME).write_text("{}")  # an earlier run's: the stage trains again
        watch = follower._poll(attempt)
        assert watch.kind == "spike_restart" and watch.proposal_id == ordered
        fault = follower._interrupt(attempt, watch)
        assert fault.planned and attempt.exit_code() is not None
        assert not (follower.stage_dir / RESULT_NAME).exists()
    finally:
        attempt.terminate(set(), grace_s=1)
    again = _sleeping(tmp_path, 1)
    try:
        assert follower._poll(again).kind is None  # followed once
    finally:
        again.terminate(set(), grace_s=1)
    # The follower set nothing aside and applied nothing: group 0's supervisor did.
    assert [markers.step_of(p) for p in markers.candidates(stage_dir)] == [8]
    assert not list(follower.stage_dir.glob("discarded-*"))
    assert [p.state for p in ProposalStore(stage_dir).all()] == [ProposalState.APPLIED] * 2
    assert {past, ordered} == {p.proposal_id for p in proposals.restarts(stage_dir)}
    assert ProposalStore(follower.stage_dir).all() == []
    # The telemetry's record of each restart, once per group, with the first attempt on the rewound
    # lineage: the follower's attempt 0 for the one applied before it started, 1 for the next.
    rewinds = lambda folder: [(e.attempt, e.step, e.detail) for e in events.read(folder) if e.kind is EventKind.REWIND]
    assert rewinds(follower.stage_dir) == [(0, 24, past), (1, 8, ordered)]
    assert rewinds(stage_dir) == [(0, 24, past), (1, 8, ordered)]


def test_a_follower_ends_its_attempt_only_for_a_restart_group_zero_applied(tmp_path, tokens):
    """An approval alone leaves it training: group 0 may never apply it (it finished first), and a
    follower that restarted before the checkpoints were set aside would resume after the spike."""
    config = worker_config(tmp_path, tokens, replica_groups=2)
    stage_dir = Path(config.stage_dir)
    leader, follower = (Supervisor(worker=group_worker(config, i), config=QUICK, lock=False) for i in (0, 1))
    follower.stage_dir.mkdir(parents=True)
    follower._apply_approved(0)
    attempt = _sleeping(tmp_path, 0)
    try:
        proposal = _approved(stage_dir, config, 0)
        assert follower._poll(attempt).kind is None and not follower.followed(proposal)
        follower._apply_approved(0)  # between its attempts too
        assert not follower.followed(proposal)
        leader._apply_approved(1)
        watch = follower._poll(attempt)
        assert watch.kind == "spike_restart" and watch.proposal_id == proposal
        follower._interrupt(attempt, watch)
        assert follower.followed(proposal)
    finally:
        attempt.terminate(set(), grace_s=1)


def test_group_zero_calls_for_its_followers_after_the_checkpoints_are_set_aside(tmp_path, tokens, monkeypatch):
    """Group 0's supervisor alone is given the wait (the replica stage's groups), and calls it once
    the proposal is applied; it marks the proposal applied only once the later checkpoints are set
    aside: a follower acts on the mark and resumes from the newest it finds."""
    config = worker_config(tmp_path, tokens, replica_groups=2, replica_timeout_s=10.0)
    stage = ReplicaStage(worker=config, config=replace(QUICK, nproc_per_node=2))
    groups = stage._build_groups("http://127.0.0.1:1")
    assert groups[0].supervisor.after_apply == stage._await_followers
    assert groups[1].supervisor.after_apply is None and not groups[1].thread.is_alive()

    stage_dir = Path(config.stage_dir)
    for step in (8, 16):
        folder = markers.checkpoint_dir(stage_dir, step)
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(b"m")
        markers.write_marker(folder, step)
    seen = []

    def after_apply(proposal_id: str) -> None:
        seen.append((proposal_id, ProposalStore(stage_dir).get(proposal_id).state,
                     [markers.step_of(p) for p in markers.candidates(stage_dir)]))

    marked = []
    mark_applied = ProposalStore.mark_applied

    def recording(store, proposal_id):
        marked.append([markers.step_of(p) for p in markers.candidates(stage_dir)])
        return mark_applied(store, proposal_id)

    monkeypatch.setattr(ProposalStore, "mark_applied", recording)
    leader = Supervisor(worker=group_worker(config, 0), config=QUICK, lock=False, after_apply=after_apply)
    proposal = _approved(stage_dir, config, 8)
    leader._apply_approved(0)
    assert marked == [[8]] and seen == [(proposal, ProposalState.APPLIED, [8])]


def _resumes(folder: Path) -> dict[int, tuple[int | None, str]]:
    return {e.attempt: (e.step, e.detail) for e in events.read(folder) if e.kind is EventKind.RESUME}


@pytest.mark.slow
@pytest.mark.long  # `make test`: a real worker's proposal (test_spike_proposals) and the followers' rules here
def test_an_approved_spike_restart_rewinds_every_replica_group_to_one_checkpoint(tmp_path, tokens):
    """Two real one-rank groups; a detector tuned to fire on ordinary noise makes group 0 propose,
    the desk approves at once: both groups' second attempts resume from the proposal's checkpoint,
    skip its batches, and end on the same weights."""
    # Spikes after step 20 at the earliest: a checkpoint to rewind to exists (else a restart from
    # the first weights, which proves less).
    sensitive = SpikeConfig(window=20, z_threshold=2.0, min_ratio=1.0, min_history=20)
    config = worker_config(tmp_path, tokens, num_steps=300, interval_steps=8, spikes=sensitive,
                           spike_rewind_steps=8, replica_groups=2, replica_timeout_s=10.0)
    stage_dir = Path(config.stage_dir)
    supervision = SupervisorConfig(nproc_per_node=2, hang_timeout_s=60.0, startup_timeout_s=90.0,
                                   poll_interval_s=0.2, grace_s=5.0, max_restarts=2)
    stage = ReplicaStage(worker=config, config=supervision)
    reports = []
    thread = threading.Thread(target=lambda: reports.append(stage.run()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 180
    while not (pending := ProposalStore(stage_dir).pending()):
        assert time.monotonic() < deadline and thread.is_alive(), "no proposal before the stage ended"
        time.sleep(0.05)
    proposal = proposals.decide(stage_dir, pending[0].proposal_id, approve=True, actor="desk:alice")
    thread.join(timeout=300)
    (report,) = reports
    assert report.outcome == "succeeded" and report.result["num_steps"] == 300

    assert ProposalStore(stage_dir).get(proposal.proposal_id).state is ProposalState.APPLIED
    restart = proposal.restart_from_step
    assert restart > 0 and _resumes(stage_dir)[1] == (restart, f"from {markers.checkpoint_dir(stage_dir, restart)}")
    # Group 1 on the rewound lineage: the proposal's checkpoint, or a later one group 0 saved after
    # it while group 1 started; never one from before the rewind (those were set aside).
    step, source = _resumes(replica_dir(stage_dir, 1))[1]
    assert restart <= step and source == f"from {markers.checkpoint_dir(stage_dir, step)}"
    assert step < report.result["num_steps"] and "discarded" not in source
    for group in (0, 1):
        attempt = json.loads((replica_dir(stage_dir, group) / "attempt-1.json").read_text())
        assert attempt["skip_ranges"] == [[proposal.skip_first, proposal.skip_end]]
    supervision_report = json.loads((stage_dir / "supervision.json").read_text())
    assert [(g["replica_id"], g["outcome"]) for g in supervision_report["replica_groups"]] == [
        (0, "succeeded"), (1, "succeeded")]
    assert supervision_report["parameters_agree"] is True
    # The telemetry's record of the rewind, once in each group's log: every step either group trained
    # past the restart step before attempt 1 is wasted, whatever group 1 resumed from.
    for group in (0, 1):
        log = events.read(replica_dir(stage_dir, group))
        assert [(e.attempt, e.step, e.detail) for e in log if e.kind is EventKind.REWIND] == [
            (1, restart, proposal.proposal_id)]
        trained_past = {e.step for e in log if e.kind is EventKind.STEP and e.attempt == 0 and e.step > restart}
        assert summarize(log).num_wasted_steps >= len(trained_past) > 0


class _Alive:
    """A group thread that runs until told (its supervisor is never started here)."""

    def __init__(self):
        self.done = threading.Event()

    def is_alive(self) -> bool:
        return not self.done.is_set()


def test_group_zero_launches_again_only_once_the_other_groups_ended_their_attempts(tmp_path, tokens):
    """Bounded by a poll interval and a grace period: a follower that never answers (its
    supervisor busy elsewhere) delays group 0 by no more; a finished group not at all."""
    config = worker_config(tmp_path, tokens, replica_groups=3, batch_size=9, replica_timeout_s=10.0)
    stage = ReplicaStage(worker=config, config=replace(QUICK, poll_interval_s=0.1, grace_s=1.9))
    followers = [Supervisor(worker=group_worker(config, i), config=QUICK, lock=False) for i in (1, 2)]
    for follower in followers:
        follower.stage_dir.mkdir(parents=True)  # as its supervisor's `run` makes it
    stage.groups = [object(), *(SimpleNamespace(supervisor=f, thread=_Alive()) for f in followers)]

    proposal = _approved(Path(config.stage_dir), config, 0)
    ProposalStore(Path(config.stage_dir)).mark_applied(proposal)
    threading.Timer(0.2, followers[0]._apply_approved, args=(1,)).start()
    threading.Timer(0.3, followers[1]._apply_approved, args=(1,)).start()
    started = time.monotonic()
    stage._await_followers(proposal)
    assert 0.25 <= time.monotonic() - started < 1.9 and all(f.followed(proposal) for f in followers)

    stuck = _approved(Path(config.stage_dir), config, 0)
    ProposalStore(Path(config.stage_dir)).mark_applied(stuck)
    started = time.monotonic()
    stage._await_followers(stuck)  # nobody follows: the bound
    assert time.monotonic() - started >= 2.0

    for group in stage.groups[1:]:
        group.thread.done.set()
    started = time.monotonic()
    stage._await_followers(stuck)  # groups that ended are not waited for
    assert time.monotonic() - started < 1.0
