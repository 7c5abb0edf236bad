"""A stage folder that cannot be written (a full disk, a vanished folder) ends the stage FAILED
with the storage's code and one plain sentence: no traceback, no restart (none could help), and
the newest whole checkpoint left where it was. Fake back end, as in the restart-budget tests."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from ito_assets.runtime.supervision import launch
from ito_assets.runtime.supervision import supervisor as supervisor_module
from ito_assets.runtime.supervision.supervisor import Outcome, main
from test_restart_budget import FakeBackend, _supervise, _worker

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
