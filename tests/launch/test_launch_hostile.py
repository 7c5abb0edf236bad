"""The launch back ends against what they must never do: signal a process that is not their
attempt's (a forged heartbeat, a recycled pid), write a secret or shell code into what they
generate, or leave a job behind when the scheduler's answer is lost."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ito_assets.launch import local
from ito_assets.launch.kubernetes import KubernetesSettings, job_body, job_name
from ito_assets.launch.slurm import SlurmSettings, sbatch_script
from ito_assets.launch.spec import LaunchSpec

WORKER = "ito_assets.runtime.worker.main"
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)", WORKER]  # names the worker module, as a rank would
CANARY = "hf_" + "Zq7" * 12  # a Hugging Face token's format


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def _stop(attempt: local.LocalAttempt) -> None:
    for process in attempt.processes:
        if process.poll() is None:
            process.kill()
        process.wait()


def test_a_forged_heartbeat_naming_another_runs_worker_signals_nothing_of_it(tmp_path):
    other = local.start([SLEEPER], number=0, log_path=tmp_path / "other.log", worker_module=WORKER)
    ours = local.start([SLEEPER], number=0, log_path=tmp_path / "ours.log", worker_module=WORKER)
    try:
        victim = other.processes[0]
        ours.terminate({victim.pid}, grace_s=2.0)
        assert ours.processes[0].poll() is not None
        time.sleep(0.2)
        assert victim.poll() is None  # the other run's rank, though its command line names the worker
    finally:
        _stop(other)
        _stop(ours)


def test_a_pid_of_an_unrelated_process_naming_the_worker_is_not_signalled(tmp_path):
    unrelated = subprocess.Popen(SLEEPER, start_new_session=True)  # e.g. `less ...worker/main.py`, `grep`
    ours = local.start([SLEEPER], number=0, log_path=tmp_path / "ours.log", worker_module=WORKER)
    try:
        ours.terminate({unrelated.pid, os.getpid()}, grace_s=2.0)
        time.sleep(0.2)
        assert unrelated.poll() is None
    finally:
        unrelated.kill()
        unrelated.wait()
        _stop(ours)


SPAWNER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(60)
"""


def test_the_attempts_own_ranks_in_sessions_of_their_own_are_still_stopped(tmp_path):
    # As torchrun does: every rank in a session of its own, found only by its heartbeat's pid.
    pid_file = tmp_path / "rank.pid"
    attempt = local.start([[sys.executable, "-c", SPAWNER, str(pid_file)]], number=0, log_path=tmp_path / "a.log",
                          worker_module=WORKER)
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        rank = int(pid_file.read_text())
        attempt.terminate({rank}, grace_s=5.0)
        assert _gone(rank)
    finally:
        _stop(attempt)


# --- what the spec lets through to an sbatch script or a Job ------------------------------------

SLURM = SlurmSettings(partition="gpu", time_limit="01:00:00")
K8S = KubernetesSettings(image="i", volume_claim="c", mount_path="/data", namespace="ito")


@pytest.mark.parametrize("name", ["X=1;touch /tmp/owned;Y", "A B", "$(id)", "-x", "1X", "X\nY", ""])
def test_an_env_name_that_is_no_identifier_never_reaches_an_sbatch_script(name):
    # `export NAME=...` writes the name unquoted: it would run as shell code on the compute node.
    with pytest.raises(ValueError, match="env names"):
        LaunchSpec(run_id="r1", nnodes=1, nproc_per_node=1, module="m", env=((name, "v"),))


@pytest.mark.parametrize(("name", "value"), [
    ("HF_TOKEN", CANARY), ("ITO_API_TOKEN", "plain"), ("AWS_SECRET_ACCESS_KEY", "x"), ("SETTING", CANARY),
])
def test_a_secret_in_the_spec_env_is_refused_without_echoing_it(name, value):
    # The env is written out as plain text: into the sbatch script and the Job's manifest.
    with pytest.raises(ValueError, match="non-secret") as refused:
        LaunchSpec(run_id="r1", nnodes=1, nproc_per_node=1, module="m", env=((name, value),))
    assert CANARY not in str(refused.value)


def test_secrets_of_the_launching_environment_reach_no_argv_script_or_manifest(tmp_path, monkeypatch):
    for name in ("HF_TOKEN", "ITO_API_TOKEN", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, CANARY)
    spec = LaunchSpec(run_id="run-1-pre-0", nnodes=2, nproc_per_node=2, module="m", args=("--config", "/data/c.json"),
                      env=(("ITO_STATE_DIR", "/data"),))
    generated = [sbatch_script(spec, SLURM), repr(job_body(spec, K8S)), *map(repr, local.node_commands(spec))]
    assert not any(CANARY in text for text in generated)


