"""The stage worker against hostile storage: its own appends (events, the checkpoint registry,
metrics and log lines) on a full disk or past a file-size limit end the attempt with the storage's
code and exit status, not a traceback; a checkpoint folder whose marker lies about it is never
proposed as a spike restart's starting point; and an eval suite changed since the stage was planned
is refused with the suite's code."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.runtime.checkpoint import holds, markers, registry
from ito_assets.runtime.checkpoint.registry import CheckpointRecord
from ito_assets.runtime.checkpoint.saver import CheckpointConfig, Checkpointer
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.supervision import heartbeat, proposals
from ito_assets.runtime.supervision.heartbeat import HeartbeatWriter
from ito_assets.runtime.supervision.proposals import ProposalStore
from ito_assets.runtime.supervision.spikes import Spike
from ito_assets.runtime.worker import main, reporting
from ito_assets.runtime.worker.main import EXIT_STORAGE, StageWorker
from ito_assets.runtime.worker.reporting import JsonlReporter
from runtime_helpers import copied_under_a_newer_step, shard_cut_short, shard_removed, worker_config

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

OURS = {"run_key": "run-a", "stage": "pretrain"}
CODES = {errno.ENOSPC: ErrorCode.STORAGE_FULL, errno.EFBIG: ErrorCode.CHECKPOINT_STORAGE_INVALID}


def _failing(number: int):
    def append_line(*args, **kwargs) -> None:
        raise OSError(number, os.strerror(number))

    return append_line


def _worker(tmp_path: Path, checkpointer=None) -> StageWorker:
    """Rank 0's records only: no model, no process group."""
    worker = object.__new__(StageWorker)
    worker.rank, worker.reached, worker.stage_dir = 0, 7, tmp_path / "stage"
    worker.stage_dir.mkdir(exist_ok=True)
    worker.config = SimpleNamespace(attempt=0, stage="pretrain", run_key=OURS["run_key"], spike_rewind_steps=2)
    worker.heartbeat = HeartbeatWriter(tmp_path / "heartbeats", rank=0, attempt=0)
    worker.reporter = JsonlReporter(tmp_path / "metrics.jsonl")
    worker.checkpointer = checkpointer
    worker.next_positions = {}
    worker.owner = lambda: OURS
    return worker


def _assert_storage_failure(raised: pytest.ExceptionInfo, tmp_path: Path, number: int) -> None:
    assert raised.value.code is CODES[number] and os.strerror(number) in raised.value.message
    (beat,) = heartbeat.read_all(tmp_path / "heartbeats").values()  # the supervisor's cue: torchrun exits 1
    assert (beat.phase, beat.detail, beat.step) == (heartbeat.STORAGE_FAILED, CODES[number].value, 7)


# --- the worker's own appends on a full disk -------------------------------------------------------------


def _checkpoint_recorded(worker: StageWorker) -> None:
    """A finished save's event, then its metrics line."""
    worker.checkpointer = SimpleNamespace(take_failures=lambda: [])
    worker.collect([CheckpointRecord(step=7, path="step-000000007", num_bytes=64, blocking_seconds=0.1,
                                     total_seconds=0.2, metadata_sha256="0" * 64, completed_at=1.0)])


@pytest.mark.parametrize("number", sorted(CODES))
@pytest.mark.parametrize("full, append", [
    (events, lambda worker: worker.event(EventKind.STEP, step=7, seconds=0.1, loss=3.0)),
    (reporting, _checkpoint_recorded),
    (reporting, lambda worker: worker.log("a line")),
], ids=["event", "metrics", "log"])
def test_an_append_on_a_full_disk_is_the_storages_code_not_a_traceback(tmp_path, monkeypatch, number, full, append):
    monkeypatch.setattr(full, "append_line", _failing(number))
    worker = _worker(tmp_path)
    with pytest.raises(ItoError) as raised:
        append(worker)
    _assert_storage_failure(raised, tmp_path, number)


@pytest.mark.parametrize("number", sorted(CODES))
def test_the_registry_append_of_a_finished_save_on_a_full_disk_is_the_storages_code(tmp_path, monkeypatch, number):
    checkpointer = Checkpointer(CheckpointConfig(directory=tmp_path / "stage", interval_steps=5, keep_last=2,
                                                 owner=OURS), process_group=None, rank=0)
    worker = _worker(tmp_path, checkpointer)
    checkpointer.save(7, {"model": {"w": torch.ones(4, 4)}})
    monkeypatch.setattr(registry, "append_line", _failing(number))
    with pytest.raises(ItoError) as raised:
        worker.drain(7)  # waits for the save, whose registry line cannot be appended
    _assert_storage_failure(raised, tmp_path, number)


