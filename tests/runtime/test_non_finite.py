"""A step whose loss or gradient is not finite is not applied: the weights and optimizer state stay
as they were, the step counts as wasted, a restart is proposed at once and the ranks wait for the
desk instead of training on. The spike detector's values travel in the checkpoint."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.record import events, goodput
from ito_assets.runtime.stage.config import RESULT_NAME
from ito_assets.runtime.supervision import heartbeat, proposals
from ito_assets.runtime.supervision.spikes import SpikeConfig, SpikeDetector
from ito_assets.runtime.worker import execution
from ito_assets.runtime.worker.step import train_step
from ito_assets.training.layout import Layout
from ito_assets.training.model import build_model, config_by_name
from ito_assets.training.trainer import TrainConfig, build_optimizer
from runtime_helpers import TRIALS, worker_config

CONFIG = TrainConfig(num_steps=4, batch_size=4, sequence_length=16)


def _step(poison: bool):
    model = build_model(config_by_name("micro"), seed=0)
    run = execution.prepare(model, Layout(precision="fp32", compile=False, micro_batch_size=4), (),
                            device=torch.device("cpu"), world_size=1)
    optimizer = build_optimizer(model, CONFIG)
    if poison:
        forward = run.parallel.forward
        run.parallel.forward = lambda x, y: forward(x, y) * float("nan")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tokens = torch.randint(0, 512, (4, 17), generator=torch.Generator().manual_seed(0))
    loss, norm, _, applied = train_step(run, model, optimizer, tokens[:, :-1], tokens[:, 1:], 1, CONFIG)
    changed = any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    return loss, norm, applied, changed, optimizer


def test_a_non_finite_step_changes_no_weight_and_no_optimizer_state():
    loss, norm, applied, changed, optimizer = _step(poison=True)
    assert math.isnan(loss) and not applied and not changed
    assert all(not state for state in optimizer.state.values())  # no moment, no step count
    loss, norm, applied, changed, _ = _step(poison=False)
    assert math.isfinite(loss) and applied and changed


def test_a_step_not_applied_is_wasted_time():
    log = [events.Event(kind=events.EventKind.STEP, at=1.0, step=1, seconds=2.0, loss=5.0),
           events.Event(kind=events.EventKind.STEP, at=2.0, step=2, seconds=3.0, loss=math.nan,
                        detail=events.NOT_APPLIED)]
    summary = goodput.summarize(log)
    assert (summary.num_wasted_steps, summary.wasted_step_seconds, summary.productive_seconds) == (1, 3.0, 2.0)


def test_the_detectors_values_round_trip():
    detector = SpikeDetector(SpikeConfig(window=4, min_history=2))
    for step, value in enumerate([1.0, 2.0, 3.0, 4.0, 5.0], start=1):
        detector.observe(step, value, value / 10)
    again = SpikeDetector(SpikeConfig(window=4, min_history=2))
    again.restore(json.loads(json.dumps(detector.state())))
    assert again.state() == detector.state() == {"loss": [2.0, 3.0, 4.0, 5.0], "grad_norm": [0.2, 0.3, 0.4, 0.5]}
    assert again.observe(6, 50.0, 0.6) is not None  # judged against the restored values at once


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("trial", TRIALS)
def test_a_nan_pauses_the_ranks_until_the_desk_decides(tmp_path, tokens, trial):
    config = worker_config(tmp_path, tokens, num_steps=12, interval_steps=4, layout=Layout(
        dp_replicate=2, precision="fp32", compile=False, micro_batch_size=4))
    path = tmp_path / "config.json"
    path.write_text(config.to_json())
    driver = Path(__file__).with_name("nan_driver.py")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}, "ITO_NAN_AT_STEP": "7"}
    process = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                                str(driver), "--config", str(path)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    stage = Path(config.stage_dir)
    try:
        store = proposals.ProposalStore(stage)
        deadline = time.monotonic() + 120
        while not store.pending() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
        (proposal,) = store.pending()  # proposed at once, at the step that went wrong
        assert proposal.spike_step == 7 and proposal.metric == "loss"
        time.sleep(3)  # the ranks wait: no step after the broken one, heartbeats say so
        steps = [e.step for e in events.read(stage) if e.kind is events.EventKind.STEP]
        assert max(steps) == 7 and process.poll() is None
        beats = heartbeat.read_all(Path(config.heartbeat_dir), attempt=0)
        assert {b.phase for b in beats.values()} == {"awaiting_desk"} and len(beats) == 2
        assert markers.read_marker(markers.checkpoint_dir(stage, 4)).spike_history["loss"]  # kept at step 4
        store.decide(proposal.proposal_id, approve=False, actor="desk")  # rejected: training goes on
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, stderr[-3000:]
    log = events.read(stage)
    broken = [e for e in log if e.kind is events.EventKind.STEP and e.step == 7]
    assert [e.detail for e in broken] == [events.NOT_APPLIED]
    assert all(math.isfinite(e.loss) for e in log if e.kind is events.EventKind.STEP and e.step != 7)
    assert json.loads((stage / RESULT_NAME).read_text())["num_steps"] == 12
    assert goodput.summarize(log).num_wasted_steps == 1
