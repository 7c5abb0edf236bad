"""Fault injection under the supervisor: a worker killed mid-step, a hung worker, a corrupt
latest checkpoint. Each is detected within its bound and the stage finishes from the newest whole
checkpoint under the same run (same stage folder, one report, attempts counted)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from ito_assets.runtime.record import events
from ito_assets.runtime.supervision import heartbeat
from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.checkpoint import registry
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.supervision.supervisor import Supervisor, SupervisorConfig, SupervisionReport
from runtime_helpers import TRIALS, run_worker, step_losses, worker_config

pytestmark = pytest.mark.slow

STEPS = 200  # long enough on an idle machine for the fault to land mid-training
HANG_BOUND_S = 3.0
POLL_S = 0.2
FAST = SupervisorConfig(nproc_per_node=2, hang_timeout_s=HANG_BOUND_S, startup_timeout_s=90.0,
                        poll_interval_s=POLL_S, grace_s=3.0, max_restarts=2)
# The SIGKILL test's: a dead rank is seen through torchrun's exit, and a hang bound of 3 s could
# fire first on a loaded machine (the killed rank goes silent too) and call the death a hang.
DEATH_WATCH = SupervisorConfig(nproc_per_node=2, hang_timeout_s=30.0, startup_timeout_s=90.0,
                               poll_interval_s=POLL_S, grace_s=3.0, max_restarts=2)


def _start(supervisor: Supervisor) -> tuple[threading.Thread, list[SupervisionReport]]:
    reports: list[SupervisionReport] = []
    thread = threading.Thread(target=lambda: reports.append(supervisor.run()), daemon=True)
    thread.start()
    return thread, reports


def _wait_past_first_checkpoint(config, rank: int, timeout: float = 90.0) -> heartbeat.Heartbeat:
    """Mid-training, once the first checkpoint is whole (so that there is something to resume from)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        beat = heartbeat.read_all(Path(config.heartbeat_dir), attempt=0).get(rank)
        saved = registry.read(Path(config.stage_dir))
        if saved and beat is not None and beat.phase in ("training", "checkpointing"):
            return beat
        time.sleep(0.01)
    raise AssertionError(f"rank {rank} never got past the first checkpoint")


def _resumes(stage_dir: Path) -> list[tuple[int, int]]:
    return [(e.attempt, e.step) for e in events.read(stage_dir) if e.kind is EventKind.RESUME]


def _check_recovered(report: SupervisionReport, config, kind: str) -> None:
    assert report.outcome == "succeeded" and report.num_attempts == 2
    (fault,) = report.faults
    assert fault.kind == kind and not fault.planned and fault.recovery_seconds is not None
    (first, second) = _resumes(Path(config.stage_dir))
    assert first == (0, -1) and second[0] == 1 and second[1] >= config.interval_steps
    assert sorted(step_losses(Path(config.stage_dir))) == list(range(1, config.num_steps + 1))
    assert report.result["num_steps"] == config.num_steps


@pytest.mark.parametrize("trial", TRIALS)
def test_sigkill_of_a_worker_mid_step_is_detected_and_the_stage_resumes(tmp_path, tokens, trial):
    config = worker_config(tmp_path, tokens, num_steps=STEPS)
    thread, reports = _start(Supervisor(worker=config, config=DEATH_WATCH))
    beat = _wait_past_first_checkpoint(config, rank=1)
    killed_at = time.time()
    os.kill(beat.pid, signal.SIGKILL)
    thread.join(timeout=150)
    (report,) = reports
    _check_recovered(report, config, "dead")
    assert report.faults[0].detected_at - killed_at < 10.0  # torchrun notices at once; one poll more


@pytest.mark.parametrize("trial", TRIALS)
def test_a_hung_worker_is_detected_by_its_stale_heartbeat(tmp_path, tokens, trial):
    config = worker_config(tmp_path, tokens, num_steps=STEPS)
    thread, reports = _start(Supervisor(worker=config, config=FAST))
    beat = _wait_past_first_checkpoint(config, rank=0)
    os.kill(beat.pid, signal.SIGSTOP)  # alive, silent: a hang, not an exit
    thread.join(timeout=150)
    (report,) = reports
    _check_recovered(report, config, "hung")
    detection = report.faults[0].detection_seconds
    assert HANG_BOUND_S <= detection <= HANG_BOUND_S + 2 * POLL_S + 1.0


@pytest.mark.parametrize("trial", TRIALS)
def test_a_corrupt_latest_checkpoint_is_skipped_never_loaded(tmp_path, tokens, trial):
    config = worker_config(tmp_path, tokens, stop_after_step=16)
    stage_dir = Path(config.stage_dir)
    assert run_worker(config, nproc=1).returncode != 0  # stopped after flushing step 16
    latest = markers.checkpoint_dir(stage_dir, 16)
    shard = next(latest.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    partial = markers.checkpoint_dir(stage_dir, 20)  # a save killed before its marker
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"\0" * 64)

    finished = Supervisor(worker=worker_config(tmp_path, tokens), config=SupervisorConfig(
        nproc_per_node=1, hang_timeout_s=30.0, startup_timeout_s=90.0, poll_interval_s=POLL_S, grace_s=3.0)).run()

    assert finished.outcome == "succeeded"
    assert _resumes(stage_dir)[-1] == (0, 8)  # not 20 (partial), not 16 (corrupt)
    log = (stage_dir / "attempt-0.log").read_text() + Path(config.metrics_path).read_text()
    assert "skipped checkpoint step 20: no completion marker" in log
    assert "skipped checkpoint step 16: digest mismatch" in log


@pytest.mark.long  # `make test` kills a rank on one node (the fault matrix above); two nodes in test-long
def test_two_nodes_on_loopback_survive_the_sigkill_of_the_second_nodes_rank(tmp_path, tokens):
    """The multi-node path for real. Two torchrun launchers (`--nnodes 2`, c10d on
    loopback), one rank each; the second node's rank dies, its launcher exits, the supervisor ends
    both nodes and resumes the stage on two fresh launchers from the newest whole checkpoint."""
    config = worker_config(tmp_path, tokens, num_steps=STEPS)
    two_nodes = SupervisorConfig(nnodes=2, nproc_per_node=1, hang_timeout_s=HANG_BOUND_S, startup_timeout_s=90.0,
                                 poll_interval_s=POLL_S, grace_s=3.0, max_restarts=2)
    thread, reports = _start(Supervisor(worker=config, config=two_nodes))
    beat = _wait_past_first_checkpoint(config, rank=1)
    beats = heartbeat.read_all(Path(config.heartbeat_dir), attempt=0)
    # Each rank was started by its own node's launcher: node (group) ranks 0 and 1, one rank each.
    assert sorted(_torchrun_env(b.pid)["GROUP_RANK"] for b in beats.values()) == ["0", "1"]
    assert {_torchrun_env(b.pid)["LOCAL_WORLD_SIZE"] for b in beats.values()} == {"1"}
    os.kill(beat.pid, signal.SIGKILL)
    thread.join(timeout=150)
    (report,) = reports
    _check_recovered(report, config, "dead")
    (allocation,) = [e for e in events.read(Path(config.stage_dir)) if e.kind is EventKind.ALLOCATION]
    assert allocation.num_devices == 2


def _torchrun_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)