def test_the_worker_exits_with_the_storage_status_and_its_code_on_stderr(tmp_path, tokens, monkeypatch, capsys):
    config = worker_config(tmp_path, tokens)
    monkeypatch.delenv(reporting.PIPES_CONTEXT_ENV_VAR, raising=False)  # the JSONL reporter
    monkeypatch.setattr(main.distributed, "init", lambda timeout: SimpleNamespace(rank=0))
    monkeypatch.setattr(main.distributed, "shutdown", lambda: None)

    def construct(worker, config, group, reporter):  # rank 0's records only: no model
        worker.__dict__.update(_worker(tmp_path).__dict__, config=config, stage_dir=Path(config.stage_dir))
        worker.reporter = reporter

    monkeypatch.setattr(StageWorker, "__init__", construct)
    monkeypatch.setattr(StageWorker, "run", lambda worker: worker.event(EventKind.STARTUP, seconds=0.0) or 0)
    monkeypatch.setattr(events, "append_line", _failing(errno.ENOSPC))
    Path(config.stage_dir).mkdir(parents=True)
    assert main.main(["--config", config.to_json()]) == EXIT_STORAGE
    assert capsys.readouterr().err.strip() == "STORAGE_FULL: the stage's events could not be written (No space left on device)"


@pytest.mark.parametrize("number", sorted(CODES))
def test_the_stages_result_on_a_full_disk_is_the_storages_code(tmp_path, monkeypatch, number):
    worker = _worker(tmp_path)
    worker.__dict__.update(writes_checkpoints=False, replicas=None, step_seconds=[], drain=lambda step: None,
                           trained_with=dict, group=SimpleNamespace(device=torch.device("cpu")))
    monkeypatch.setattr(main, "write_atomic", _failing(number))
    with pytest.raises(ItoError) as raised:
        worker.finish(7, 0)
    _assert_storage_failure(raised, tmp_path, number)


# --- spike proposals: only an intact checkpoint is a restart point ---------------------------------------


def _save(stage: Path, steps) -> None:
    saver = Checkpointer(CheckpointConfig(directory=stage, interval_steps=5, keep_last=5, owner=OURS),
                         process_group=None, rank=0)
    for step in steps:
        saver.save(step, {"model": {"w": torch.full((8, 8), float(step))}})
    saver.close()


def _propose(worker: StageWorker) -> proposals.ProposedAction:
    worker.log = lambda message: None
    StageWorker.propose(worker, Spike(step=20, metric="loss", value=9.0, mean=3.0, std=0.1), 20)
    (proposal,) = ProposalStore(worker.stage_dir).all()
    return proposal


@pytest.mark.parametrize("damage", [copied_under_a_newer_step, shard_removed, shard_cut_short])
def test_a_folder_whose_marker_lies_is_never_proposed_as_the_restart_point(tmp_path, damage):
    worker = _worker(tmp_path)
    _save(worker.stage_dir, [5] if damage is copied_under_a_newer_step else [5, 10])
    damage(worker.stage_dir)
    assert markers.read_marker(markers.checkpoint_dir(worker.stage_dir, 10)) is not None  # it still reads
    proposal = _propose(worker)
    assert proposal.restart_from_step == 5 and holds.held_steps(worker.stage_dir) == {5}


def test_an_intact_newer_checkpoint_is_still_the_restart_point(tmp_path):
    worker = _worker(tmp_path)
    _save(worker.stage_dir, [5, 10])
    assert _propose(worker).restart_from_step == 10


# --- the eval battery: a suite changed since the stage was planned ----------------------------------


def test_a_suite_changed_since_the_plan_is_the_suites_code(tmp_path):
    suite = Path(__file__).resolve().parents[2] / "data" / "fixtures" / "evals" / "ito-fixture-evals-v1.jsonl"
    np.save(tmp_path / "heldout.npy", np.zeros(64, dtype=np.uint16))
    worker = _worker(tmp_path)
    worker.config = SimpleNamespace(heldout_path=str(tmp_path / "heldout.npy"), eval_sequence_length=8, eval_windows=2,
                                    eval_suite_path=str(suite), eval_suite_sha256="sha256:" + "0" * 64)
    with pytest.raises(ItoError) as raised:
        worker.battery()
    assert raised.value.code is ErrorCode.EVAL_SUITE_MISMATCH
