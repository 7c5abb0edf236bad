"""Loss spike -> proposal -> nothing happens until a person approves; then exactly one restart
from the proposed checkpoint with the offending batches skipped."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.launch import local
from ito_assets.runtime.record import events
from ito_assets.runtime.supervision import heartbeat
from ito_assets.runtime.checkpoint import holds
from ito_assets.runtime.supervision import launch
from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.supervision import proposals
from ito_assets.runtime.supervision.proposals import ProposalState, ProposalStore
from ito_assets.runtime.supervision.spikes import Spike, SpikeConfig, SpikeDetector
from ito_assets.runtime.supervision.supervisor import Supervisor, SupervisorConfig
from runtime_helpers import worker_config


def _noisy_loss(n: int, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(3.0 + 0.02 * rng.standard_normal(n))


def test_the_detector_flags_a_loss_spike_and_not_ordinary_noise():
    detector = SpikeDetector(SpikeConfig(window=50, min_history=20))
    series = _noisy_loss(200)
    assert all(detector.observe(step, loss, 1.0) is None for step, loss in enumerate(series))
    spike = detector.observe(200, 4.5, 1.0)
    assert spike is not None and spike.metric == "loss" and spike.z_score > 6
    assert detector.observe(201, 3.0, 1.0) is None  # the spike did not enter the statistics


def test_gradient_norm_and_non_finite_values_are_spikes_too():
    detector = SpikeDetector(SpikeConfig(window=50, min_history=20))
    for step, loss in enumerate(_noisy_loss(30)):
        detector.observe(step, loss, 1.0 + 0.001 * (step % 3))
    assert detector.observe(30, 3.0, 50.0).metric == "grad_norm"
    assert math.isnan(detector.observe(31, float("nan"), 1.0).value)


def test_a_loss_left_unjudged_is_flagged_only_when_not_finite_and_the_gradient_norm_still_is():
    """RLVR's policy-gradient loss: a large value is no divergence, a NaN or an infinity is."""
    judged, unjudged = (SpikeDetector(SpikeConfig(window=50, min_history=20, judge_loss=j)) for j in (True, False))
    for step, loss in enumerate(_noisy_loss(200)):
        for detector in (judged, unjudged):
            assert detector.observe(step, loss, 1.0) is None
    assert judged.observe(200, 4.5, 1.0).metric == "loss"
    assert unjudged.observe(200, 4.5, 1.0) is None
    assert math.isnan(unjudged.observe(201, float("nan"), 1.0).value)
    assert unjudged.observe(202, float("inf"), 1.0).metric == "loss"
    assert unjudged.observe(203, 3.0, 50.0).metric == "grad_norm"


def test_a_flat_series_needs_the_relative_jump_as_well():
    detector = SpikeDetector(SpikeConfig(window=30, min_history=20))
    for step in range(25):
        detector.observe(step, 2.0 + 1e-6 * (step % 2), 1.0)
    assert detector.observe(25, 2.01, 1.0) is None  # a huge z-score, a 0.5% jump: not a spike


def test_restart_plan_rewinds_to_an_earlier_checkpoint_and_skips_through_the_spike():
    restart, first, end = proposals.plan_restart(
        250, 260, whole_steps=[50, 100, 150, 200, 250], next_positions={150: 155}, rewind_steps=100)
    assert (restart, first, end) == (150, 155, 261)
    assert proposals.plan_restart(30, 29, whole_steps=[], next_positions={}, rewind_steps=100) == (0, 0, 30)


def _spike() -> Spike:
    return Spike(step=40, metric="loss", value=9.0, mean=3.0, std=0.1)


def test_state_machine_pending_to_approved_or_rejected_once(tmp_path):
    store = ProposalStore(tmp_path)
    one = store.add(proposals.propose(_spike(), run_key="r", stage="pretraining", restart_from_step=16,
                                      skip_first=16, skip_end=41))
    two = store.add(proposals.propose(_spike(), run_key="r", stage="pretraining", restart_from_step=16,
                                      skip_first=16, skip_end=41))
    assert one.state is ProposalState.PENDING and proposals.approved_restart(tmp_path) is None
    assert proposals.decide(tmp_path, one.proposal_id, approve=True, actor="desk:alice").state is ProposalState.APPROVED
    assert proposals.decide(tmp_path, two.proposal_id, approve=False, actor="desk:bob").state is ProposalState.REJECTED
    with pytest.raises(ItoError) as caught:
        proposals.decide(tmp_path, one.proposal_id, approve=False, actor="desk:mallory")
    assert caught.value.code is ErrorCode.PROPOSAL_ALREADY_DECIDED
    with pytest.raises(ItoError) as caught:
        proposals.decide(tmp_path, "spk_ffffffffffffffff", approve=True, actor="desk:alice")
    assert caught.value.code is ErrorCode.PROPOSAL_NOT_FOUND
    assert proposals.skip_ranges(tmp_path) == ((16, 41),)


