"""A stage folder that cannot be written (a full disk, a vanished folder) ends the stage FAILED
with the storage's code and one plain sentence: no traceback, no restart (none could help), and
the newest whole checkpoint left where it was. Workers whose last save failed say so in their
heartbeats: a full disk fails the stage at once, another storage error gets one retry, neither
spends the restart budget. Fake back end, as in the restart-budget tests."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from ito_assets.runtime.supervision import heartbeat, launch
from ito_assets.runtime.supervision import supervisor as supervisor_module
from ito_assets.runtime.stage.config import RESULT_NAME
from ito_assets.runtime.supervision.supervisor import AttemptEnd, Outcome, main
from test_restart_budget import FakeAttempt, FakeBackend, _supervise, _worker, write_beat

pytestmark = pytest.mark.timeout(30)


def _failing_write(code: int, after: int = 0):
    """write_atomic that succeeds `after` times, then fails with `code` (the OS's own error)."""
    real, calls = supervisor_module.write_atomic, [0]

    def write(path, data):
        calls[0] += 1
        if calls[0] > after:
            raise OSError(code, os.strerror(code), str(path))
        return real(path, data)

    return write


@pytest.mark.parametrize("code,expected", [(errno.ENOSPC, "STORAGE_FULL"), (errno.EDQUOT, "STORAGE_FULL"),
                                           (errno.EIO, "CHECKPOINT_STORAGE_INVALID"),
                                           (errno.ENOENT, "CHECKPOINT_STORAGE_INVALID")])
def test_an_unwritable_stage_folder_fails_the_stage_with_its_code(tmp_path, monkeypatch, capsys, code, expected):
    supervisor, backend = _supervise(tmp_path, ["fail"], max_restarts=3)
    monkeypatch.setattr(supervisor_module, "write_atomic", _failing_write(code, after=1))  # the 2nd attempt's config
    report = supervisor.run()
    assert report.outcome is Outcome.FAILED and report.error_code == expected
    assert len(backend.started) == 1  # the first attempt ran; no restart was tried on a broken folder
    stderr = capsys.readouterr().err
    assert stderr.startswith(f"{expected}: the stage folder of pretraining could not be written") and "Traceback" not in stderr
    assert os.strerror(code) in report.error


def test_a_stage_folder_that_fails_under_a_running_attempt_ends_the_attempt_too(tmp_path, monkeypatch):
    """Nobody would watch it after the supervisor ends: its ranks would hold the devices to their end."""
    supervisor, backend = _supervise(tmp_path, ["run"], max_restarts=3)
    real, calls = supervisor_module.proposals.approved_restart, [0]

    def unreadable_after_the_launch(stage_dir):
        calls[0] += 1
        if calls[0] > 2:  # the launch's look and the first poll's read; then EIO (a network mount)
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(Path(stage_dir) / "proposals"))
        return real(stage_dir)

    monkeypatch.setattr(supervisor_module.proposals, "approved_restart", unreadable_after_the_launch)
    report = supervisor.run()
    assert (report.outcome, report.error_code, len(backend.started)) == (Outcome.FAILED, "CHECKPOINT_STORAGE_INVALID", 1)
    (attempt,) = backend.started
    assert attempt.terminations == [(set(), supervisor.config.grace_s)] and attempt.code == -15


def test_a_real_full_disk_under_the_event_log(tmp_path, capsys):
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full, where every write fails with ENOSPC")
    supervisor, backend = _supervise(tmp_path, ["fail"], max_restarts=3)
    stage = backend.stage_dir
    stage.mkdir(parents=True)
    (stage / "events.jsonl").symlink_to("/dev/full")  # the interruption's event is the first write there
    report = supervisor.run()
    assert (report.outcome, report.error_code, len(backend.started)) == (Outcome.FAILED, "STORAGE_FULL", 1)
    saved = json.loads((stage / supervisor_module.REPORT_NAME).read_text())  # the folder itself still takes files
    assert saved["error_code"] == "STORAGE_FULL" and "No space left on device" in saved["error"]
    assert "Traceback" not in capsys.readouterr().err


