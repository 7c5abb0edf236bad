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


# fake_slurm with what the back end reads besides: a job's name and owner (sbatch keeps them;
# squeue's -o fields %i %T %U %j and its -u listing, sacct's JobName, scancel's --name and --user
# filters), and a controller slow to register a job: with `slow-sbatch` in the state folder, the
# next sbatch never answers, and its job is registered only after a scancel looked for it.
NAMED_SLURM = """
import contextlib, io, json, os, re, sys, time
from pathlib import Path

sys.path.insert(0, RUNTIME_DIR)
import fake_slurm


def _field(job, key):
    return (job / key).read_text() if (job / key).exists() else ""


def _option(args, flag):
    return args[args.index(flag) + 1] if flag in args else None


def _value(args, prefix):
    return next((a[len(prefix):] for a in args if a.startswith(prefix)), None)


def _submit(state, args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = fake_slurm._sbatch(state, args)
    job = state / "jobs" / out.getvalue().strip()
    (job / "name").write_text(re.search(r"^#SBATCH --job-name=(.*)$", Path(args[-1]).read_text(), re.M).group(1))
    (job / "uid").write_text(str(os.geteuid()))
    print(job.name)
    return code


def _sbatch(state, args):
    if not (state / "slow-sbatch").exists():
        return _submit(state, args)
    (state / "slow-sbatch").unlink()
    if os.fork() == 0:  # the controller, which registers the job once a scancel has looked for it
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        deadline = time.time() + 60
        while not (state / "scancelled").exists() and time.time() < deadline:
            time.sleep(0.05)
        _submit(state, args)
        os._exit(0)
    time.sleep(60)  # sbatch never answers
    return 1


def _squeue(state, args):
    if "-j" in args:
        if not (state / "jobs" / _option(args, "-j")).exists():
            return fake_slurm._squeue(state, args)  # Invalid job id
        jobs = [state / "jobs" / _option(args, "-j")]
    else:
        jobs = [j for j in sorted((state / "jobs").iterdir()) if _field(j, "uid") == _option(args, "-u")]
    for job in (j for j in jobs if (j / "queued").exists()):
        fields = {"%i": job.name, "%T": "COMPLETING" if (job / "cancelled").exists() else "RUNNING",
                  "%U": _field(job, "uid"), "%j": _field(job, "name")}
        print(re.sub(r"%[iTUj]", lambda m: fields[m.group()], _option(args, "-o") or "%T"))
    return 0


def _sacct(state, args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = fake_slurm._sacct(state, args)
    name = _field(state / "jobs" / _option(args, "-j"), "name")
    for line in out.getvalue().splitlines():
        print(f"{line}|{name}" if "JobName" in (_option(args, "-o") or "") else line)
    return code


def _scancel(state, args):
    name, uid = _value(args, "--name="), _value(args, "--user=")
    ids = [a for a in args if not a.startswith("-")] or [j.name for j in (state / "jobs").iterdir()
                                                          if (j / "queued").exists()]
    code = 0
    for job in (state / "jobs" / job_id for job_id in ids):
        if name not in (None, _field(job, "name")) or uid not in (None, _field(job, "uid")):
            continue  # not the job the filters name
        code = max(code, fake_slurm._scancel(state, [*[a for a in args if a.startswith("--signal=")], job.name]))
    (state / "scancelled").touch()
    return code


def main(tool, state, args):
    state = Path(state)
    with open(state / "calls.jsonl", "a") as log:
        log.write(json.dumps({"tool": tool, "args": args, "at": time.time()}) + "\\n")
    return {"sbatch": _sbatch, "squeue": _squeue, "sacct": _sacct, "scancel": _scancel}[tool](state, args)
"""


