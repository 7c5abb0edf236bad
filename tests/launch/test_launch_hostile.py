"""The launch back ends against what they must never do: signal a process that is not their
attempt's (a forged heartbeat, a recycled pid), write a secret or shell code into what they
generate, or leave a job behind when the scheduler's answer is lost."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import process_started_at
from ito_assets.launch import local
from ito_assets.launch.kubernetes import KubernetesSettings, job_body, job_name
from ito_assets.launch.slurm import SlurmSettings, sbatch_script
from ito_assets.launch.spec import LaunchSpec

WORKER = "ito_assets.runtime.worker.main"
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)", WORKER]  # names the worker module, as a rank would
CANARY = "hf_" + "Zq7" * 12  # a Hugging Face token's format


def _gone(pid: int, started: float | None, timeout_s: float = 10.0) -> bool:
    """The process that started at `started` under `pid` has ended (a later one under its pid is another)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process_started_at(pid) != started:
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
        started = process_started_at(rank)
        attempt.terminate({rank}, grace_s=5.0)
        assert started is not None and _gone(rank, started)
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
    ("PGPASSWORD", "plain"), ("SETTING", "PGPASSWORD=plain"), ("EXTRA", "--hf_token=plain"),  # a glued name; a dump, a flag
])
def test_a_secret_in_the_spec_env_is_refused_without_echoing_it(name, value):
    # The env is written out as plain text: into the sbatch script and the Job's manifest.
    with pytest.raises(ValueError, match="non-secret") as refused:
        LaunchSpec(run_id="r1", nnodes=1, nproc_per_node=1, module="m", env=((name, value),))
    assert CANARY not in str(refused.value)


# A password under a name only text calls one (DB_PASS), and keys under names no rule knows: judged
# by their randomness, as a manifest's values are.
AZURE = ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Q2FuYXJ5S2V5MTIzNDU2Nzg5MGFiY2RlZmdoaWprbG1ubw==;"
         "EndpointSuffix=core.windows.net")


