"""A checkpoint save that fails for its storage on one rank: every rank learns of it at the next
save, its partial folder is removed, the previous whole checkpoint stays listed and training goes
on; when the last save fails, the attempt ends with STORAGE_FULL in its log, not a traceback."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from ito_assets.runtime.checkpoint import markers, registry
from ito_assets.runtime.checkpoint.saver import CheckpointConfig, Checkpointer, storage_cause
from ito_assets.runtime.supervision import heartbeat
from ito_assets.runtime.stage.config import RESULT_NAME
from ito_assets.runtime.worker import main as worker_main
from ito_assets.runtime.worker.main import EXIT_STORAGE, StageWorker
from ito_assets.training.layout import Layout
from runtime_helpers import TRIALS, worker_config

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_the_storage_cause_is_found_inside_dcps_wrapper():
    full = OSError(errno.ENOSPC, "No space left on device")
    assert storage_cause(full) is full
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = full
    assert storage_cause(wrapped) is full
    assert storage_cause(CheckpointException("save", {1: full})) is full
    assert storage_cause(RuntimeError("a bug, not the disk")) is None


# --- slow storage: the previous save still writing at the next one's step --------------------------------


def test_a_save_that_waits_for_the_previous_one_ticks_meanwhile(tmp_path, monkeypatch):
    """The wait for a save still writing blocks the training thread; before the fix it sent no
    heartbeat, so storage slower than the hang bound had the supervisor end a healthy attempt as hung."""
    written = threading.Event()
    write_marker = markers.write_marker

    def slow_marker(*args, **kwargs):  # step 5's save ends only once the wait for it has ticked
        written.wait(timeout=10)
        return write_marker(*args, **kwargs)

    monkeypatch.setattr(markers, "write_marker", slow_marker)
    config = CheckpointConfig(directory=tmp_path, interval_steps=5, keep_last=3)
    saver = Checkpointer(config, process_group=None, rank=0)
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(1)
        written.set()

    saver.save(5, {"model": {"w": torch.zeros(4)}}, on_tick=tick, tick_s=0.01)
    assert ticks == []  # nothing in flight: no wait, no tick
    saver.save(10, {"model": {"w": torch.ones(4)}}, on_tick=tick, tick_s=0.01)
    assert ticks and written.is_set()
    num_ticks = len(ticks)
    saver.wait()
    saver.save(15, {"model": {"w": torch.ones(4)}}, on_tick=tick, tick_s=0.01)
    assert len(ticks) == num_ticks  # the previous save already done: no tick
    saver.close()
    assert [r.step for r in registry.read(tmp_path)] == [5, 10, 15]


def test_the_worker_beats_checkpointing_while_its_save_waits(monkeypatch):
    beats: list[tuple[int, str, bool]] = []

    def save(step, state, *, spike_history, on_tick):
        on_tick()
        on_tick()

    worker = SimpleNamespace(
        heartbeat=SimpleNamespace(beat=lambda step, phase, force=False: beats.append((step, phase, force))),
        checkpointer=SimpleNamespace(save=save), spikes=SimpleNamespace(state=lambda: {}),
        model=None, optimizer=None, rank=0, saved_step=-1)
    monkeypatch.setattr(worker_main.train_state, "capture", lambda *args, **kwargs: {})
    StageWorker.save(worker, 16, 128)
    assert beats == [(16, "checkpointing", True), (16, "checkpointing", False), (16, "checkpointing", False)]
    assert worker.saved_step == 16


def _run(tmp_path: Path, tokens, failing: str):
    config = worker_config(tmp_path, tokens, num_steps=12, interval_steps=4, layout=Layout(
        dp_replicate=2, precision="fp32", compile=False, micro_batch_size=4))
    path = tmp_path / "config.json"
    path.write_text(config.to_json())
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}, "ITO_ENOSPC_AT_STEPS": failing}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(Path(__file__).with_name("save_fault_driver.py")), "--config", str(path)],
                          env=env, capture_output=True, text=True, timeout=180)
    return config, done


@pytest.mark.slow
@pytest.mark.parametrize("trial", TRIALS)
def test_a_failed_save_on_one_rank_is_dropped_by_every_rank_and_training_goes_on(tmp_path, tokens, trial):
    config, done = _run(tmp_path, tokens, "8")
    assert done.returncode == 0, done.stderr[-3000:]
    stage = Path(config.stage_dir)
    assert not markers.checkpoint_dir(stage, 8).exists()  # the partial folder is gone
    assert [r.step for r in registry.read(stage)] == [4, 12]  # step 4 stayed listed, 12 is the final one
    assert (stage / RESULT_NAME).exists()
    log = Path(config.metrics_path).read_text()
    assert "the checkpoint of step 8 failed (STORAGE_FULL: No space left on device)" in log


@pytest.mark.slow
@pytest.mark.parametrize("trial", TRIALS)
def test_a_failed_last_save_ends_the_attempt_with_the_storages_code(tmp_path, tokens, trial):
    config, done = _run(tmp_path, tokens, "12")
    assert done.returncode != 0 and f"exitcode  : {EXIT_STORAGE}" in done.stderr
    assert "STORAGE_FULL: the checkpoint of step 12 could not be written (No space left on device)" in done.stderr
    stage = Path(config.stage_dir)
    assert not markers.checkpoint_dir(stage, 12).exists() and not (stage / RESULT_NAME).exists()
    assert [r.step for r in registry.read(stage)] == [4, 8]  # the newest whole checkpoints stay for the restart
    # torchrun exits 1 whatever its workers' code: each rank's heartbeat tells the supervisor why.
    beats = heartbeat.read_all(Path(config.heartbeat_dir))
    assert {(b.rank, b.phase, b.detail) for b in beats.values()} == {
        (0, heartbeat.STORAGE_FAILED, "STORAGE_FULL"), (1, heartbeat.STORAGE_FAILED, "STORAGE_FULL")}