@pytest.fixture
def slurm(tmp_path, monkeypatch) -> Path:
    """The fake Slurm's state folder; its tools first on PATH, sbatch, squeue, sacct and scancel
    through NAMED_SLURM."""
    state, bin_dir = tmp_path / "slurm", tmp_path / "bin"
    fake_slurm.install(bin_dir, state)
    runtime_dir = str(Path(fake_slurm.__file__).parent)
    (bin_dir / "named_slurm.py").write_text(NAMED_SLURM.replace("RUNTIME_DIR", repr(runtime_dir)))
    for tool in ("sbatch", "squeue", "sacct", "scancel"):
        (bin_dir / tool).write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(bin_dir)!r})\nimport named_slurm\n"
            f"sys.exit(named_slurm.main({tool!r}, {str(state)!r}, sys.argv[1:]))\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
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


def test_a_job_registered_after_the_lost_sbatchs_scancel_is_cancelled_by_the_next_start(tmp_path, slurm,
                                                                                         monkeypatch):
    """sbatch gets no answer; its scancel finds nothing, since the slow controller registers the job
    only after it; the job runs, unwatched. The next start, in the same stage folder, cancels it
    before it submits its own job, which runs."""
    from ito_assets.launch import slurm as slurm_launch

    monkeypatch.setattr(slurm_launch, "COMMAND_TIMEOUT_S", 5.0)  # the slow sbatch's wait; the fake's tools take ms
    module = tmp_path / "mods" / "sleeper.py"
    module.parent.mkdir()
    module.write_text("import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    stage = tmp_path / "stage"
    stage.mkdir()
    specs = [LaunchSpec(run_id=f"run-1-pre-{n}", nnodes=1, nproc_per_node=1, module="sleeper",
                        env=(("PYTHONPATH", str(module.parent)),)) for n in (0, 1)]
    logs = [stage / "attempt-0.log", stage / "attempt-1.log"]
    (slurm / "slow-sbatch").touch()

    with pytest.raises(RuntimeError, match="did not answer for attempt 0"):
        SlurmBackend(_settings()).start(specs[0], number=0, log_path=logs[0])
    _wait_for(lambda: "up" in _text(logs[0]), timeout=60)  # registered after all, and running
    orphan = str(fake_slurm.FIRST_JOB_ID)
    lost_name = (slurm / "jobs" / orphan / "name").read_text()  # what sbatch named it
    tools = [c["tool"] for c in fake_slurm.calls(slurm)]
    assert tools.index("scancel") < tools.index("job")  # the lost sbatch's scancel looked before it existed
    assert fake_slurm.job_processes(slurm, orphan, steps_only=False)

    attempt = SlurmBackend(_settings()).start(specs[1], number=1, log_path=logs[1])  # e.g. a retried step's

    assert attempt.job_id != orphan
    uid = str(os.geteuid())
    assert [c["args"] for c in fake_slurm.calls(slurm) if c["tool"] == "scancel"] == [
        [f"--name={lost_name}", f"--user={uid}"], [f"--name={lost_name}", f"--user={uid}", orphan]]
    _wait_for(lambda: (slurm / "jobs" / orphan / "sacct").exists(), timeout=30)
    assert _accounting(slurm)[0].startswith("CANCELLED by ")
    assert fake_slurm.job_processes(slurm, orphan, steps_only=False) == []
    assert (f"--- job {orphan} ({lost_name}, RUNNING), left by an earlier start of this stage: cancelled before "
            f"attempt 1's") in logs[1].read_text()
    _wait_for(lambda: "up" in _text(logs[1]), timeout=60)
    assert attempt.exit_code() is None  # the new attempt runs, and alone
    attempt.terminate(set(), grace_s=5.0)
    assert fake_slurm.job_processes(slurm, attempt.job_id, steps_only=False) == []
    assert lost_name == slurm_launch.job_name(specs[0], logs[0])


def _start(supervisor: Supervisor) -> tuple[threading.Thread, list[SupervisionReport]]:
    reports: list[SupervisionReport] = []
    thread = threading.Thread(target=lambda: reports.append(supervisor.run()), daemon=True)
    thread.start()
    return thread, reports


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


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