@pytest.mark.parametrize(("name", "value"), [
    ("DB_PASS", "CanaryPw1"), ("REDIS_AUTH", "CanaryPw1"), ("PASS", "CanaryPw1"), ("MYSQL_PASS", "CanaryPw1"),
    ("AZ_CONN", AZURE),
    ("AZURE_STORAGE_CONNECTION_STRING", AZURE),
    ("S3_CREDS", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"), ("EXTRA", "Xk9pQ2mZ7vR4tL8wN3bY6cF1hJ5sD0gA"),
    ("DATABASE_URL", "postgresql://ito:q8Rz/Tn4+Wm2Lk9Xv3Bd@db.internal:5432/ito"),  # a password with a "/"
])
def test_a_credential_no_known_format_names_is_refused_from_the_spec_env(name, value):
    with pytest.raises(ValueError, match="non-secret") as refused:
        LaunchSpec(run_id="r1", nnodes=1, nproc_per_node=1, module="m", env=((name, value),))
    assert value not in str(refused.value) and "CanaryPw1" not in str(refused.value)


@pytest.mark.parametrize(("name", "value"), [
    ("TORCHFT_LIGHTHOUSE", "http://127.0.0.1:29510"), ("TORCHFT_LIGHTHOUSE", "http://node-17.cluster.internal:29510"),
    ("CUDA_VISIBLE_DEVICES", "0,1,2,3"), ("CUDA_VISIBLE_DEVICES", "GPU-5f1e2b3c-4d5e-6f70-8192-a3b4c5d6e7f8"),
    ("CUDA_VISIBLE_DEVICES", "MIG-5f1e2b3c-4d5e-6f70-8192-a3b4c5d6e7f8,MIG-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"),
    ("CUDA_VISIBLE_DEVICES", "MIG-GPU-bf675a41-b36c-591e-bf67-5a41b36c58dc/1/0"),  # random enough for the entropy rule
    ("PYTHONPATH", "/opt/ito/src:/opt/ito/site-packages"), ("ITO_STATE_DIR", "/var/lib/ito"),
    ("NCCL_SOCKET_IFNAME", "eth0"), ("BYPASS_CACHE", "1"),
    # "pass" after a count or a switch names a pass, not a password
    ("FIRST_PASS", "1"), ("TWO_PASS", "true"), ("SKIP_PASS", "dedup"), ("NUM_PASSES", "3"),
])
def test_the_supervisor_s_own_settings_pass_the_spec_env(name, value):
    # The supervisor adds a replica group's lighthouse and its share of the GPUs (runtime/supervision).
    spec = LaunchSpec(run_id="r1", nnodes=1, nproc_per_node=1, module="m", env=((name, value),))
    assert spec.env == ((name, value),)


def test_a_device_list_is_still_read_for_known_formats():
    with pytest.raises(ValueError, match="non-secret"):
        LaunchSpec(run_id="r1", nnodes=1, nproc_per_node=1, module="m", env=(("CUDA_VISIBLE_DEVICES", CANARY),))


def test_a_setting_named_like_a_tokenizer_is_no_credential():
    spec = LaunchSpec(run_id="r1", nnodes=1, nproc_per_node=1, module="m", env=(("TIKTOKEN_CACHE_DIR", "/data/tiktoken"),))
    assert spec.env == (("TIKTOKEN_CACHE_DIR", "/data/tiktoken"),)


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


# --- an sbatch that hangs or answers nothing, a job left behind, a job id that names another job ---

UID = str(os.geteuid())


def _fake_slurm(tmp_path: Path, monkeypatch, sbatch_body: str, **bodies: str | None) -> Path:
    """`sbatch`, `squeue`, `scancel` (and any tool in `bodies`; None leaves one out) on PATH that
    record their argv (one line each) in calls.log; by default squeue lists no job."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for name, body in {"sbatch": sbatch_body, "squeue": "", "scancel": "", **bodies}.items():
        if body is None:
            continue
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{body}\n')
        tool.chmod(0o755)
    # These and the system's tools only: a Slurm installed on this machine never answers in their place.
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return calls


def _calls(calls: Path, tool: str) -> list[list[str]]:
    lines = calls.read_text().splitlines() if calls.exists() else []  # no tool ran, none wrote it
    return [line.split()[1:] for line in lines if line.split()[0] == tool]


def test_an_sbatch_that_timed_out_has_the_job_it_may_have_submitted_cancelled(tmp_path, monkeypatch):
    from ito_assets.launch import slurm

    calls = _fake_slurm(tmp_path, monkeypatch, "exec sleep 30")  # took the job, never answered
    monkeypatch.setattr(slurm, "COMMAND_TIMEOUT_S", 0.5)
    spec = LaunchSpec(run_id="run-1-pre-3", nnodes=1, nproc_per_node=1, module="m")
    log = tmp_path / "attempt-3.log"
    with pytest.raises(RuntimeError, match="did not answer"):
        slurm.SlurmBackend(SLURM).start(spec, number=3, log_path=log)
    name = f"ito-run-1-pre-3-{slurm.series(log)}"
    # By the attempt's own name, as this user only: never another user's job of that name.
    assert _calls(calls, "scancel") == [[f"--name={name}", f"--user={UID}"]]
    assert f"scancel --name={name}; a job registered after it is cancelled by the next start" in log.read_text()


@pytest.mark.parametrize("stdout", ["", "Submitted batch job 12", "-u alice"])
def test_an_sbatch_answer_without_a_job_id_starts_no_attempt(tmp_path, monkeypatch, stdout):
    from ito_assets.launch import slurm

    _fake_slurm(tmp_path, monkeypatch, f"echo '{stdout}'")
    spec = LaunchSpec(run_id="run-1-pre-0", nnodes=1, nproc_per_node=1, module="m")
    with pytest.raises(RuntimeError, match="no job id"):
        slurm.SlurmBackend(SLURM).start(spec, number=0, log_path=tmp_path / "attempt-0.log")


@pytest.mark.parametrize(("sbatch_body", "error"), [
    ("echo 'Submitted batch job 12'", "no job id"),  # a site's wrapper ignored --parsable: job 12 runs
    # sbatch's own message timeout: slurmctld may have taken the job before the answer was lost.
    ("echo 'sbatch: error: Batch job submission failed: Socket timed out on send/recv operation' >&2; exit 1",
     "refused"),
])
def test_an_sbatch_that_gave_no_job_id_has_the_job_it_may_have_submitted_cancelled(tmp_path, monkeypatch,
                                                                                   sbatch_body, error):
    from ito_assets.launch import slurm

    calls = _fake_slurm(tmp_path, monkeypatch, sbatch_body)
    spec = LaunchSpec(run_id="run-1-pre-0", nnodes=1, nproc_per_node=1, module="m")
    log = tmp_path / "attempt-0.log"
    with pytest.raises(RuntimeError, match=error):
        slurm.SlurmBackend(SLURM).start(spec, number=0, log_path=log)
    cancels = _calls(calls, "scancel")
    assert len(cancels) == 1 and f"--user={UID}" in cancels[0]
    assert any(arg.startswith("--name=ito-run-1-pre-0-") for arg in cancels[0])


def test_a_lost_sbatch_without_a_scancel_on_path_still_fails_the_start_as_unanswered(tmp_path, monkeypatch):
    from ito_assets.launch import slurm

    _fake_slurm(tmp_path, monkeypatch, "exec sleep 30", scancel=None)
    monkeypatch.setattr(slurm, "COMMAND_TIMEOUT_S", 0.5)
    spec = LaunchSpec(run_id="run-1-pre-3", nnodes=1, nproc_per_node=1, module="m")
    log = tmp_path / "attempt-3.log"
    with pytest.raises(RuntimeError, match="did not answer"):  # not a FileNotFoundError from the cleanup
        slurm.SlurmBackend(SLURM).start(spec, number=3, log_path=log)
    assert "failed (scancel could not run:" in log.read_text()


def test_a_user_without_a_passwd_entry_still_has_a_lost_job_cancelled(tmp_path, monkeypatch):
    import pwd

    from ito_assets.launch import slurm

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    calls = _fake_slurm(tmp_path, monkeypatch, "exec sleep 30")
    monkeypatch.setattr(slurm, "COMMAND_TIMEOUT_S", 0.5)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)  # a container's user that /etc/passwd does not name
    spec = LaunchSpec(run_id="run-1-pre-3", nnodes=1, nproc_per_node=1, module="m")
    with pytest.raises(RuntimeError, match="did not answer"):
        slurm.SlurmBackend(SLURM).start(spec, number=3, log_path=tmp_path / "attempt-3.log")
    assert f"--user={UID}" in _calls(calls, "scancel")[0]


def _listing(*jobs: tuple[str, str, str], cancelled: Path) -> str:
    """A squeue body listing `jobs` (id, state, name) for `squeue -u`; one whose id is in `cancelled`
    shows as COMPLETING, as a cancelled running job does."""
    lines = "".join(f'echo "{job_id}|$(state {job_id} {state})|{name}"\n' for job_id, state, name in jobs)
    return (f'state() {{ if grep -qx "$1" {cancelled} 2>/dev/null; then echo COMPLETING; else echo "$2"; fi; }}\n'
            f'case "$*" in *" -u {UID} "*)\n{lines};; esac')


def test_a_start_cancels_the_jobs_earlier_starts_of_its_stage_left_and_no_other_job(tmp_path, monkeypatch):
    from ito_assets.launch import slurm

    stage, other_stage = tmp_path / "run-1" / "pre", tmp_path / "run-1" / "sft"
    stage.mkdir(parents=True)
    ours, others = slurm.series(stage / "attempt-3.log"), slurm.series(other_stage / "attempt-0.log")
    cancelled = tmp_path / "cancelled"
    listing = _listing(
        ("11", "RUNNING", f"ito-run-1-pre-2-{ours}"),  # attempt 2's sbatch got no answer; registered later
        ("12", "PENDING", f"ito-run-1-pre-1-{ours}"),
        ("13", "COMPLETING", f"ito-run-1-pre-0-{ours}"),  # ending already: Slurm kills what is left of it
        ("14", "RUNNING", f"ito-run-1-sft-0-{others}"),  # another stage's attempt, running beside this one
        ("15", "RUNNING", f"ito-{ours}-run-1-pre-2-{others}"),  # the digest, not at the end
        ("16", "RUNNING", f"notebook-{ours}"),  # the user's own job, not the launcher's
        cancelled=cancelled)
    calls = _fake_slurm(tmp_path, monkeypatch, "echo 4000", squeue=listing,
                        scancel=f'for last; do :; done; echo "$last" >> {cancelled}')
    spec = LaunchSpec(run_id="run-1-pre-3", nnodes=1, nproc_per_node=1, module="m")
    attempt = slurm.SlurmBackend(SLURM).start(spec, number=3, log_path=stage / "attempt-3.log")

    assert attempt.job_id == "4000"
    assert _calls(calls, "scancel") == [[f"--name=ito-run-1-pre-2-{ours}", f"--user={UID}", "11"],
                                        [f"--name=ito-run-1-pre-1-{ours}", f"--user={UID}", "12"]]
    assert ["-h", "-a", "-u", UID, "-o", "%i|%T|%j"] in _calls(calls, "squeue")  # this user's, hidden partitions too
    log = (stage / "attempt-3.log").read_text()
    assert (f"--- job 11 (ito-run-1-pre-2-{ours}, RUNNING), left by an earlier start of this stage: cancelled "
            f"before attempt 3's") in log
    sbatch = _calls(calls, "sbatch")[0]
    assert "--open-mode=append" in sbatch  # the job appends to the log: the lines above stay
    assert f"#SBATCH --job-name=ito-run-1-pre-3-{ours}\n" in Path(sbatch[-1]).read_text()
    # On the command line too: sbatch ranks it above SBATCH_JOB_NAME, which outranks the directive.
    assert f"--job-name=ito-run-1-pre-3-{ours}" in sbatch


@pytest.mark.parametrize("squeue", [None, "exec sleep 30",
                                    "echo 'squeue: error: Unable to contact slurm controller' >&2; exit 1"])
def test_a_start_whose_look_for_left_over_jobs_gets_no_answer_fails_without_submitting(tmp_path, monkeypatch,
                                                                                        squeue):
    from ito_assets.launch import slurm

    calls = _fake_slurm(tmp_path, monkeypatch, "echo 4000", squeue=squeue)
    monkeypatch.setattr(slurm, "COMMAND_TIMEOUT_S", 0.5)
    spec = LaunchSpec(run_id="run-1-pre-3", nnodes=1, nproc_per_node=1, module="m")
    with pytest.raises(RuntimeError, match="squeue did not list the jobs left before attempt 3"):
        slurm.SlurmBackend(SLURM).start(spec, number=3, log_path=tmp_path / "attempt-3.log")
    assert _calls(calls, "sbatch") == []


@pytest.mark.parametrize("scancel", [None, "exec sleep 30",
                                     "echo 'scancel: error: Unable to contact slurm controller' >&2; exit 1"])
def test_a_left_over_job_that_scancel_does_not_end_fails_the_start(tmp_path, monkeypatch, scancel):
    from ito_assets.launch import slurm

    log = tmp_path / "attempt-3.log"
    listing = _listing(("11", "RUNNING", f"ito-run-1-pre-2-{slurm.series(log)}"), cancelled=tmp_path / "none")
    calls = _fake_slurm(tmp_path, monkeypatch, "echo 4000", squeue=listing, scancel=scancel)
    monkeypatch.setattr(slurm, "COMMAND_TIMEOUT_S", 0.5)
    spec = LaunchSpec(run_id="run-1-pre-3", nnodes=1, nproc_per_node=1, module="m")
    with pytest.raises(RuntimeError, match="scancel did not end job 11"):
        slurm.SlurmBackend(SLURM).start(spec, number=3, log_path=log)
    assert _calls(calls, "sbatch") == []  # it would run beside job 11, which holds the nodes it needs
    assert "--- job 11 (" in log.read_text() and ": scancel failed (" in log.read_text()


# An sbatch that answers 4000 and keeps the job's name (from its script) in `name`, as the controller does.
SBATCH_4000 = 'for last; do :; done; sed -n "s/^#SBATCH --job-name=//p" "$last" > {dir}/name; echo 4000'


def _started(tmp_path: Path, monkeypatch, *, squeue: str, before_sbatch: str = "", **bodies: str):
    """Attempt 0 started as job 4000 through a fake Slurm whose `squeue -j` answers `squeue` (with
    $NAME the job's name)."""
    from ito_assets.launch import slurm

    name = tmp_path / "name"
    queue = f'case "$*" in *" -j 4000 "*) NAME=$(cat {name}); {squeue};; esac'
    sbatch = before_sbatch + SBATCH_4000.format(dir=tmp_path)
    calls = _fake_slurm(tmp_path, monkeypatch, sbatch, squeue=queue, **bodies)
    spec = LaunchSpec(run_id="run-1-pre-0", nnodes=1, nproc_per_node=1, module="m")
    attempt = slurm.SlurmBackend(SLURM).start(spec, number=0, log_path=tmp_path / "attempt-0.log")
    attempt.poll_s = 0.05
    return attempt, calls


def test_a_job_id_that_names_another_job_now_is_neither_signalled_nor_watched(tmp_path, monkeypatch):
    from ito_assets.launch import slurm

    monkeypatch.setattr(slurm, "KILL_WAIT_S", 0.5)
    # Our job left the queue and the controller's ids restarted (its state was lost): id 4000 is
    # another stage's job of this user now, which a scancel by id alone would stop.
    attempt, calls = _started(tmp_path, monkeypatch, squeue=f'echo "RUNNING|{UID}|ito-run-1-sft-0-0123456789ab"')
    assert attempt.exit_code() is None  # sacct has no record of ours yet
    assert attempt.terminate(set(), grace_s=2.0) < 2.0
    assert _calls(calls, "scancel") == []


def test_an_older_jobs_accounting_under_the_same_id_is_not_the_attempts_end(tmp_path, monkeypatch):
    # `sacct -j` gives the latest job under the id: before ours is recorded, an older job's.
    gone = "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"
    record = tmp_path / "record"
    record.write_text("COMPLETED|0:0|ito-run-0-pre-7-ba9876543210\n")
    sacct = f'case "$*" in *JobName*) cat {record};; *) cut -d"|" -f1,2 {record};; esac'
    attempt, _ = _started(tmp_path, monkeypatch, squeue=gone, sacct=sacct)
    assert attempt.exit_code() is None
    record.write_text(f"COMPLETED|0:0|ito-run-0-pre-7-ba9876543210\nFAILED|3:0|{(tmp_path / 'name').read_text()}")
    assert attempt.exit_code() == 3


@pytest.mark.parametrize("wait_s,ends", [(0.3, False), (0.0, True)])
def test_a_job_out_of_the_queue_that_accounting_never_records_ends_after_the_wait(tmp_path, monkeypatch, wait_s, ends):
    """A cluster without slurmdbd: the supervisor would otherwise poll forever, its ranks' heartbeats
    saying finished (never hung). Read as exit 0: the supervisor then goes by the stage's result."""
    gone = "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"
    attempt, _ = _started(tmp_path, monkeypatch, squeue=gone, sacct="")
    attempt.accounting_wait_s = wait_s
    assert attempt.exit_code() == (0 if ends else None)
    if not ends:
        time.sleep(wait_s)
        assert attempt.exit_code() == 0
    assert "accounting has no record of it" in (tmp_path / "attempt-0.log").read_text()


def test_a_stop_ends_once_the_job_left_the_queue_though_its_accounting_lags(tmp_path, monkeypatch):
    from ito_assets.launch import slurm

    monkeypatch.setattr(slurm, "KILL_WAIT_S", 1.0)
    termed = tmp_path / "termed"
    attempt, calls = _started(tmp_path, monkeypatch, squeue=f'[ -e {termed} ] || echo "RUNNING|{UID}|$NAME"',
                              scancel=f"touch {termed}", sacct="")  # slurmdbd has no record yet
    seconds = attempt.terminate(set(), grace_s=5.0)
    assert seconds < 5.0  # the ranks left at the SIGTERM: not the whole grace period, nor KILL_WAIT_S
    assert _calls(calls, "scancel") == [["--signal=TERM", "4000"]]  # no plain scancel after a job that ended


def test_the_slurm_commands_run_without_the_users_settings_for_them(tmp_path, monkeypatch):
    from ito_assets.launch import slurm

    monkeypatch.setattr(slurm, "KILL_WAIT_S", 0.2)
    # SCANCEL_FULL would signal the batch shell with the steps: it dies before the ranks flush a
    # checkpoint. SQUEUE_STATES would hide a pending job from the look for left-over ones.
    monkeypatch.setenv("SCANCEL_FULL", "1")
    monkeypatch.setenv("SQUEUE_STATES", "RUNNING")
    monkeypatch.setenv("SBATCH_ACCOUNT", "ours")  # a site's default for sbatch: it still applies
    env = tmp_path / "env.log"
    attempt, _ = _started(tmp_path, monkeypatch, squeue=f'echo "RUNNING|{UID}|$NAME"; echo "squeue '
                                                        f'${{SQUEUE_STATES-unset}}" >> {env}',
                          scancel=f'echo "scancel ${{SCANCEL_FULL-unset}}" >> {env}',
                          before_sbatch=f'echo "sbatch ${{SBATCH_ACCOUNT-unset}}" >> {env}\n')
    attempt.terminate(set(), grace_s=0.2)
    assert set(env.read_text().splitlines()) == {"sbatch ours", "squeue unset", "scancel unset"}


def test_job_names_are_the_attempts_and_end_in_the_series_of_its_stage(tmp_path):
    from ito_assets.launch import slurm

    deep = tmp_path / ("d" * 200) / "stage" / "replica-1"
    spec = LaunchSpec(run_id="R_" + "x" * 61, nnodes=2, nproc_per_node=1, module="m")  # the longest run id
    name = slurm.job_name(spec, deep / "attempt-9.log")
    assert re.fullmatch(r"ito-[A-Za-z0-9_-]+-[0-9a-f]{12}", name) and len(name) <= 80, name
    assert slurm.series(deep / "attempt-0.log") == slurm.series(deep / "attempt-9.log")  # one series per folder
    assert slurm.series(deep / "attempt-0.log") != slurm.series(deep.parent / "attempt-0.log")  # per replica group
    assert f"#SBATCH --job-name={name}\n" in slurm.sbatch_script(spec, SLURM, name)