def test_a_vanished_stage_folder_is_reported_even_when_the_report_cannot_be_written(tmp_path, monkeypatch):
    supervisor, backend = _supervise(tmp_path, ["fail"], max_restarts=3)
    monkeypatch.setattr(supervisor_module, "write_atomic", _failing_write(errno.ENOENT, after=1))
    report = supervisor.run()  # the report's own write fails too: it is still returned
    assert (report.outcome, report.error_code) == (Outcome.FAILED, "CHECKPOINT_STORAGE_INVALID")
    assert not (backend.stage_dir / supervisor_module.REPORT_NAME).exists()


def test_main_prints_the_code_and_exits_one(tmp_path, monkeypatch, capsys):
    worker = _worker(tmp_path)
    backend = FakeBackend(worker, ["fail"])
    monkeypatch.setattr(launch, "backend_for", lambda config: backend)
    monkeypatch.setattr(supervisor_module.signal, "signal", lambda number, handler: None)
    monkeypatch.setattr(supervisor_module, "write_atomic", _failing_write(errno.ENOSPC, after=1))
    assert main(["--worker", worker.to_json(), "--supervisor", json.dumps({"max_restarts": 2})]) == 1
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == {"stage": worker.stage, "outcome": "failed", "num_attempts": 1, "error_code": "STORAGE_FULL"}
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_an_error_outside_the_stage_folder_keeps_its_traceback(tmp_path, monkeypatch):
    supervisor, backend = _supervise(tmp_path, ["fail"], max_restarts=3)

    def missing_launcher(*args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/usr/bin/sbatch")

    monkeypatch.setattr(backend, "start", missing_launcher)
    with pytest.raises(FileNotFoundError):
        supervisor.run()


# --- the workers' last save could not be written: their heartbeats carry the code ----------------


def _storage_failed(code: str):
    """An attempt whose ranks beat STORAGE_FAILED with `code` and exit 1 (torchrun's own code)."""

    def behave(attempt: FakeAttempt, backend: FakeBackend) -> None:
        for rank in range(2):
            write_beat(backend.heartbeat_dir, rank=rank, attempt=attempt.number, step=12,
                       phase=heartbeat.STORAGE_FAILED, at=backend.now(), detail=code)
        attempt.code = 1

    return behave


def test_a_full_disk_under_the_workers_fails_the_stage_at_once_off_the_budget(tmp_path, capsys):
    supervisor, backend = _supervise(tmp_path, [_storage_failed("STORAGE_FULL")], default="succeed", max_restarts=3)
    report = supervisor.run()
    assert (report.outcome, report.error_code, len(backend.started)) == (Outcome.FAILED, "STORAGE_FULL", 1)
    assert [(f.kind, f.error_code) for f in report.faults] == [(AttemptEnd.STORAGE, "STORAGE_FULL")]
    stderr = capsys.readouterr().err
    assert stderr.startswith("STORAGE_FULL: the workers of pretraining could not write their last checkpoint")
    assert "attempt-0.log" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_another_storage_error_is_retried_once_outside_the_budget(tmp_path, max_restarts):
    script = [_storage_failed("CHECKPOINT_STORAGE_INVALID"), "succeed"]
    supervisor, backend = _supervise(tmp_path, script, max_restarts=max_restarts)
    report = supervisor.run()
    assert (report.outcome, report.num_attempts, len(backend.started)) == (Outcome.SUCCEEDED, 2, 2)


def test_the_same_storage_error_twice_in_a_row_fails_the_stage(tmp_path):
    failing = _storage_failed("CHECKPOINT_STORAGE_INVALID")
    supervisor, backend = _supervise(tmp_path, [failing, failing], default="succeed", max_restarts=3)
    report = supervisor.run()
    assert (report.outcome, report.error_code, len(backend.started)) == (Outcome.FAILED, "CHECKPOINT_STORAGE_INVALID", 2)
    saved = json.loads((backend.stage_dir / supervisor_module.REPORT_NAME).read_text())
    assert saved["error_code"] == "CHECKPOINT_STORAGE_INVALID" and "attempt-1.log" in saved["error"]


def test_storage_errors_apart_are_each_retried_and_spend_none_of_the_budget(tmp_path):
    failing = _storage_failed("CHECKPOINT_STORAGE_INVALID")
    # storage, dead (the one restart the budget allows), storage again: not twice in a row.
    supervisor, backend = _supervise(tmp_path, [failing, "fail", failing, "succeed"], max_restarts=1)
    report = supervisor.run()
    assert (report.outcome, len(backend.started)) == (Outcome.SUCCEEDED, 4)
    assert [f.kind for f in report.faults] == [AttemptEnd.STORAGE, AttemptEnd.DEAD, AttemptEnd.STORAGE]


def test_an_unknown_code_in_a_heartbeat_still_ends_with_a_storage_code(tmp_path):
    failing = _storage_failed("NOT_A_CODE")
    supervisor, _ = _supervise(tmp_path, [failing, failing], max_restarts=3)
    assert supervisor.run().error_code == "CHECKPOINT_STORAGE_INVALID"


# --- a rank refused its inputs: its heartbeat carries the code ---------------------------------------


def _refused(code: str, exit_code: int = 65):
    """An attempt whose rank 0 beats REFUSED with `code` and exits (the worker's EX_DATAERR, or
    torchrun's own 1 for a rank's)."""

    def behave(attempt: FakeAttempt, backend: FakeBackend) -> None:
        write_beat(backend.heartbeat_dir, rank=0, attempt=attempt.number, step=-1, phase=heartbeat.REFUSED,
                   at=backend.now(), detail=code)
        attempt.code = exit_code

    return behave


@pytest.mark.parametrize("exit_code", [65, 1])
@pytest.mark.parametrize("max_restarts", [0, 3])
def test_inputs_a_rank_refused_fail_the_stage_with_its_code_at_once(tmp_path, capsys, exit_code, max_restarts):
    supervisor, backend = _supervise(tmp_path, [_refused("POSTTRAINING_DATA_INVALID", exit_code)], default="succeed",
                                     max_restarts=max_restarts)
    report = supervisor.run()
    assert (report.outcome, report.error_code, len(backend.started)) == (Outcome.FAILED, "POSTTRAINING_DATA_INVALID", 1)
    assert [(f.kind, f.error_code, f.planned) for f in report.faults] == [
        (AttemptEnd.REFUSED, "POSTTRAINING_DATA_INVALID", False)]
    stderr = capsys.readouterr().err
    assert stderr.startswith("POSTTRAINING_DATA_INVALID: the workers of pretraining refused their inputs")
    assert "attempt-0.log" in stderr and "Traceback" not in stderr
    saved = json.loads((backend.stage_dir / supervisor_module.REPORT_NAME).read_text())
    assert saved["error_code"] == "POSTTRAINING_DATA_INVALID" and saved["num_attempts"] == 1


@pytest.mark.parametrize("code", ["canary-not-a-code", "STORAGE_FULL", "BUDGET_EXCEEDED"])
def test_a_refusal_with_a_code_that_is_no_refusal_ends_with_internal_error(tmp_path, code):
    """A forged beat cannot end the stage with a code the workers never refuse with."""
    supervisor, _ = _supervise(tmp_path, [_refused(code)], default="succeed", max_restarts=3)
    report = supervisor.run()
    assert (report.outcome, report.error_code) == (Outcome.FAILED, "INTERNAL_ERROR")
    assert code not in report.error


@pytest.mark.parametrize("code", heartbeat.REFUSAL_CODES)
def test_every_refusal_code_is_an_error_code(tmp_path, code):
    supervisor, _ = _supervise(tmp_path, [_refused(code)], default="succeed", max_restarts=3)
    assert supervisor.run().error_code == code


def test_a_refusal_beat_beside_a_finished_stage_ends_nothing(tmp_path):
    """The exit decides: a REFUSED beat (a stale or forged file) beside a stage that finished and
    exited 0 is a success."""

    def beats_and_finishes(attempt: FakeAttempt, backend: FakeBackend) -> None:
        write_beat(backend.heartbeat_dir, rank=1, attempt=attempt.number, step=-1, phase=heartbeat.REFUSED,
                   at=backend.now(), detail="EVAL_SUITE_MISMATCH")
        (backend.stage_dir / RESULT_NAME).write_text(json.dumps({"num_steps": 24, "attempt": attempt.number}))
        attempt.code = 0

    supervisor, _ = _supervise(tmp_path, [beats_and_finishes], max_restarts=0)
    assert supervisor.run().outcome is Outcome.SUCCEEDED