@pytest.mark.parametrize("run_id", ["abc_", "abc-", "a" * 62 + "_"])
def test_a_run_id_must_end_as_a_label_and_a_job_name_do(run_id):
    # `ito-abc-` is no DNS-1123 label, and `abc_` no label value: the API refuses the Job.
    with pytest.raises(ValueError, match="run_id"):
        LaunchSpec(run_id=run_id, nnodes=1, nproc_per_node=1, module="m")


def test_accepted_run_ids_give_valid_job_names():
    for run_id in ("a", "A_b-9", "x" * 63, "Run_" + "Q" * 59):
        name = job_name(LaunchSpec(run_id=run_id, nnodes=3, nproc_per_node=1, module="m"))
        assert name[0].isalnum() and name[-1].isalnum() and len(name) <= 63 and name == name.lower(), name


def test_run_ids_that_map_to_one_label_get_jobs_of_their_own():
    """`run_x`, `run-x` and `Run_X` lower-case to one label: without a digest one run's Job would
    refuse the other's (409) and one attempt's stop would delete the other's Job."""
    names = {job_name(LaunchSpec(run_id=run_id, nnodes=2, nproc_per_node=1, module="m"))
             for run_id in ("run_x-pre-0", "run-x-pre-0", "Run_X-pre-0")}
    assert len(names) == 3
    assert job_name(LaunchSpec(run_id="run-x-pre-0", nnodes=2, nproc_per_node=1, module="m")) == "ito-run-x-pre-0"


# --- a Kubernetes API that fails part way through a stop -----------------------------------------

def _failing_once(call):
    """`call`, except that its first use answers 503, as a busy or restarting API server does."""
    from kubernetes.client.exceptions import ApiException

    calls = []

    def once(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise ApiException(status=503, reason="Service Unavailable")
        return call(*args, **kwargs)
    return once


@pytest.mark.parametrize("stop", ["terminate", "release"])
def test_an_api_error_while_saving_the_logs_still_deletes_the_job(tmp_path, stop):
    pytest.importorskip("kubernetes")
    from launch.test_kubernetes_backend import JOB, FakeCluster, _start

    cluster = FakeCluster()
    attempt = _start(cluster, tmp_log=tmp_path / "attempt-0.log")
    attempt.poll_s = 0.01
    cluster.list_namespaced_pod = _failing_once(cluster.list_namespaced_pod)
    if stop == "terminate":
        attempt.terminate({1}, grace_s=0.1)
    else:
        attempt.release()
    assert ("delete_job", JOB, "Background") in cluster.calls and cluster.empty()
    assert "no pods listed: 503" in (tmp_path / "attempt-0.log").read_text()


# --- an sbatch that hangs or answers nothing ----------------------------------------------------

def _fake_slurm(tmp_path: Path, monkeypatch, sbatch_body: str) -> Path:
    """`sbatch` and `scancel` on PATH that record their argv (one line each) in calls.log."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for name, body in (("sbatch", sbatch_body), ("scancel", "")):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{body}\n')
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


def test_an_sbatch_that_timed_out_has_the_job_it_may_have_submitted_cancelled(tmp_path, monkeypatch):
    from ito_assets.launch import slurm

    calls = _fake_slurm(tmp_path, monkeypatch, "exec sleep 30")  # took the job, never answered
    monkeypatch.setattr(slurm, "COMMAND_TIMEOUT_S", 0.5)
    spec = LaunchSpec(run_id="run-1-pre-3", nnodes=1, nproc_per_node=1, module="m")
    with pytest.raises(RuntimeError, match="did not answer"):
        slurm.SlurmBackend(SLURM).start(spec, number=3, log_path=tmp_path / "attempt-3.log")
    cancels = [line.split()[1:] for line in calls.read_text().splitlines() if line.startswith("scancel")]
    assert len(cancels) == 1 and "--name=ito-run-1-pre-3" in cancels[0]
    assert any(arg.startswith("--user=") for arg in cancels[0])  # never another user's job of that name


@pytest.mark.parametrize("stdout", ["", "Submitted batch job 12", "-u alice"])
def test_an_sbatch_answer_without_a_job_id_starts_no_attempt(tmp_path, monkeypatch, stdout):
    from ito_assets.launch import slurm

    _fake_slurm(tmp_path, monkeypatch, f"echo '{stdout}'")
    spec = LaunchSpec(run_id="run-1-pre-0", nnodes=1, nproc_per_node=1, module="m")
    with pytest.raises(RuntimeError, match="no job id"):
        slurm.SlurmBackend(SLURM).start(spec, number=0, log_path=tmp_path / "attempt-0.log")
