"""The Slurm back end under the supervisor, for real on this machine: the attempts go through
`sbatch`, `squeue`, `sacct`, `scancel` and `srun` (a fake Slurm of one machine, `fake_slurm`, first
on PATH), and the worker trains, dies and resumes as it would on two nodes of a cluster."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

import fake_slurm
from ito_assets.launch.backend import BackendKind, LaunchConfig
from ito_assets.launch.slurm import SlurmBackend, SlurmSettings
from ito_assets.launch.spec import LaunchSpec
from ito_assets.runtime.record import events
from ito_assets.runtime.supervision import heartbeat
from ito_assets.runtime.checkpoint import registry
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.supervision.relay import MetricsRelay
from ito_assets.runtime.supervision.supervisor import Supervisor, SupervisorConfig, SupervisionReport
from runtime_helpers import step_losses, worker_config
from test_relay import Recorder

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def slurm(tmp_path, monkeypatch) -> Path:
    """The fake Slurm's state folder; its tools first on PATH."""
    state = tmp_path / "slurm"
    fake_slurm.install(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return state


def _settings() -> SlurmSettings:
    return SlurmSettings(partition="debug", time_limit="00:10:00", python=sys.executable, workdir=str(ROOT),
                         rdzv_port=_free_port())


def _supervisor(config, *, grace_s: float = 5.0) -> Supervisor:
    return Supervisor(worker=config, config=SupervisorConfig(
        nnodes=2, nproc_per_node=1, hang_timeout_s=30.0, startup_timeout_s=60.0, poll_interval_s=0.3,
        grace_s=grace_s, max_restarts=1, launch=LaunchConfig(backend=BackendKind.SLURM, slurm=_settings())))


def _submitted(state: Path) -> list[dict]:
    return [c for c in fake_slurm.calls(state) if c["tool"] == "sbatch"]


def _accounting(state: Path) -> list[str]:
    return [p.read_text().strip() for p in sorted((state / "jobs").glob("*/sacct"))]


def test_a_two_node_stage_trains_to_completion_through_sbatch_and_srun(tmp_path, tokens, slurm):
    config = worker_config(tmp_path, tokens)
    supervisor = _supervisor(config)
    supervisor.relay = MetricsRelay(Path(config.metrics_path), recorder := Recorder())
    report = supervisor.run()

    log = (Path(config.stage_dir) / "attempt-0.log").read_text()
    assert report.outcome == "succeeded" and report.num_attempts == 1, log[-3000:]
    assert report.result["num_steps"] == config.num_steps
    (submission,) = _submitted(slurm)
    script = Path(submission["args"][-1]).read_text()
    assert "--rdzv-id=run-test-pretraining-0" in script and f"--config {config.stage_dir}/attempt-0.json" in script
    assert _accounting(slurm) == ["COMPLETED|0:0"]
    srun_calls = [c for c in fake_slurm.calls(slurm) if c["tool"] == "srun"]
    assert len(srun_calls) == 1 and srun_calls[0]["args"][0] == "--kill-on-bad-exit=1"
    tasks = (slurm / "jobs" / str(fake_slurm.FIRST_JOB_ID) / "tasks").read_text().split()
    assert tasks[0::2] == ["0", "1"]  # one torchrun per node, joined in one rendezvous (world size 2)
    assert sorted(step_losses(Path(config.stage_dir))) == list(range(1, config.num_steps + 1))
    # Rank 0 ran on a "node" without the Pipes channel; the supervisor relayed its metrics.
    assert {step for step, _ in recorder.metrics_seen} >= {config.num_steps}


@pytest.mark.long  # `make test` has the SIGKILL fault under torchrun (test_fault_injection.py)
def test_a_sigkilled_rank_under_slurm_fails_the_job_and_the_stage_resumes_in_a_new_job(tmp_path, tokens, slurm):
    config = worker_config(tmp_path, tokens, num_steps=96)
    supervisor = _supervisor(config)
    thread, reports = _start(supervisor)
    beat = _wait_past_first_checkpoint(config, rank=1)
    assert _environ(beat.pid)["SLURM_JOB_ID"] == str(fake_slurm.FIRST_JOB_ID)  # a task of the first job
    os.kill(beat.pid, signal.SIGKILL)
    thread.join(timeout=150)
    (report,) = reports

    assert report.outcome == "succeeded" and report.num_attempts == 2
    (fault,) = report.faults
    assert fault.kind == "dead" and fault.recovery_seconds is not None
    (failed, completed) = _accounting(slurm)  # srun: the highest task code (a killed node's 137)
    assert failed.startswith("FAILED|") and failed != "FAILED|0:0" and completed == "COMPLETED|0:0"
    second = Path(_submitted(slurm)[1]["args"][-1]).read_text()
    assert "--rdzv-id=run-test-pretraining-1" in second and "attempt-1.json" in second
    resumes = [(e.attempt, e.step) for e in events.read(Path(config.stage_dir)) if e.kind is EventKind.RESUME]
    assert resumes[-1][0] == 1 and resumes[-1][1] >= config.interval_steps
    assert sorted(step_losses(Path(config.stage_dir))) == list(range(1, config.num_steps + 1))


def test_a_stop_request_signals_the_steps_and_the_ranks_flush_a_checkpoint(tmp_path, tokens, slurm):
    config = worker_config(tmp_path, tokens, num_steps=2000)
    supervisor = _supervisor(config, grace_s=30.0)
    thread, reports = _start(supervisor)
    _wait_past_first_checkpoint(config, rank=0)
    supervisor.request_stop()
    thread.join(timeout=90)
    (report,) = reports

    assert report.outcome == "stopped"
    scancels = [c["args"] for c in fake_slurm.calls(slurm) if c["tool"] == "scancel"]
    assert scancels == [["--signal=TERM", str(fake_slurm.FIRST_JOB_ID)]]  # the ranks left within the grace
    beats = heartbeat.read_all(Path(config.heartbeat_dir), attempt=0)
    assert {b.phase for b in beats.values()} == {"stopped"}
    flushed = max(r.step for r in registry.read(Path(config.stage_dir)))
    assert flushed == max(b.step for b in beats.values())  # the checkpoint of the step they stopped at


def test_a_job_that_ignores_sigterm_is_cancelled_after_the_grace_period(tmp_path, slurm):
    module = tmp_path / "mods" / "lingering.py"
    module.parent.mkdir()
    module.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\n"
                      "time.sleep(120)\n")
    spec = LaunchSpec(run_id="lingering-0", nnodes=1, nproc_per_node=1, module="lingering",
                      env=(("PYTHONPATH", str(module.parent)),))
    log_path = tmp_path / "attempt-0.log"
    attempt = SlurmBackend(_settings()).start(spec, number=0, log_path=log_path)
    _wait_for(lambda: "up" in (log_path.read_text() if log_path.exists() else ""), timeout=60)
    assert attempt.exit_code() is None

    seconds = attempt.terminate(set(), grace_s=2.0)

    assert 2.0 <= seconds < 30.0
    assert [c["args"] for c in fake_slurm.calls(slurm) if c["tool"] == "scancel"] == [
        ["--signal=TERM", attempt.job_id], [attempt.job_id]]
    assert attempt.exit_code() == 128 + signal.SIGKILL  # sacct: CANCELLED by UID|0:9
    assert fake_slurm.job_processes(slurm, attempt.job_id, steps_only=False) == []


def _start(supervisor: Supervisor) -> tuple[threading.Thread, list[SupervisionReport]]:
    reports: list[SupervisionReport] = []
    thread = threading.Thread(target=lambda: reports.append(supervisor.run()), daemon=True)
    thread.start()
    return thread, reports


def _wait_for(condition, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def _wait_past_first_checkpoint(config, rank: int, timeout: float = 90.0) -> heartbeat.Heartbeat:
    found: list[heartbeat.Heartbeat] = []

    def ready() -> bool:
        beat = heartbeat.read_all(Path(config.heartbeat_dir), attempt=0).get(rank)
        if registry.read(Path(config.stage_dir)) and beat is not None and beat.phase in ("training", "checkpointing"):
            found.append(beat)
        return bool(found)

    _wait_for(ready, timeout=timeout)
    return found[0]


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)