def test_the_supervisor_restarts_nothing_until_the_desk_approves(tmp_path, tokens):
    config = worker_config(tmp_path, tokens)
    stage_dir = Path(config.stage_dir)
    for step in (8, 16, 24):  # three whole checkpoints, as if the stage had reached step 24
        folder = markers.checkpoint_dir(stage_dir, step)
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(b"m")
        markers.write_marker(folder, step)
    supervisor = Supervisor(worker=config, config=SupervisorConfig(hang_timeout_s=60, poll_interval_s=0.1, grace_s=2))
    attempt = local.start([["sleep", "60"]], number=0, log_path=tmp_path / "attempt.log",
                          worker_module=launch.WORKER_MODULE)
    heartbeat.HeartbeatWriter(Path(config.heartbeat_dir), rank=0, attempt=0).beat(24, "training", force=True)
    proposal = ProposalStore(stage_dir).add(proposals.propose(
        _spike(), run_key=config.run_key, stage=config.stage, restart_from_step=8, skip_first=8, skip_end=25))
    holds.hold(stage_dir, 8, proposal.proposal_id)

    for _ in range(5):
        assert supervisor._poll(attempt).kind is None  # pending: the worker keeps training
        time.sleep(0.05)
    assert attempt.exit_code() is None

    proposals.decide(stage_dir, proposal.proposal_id, approve=True, actor="desk:alice")
    watch = supervisor._poll(attempt)
    assert watch.kind == "spike_restart" and watch.proposal_id == proposal.proposal_id
    fault = supervisor._interrupt(attempt, watch)
    assert fault.planned and attempt.exit_code() is not None
    assert [markers.step_of(p) for p in markers.candidates(stage_dir)] == [8]  # 16 and 24 set aside
    assert sorted(p.name for p in stage_dir.glob("discarded-*")) == [
        f"discarded-step-000000016-{proposal.proposal_id}", f"discarded-step-000000024-{proposal.proposal_id}"]
    assert ProposalStore(stage_dir).get(proposal.proposal_id).state is ProposalState.APPLIED
    assert proposals.approved_restart(stage_dir) is None and holds.held_steps(stage_dir) == set()
    assert proposals.skip_ranges(stage_dir) == ((8, 25),)


def test_a_real_worker_proposes_on_a_spike_and_keeps_training(tmp_path, tokens):
    """A detector tuned to fire on ordinary noise (z 2 over 10 steps) makes the real worker propose;
    the stage still trains to its end in one attempt: the proposal waits for the desk."""
    sensitive = SpikeConfig(window=10, z_threshold=2.0, min_ratio=1.0, min_history=5)
    config = worker_config(tmp_path, tokens, num_steps=100, spikes=sensitive, spike_rewind_steps=8)
    report = Supervisor(worker=config, config=SupervisorConfig(hang_timeout_s=60, startup_timeout_s=90,
                                                               poll_interval_s=0.2, grace_s=3)).run()
    assert report.outcome == "succeeded" and report.num_attempts == 1 and report.result["num_steps"] == 100
    stage_dir = Path(config.stage_dir)
    (proposal,) = ProposalStore(stage_dir).all()  # one pending at a time: later spikes are only logged
    assert proposal.state is ProposalState.PENDING and proposal.skip_end > proposal.skip_first
    assert proposal.restart_from_step < proposal.spike_step
    assert proposal.restart_from_step > 0 and holds.held_steps(stage_dir) == {proposal.restart_from_step}
    assert markers.checkpoint_dir(stage_dir, proposal.restart_from_step).is_dir()  # kept through pruning

    proposals.decide(stage_dir, proposal.proposal_id, approve=True, actor="desk:alice")
    rerun = Supervisor(worker=config, config=SupervisorConfig(hang_timeout_s=60, startup_timeout_s=90,
                                                              poll_interval_s=0.2, grace_s=3)).run()
    assert rerun.outcome == "succeeded" and rerun.result["num_steps"] == 100
    resumed = [(e.attempt, e.step) for e in events.read(stage_dir) if e.kind is events.EventKind.RESUME]
    assert resumed[-1] == (1, proposal.restart_from_step)  # rewound to the proposal's checkpoint
    assert ProposalStore(stage_dir).get(proposal.proposal_id).state is ProposalState.APPLIED
    attempt = json.loads((stage_dir / "attempt-1.json").read_text())
    assert attempt["skip_ranges"] == [[proposal.skip_first, proposal.skip_end]]
