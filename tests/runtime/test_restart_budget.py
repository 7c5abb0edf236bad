"""The supervisor's restart budget, pinned at its boundaries with a fake back end (no torchrun):
a stage fails after exactly `max_restarts + 1` unplanned ends, planned ends cost nothing, and one
success inside the budget succeeds. A fake clock makes the hang and start-up bounds exact.

Every fake back end refuses to start more than `START_LIMIT` attempts, every fake attempt refuses
more than `POLL_LIMIT` polls, and every test has a timeout, so a supervisor that restarts or polls
forever fails the test instead of hanging it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest

from ito_assets.launch.backend import BackendKind, LaunchConfig
from ito_assets.launch.slurm import SlurmSettings
from ito_assets.runtime.record import events
from ito_assets.runtime.supervision import heartbeat
from ito_assets.runtime.supervision import launch
from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.supervision import proposals
from ito_assets.runtime.supervision import supervisor as supervisor_module
from ito_assets.runtime.stage.config import CONFIG_NAME, RESULT_NAME
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.supervision.proposals import ProposalState, ProposalStore
from ito_assets.runtime.supervision.spikes import Spike
from ito_assets.runtime.supervision.supervisor import (
    MAX_WAIT_S,
    REPORT_NAME,
    AttemptEnd,
    Outcome,
    Supervisor,
    SupervisorConfig,
    main,
    stage_arguments,
)
from runtime_helpers import worker_config

pytestmark = pytest.mark.timeout(30)

START_LIMIT = 12  # far above every budget below: reaching it means the supervisor never gave up
POLL_LIMIT = 500  # polls of one attempt: reaching it means the supervisor never noticed its end
T0 = 1_000.0  # the fake clock's start (exactly representable, as are all offsets below)


class BudgetOverrun(AssertionError):
    pass


class FakeClock:
    """Stands in for the supervisor's `time` module: `sleep` advances the clock at once."""

    def __init__(self, now: float = T0):
        self.now = now
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass
class FakeAttempt:
    number: int
    launched_at: float
    code: int | None = None  # what every poll returns until terminated
    on_poll: Callable[["FakeAttempt"], None] | None = None
    polls: int = 0
    terminations: list[tuple[set[int], float]] = field(default_factory=list)
    releases: int = 0
    sleep: Callable[[float], None] | None = None  # the test's clock: a poll interval passes on it

    def wait(self, timeout_s: float) -> None:
        (self.sleep or supervisor_module.time.sleep)(timeout_s)

    def exit_code(self) -> int | None:
        self.polls += 1
        if self.polls > POLL_LIMIT:
            raise BudgetOverrun(f"attempt {self.number} was polled more than {POLL_LIMIT} times")
        if self.on_poll is not None:
            self.on_poll(self)
        return self.code

    def terminate(self, worker_pids: set[int], *, grace_s: float) -> float:
        self.terminations.append((set(worker_pids), grace_s))
        if self.code is None:
            self.code = -15
        return 0.0

    def release(self) -> None:
        self.releases += 1


def write_beat(folder: Path, *, rank: int, attempt: int, step: int, phase: str, at: float,
               pid: int | None = None, detail: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    beat = heartbeat.Heartbeat(rank=rank, pid=pid or os.getpid(), attempt=attempt, step=step, phase=phase, at=at,
                               detail=detail)
    heartbeat.heartbeat_path(folder, rank).write_text(json.dumps(asdict(beat)))


class FakeBackend:
    """Plays one scripted behaviour per attempt; past the script, `default`.

    Behaviours: "fail" (exits 1 at once), "succeed" (writes result.json, exits 0), "exit0" (exits 0
    without a result), "run" (runs until terminated), or a callable (attempt, backend) -> None that
    sets the attempt up itself."""

    def __init__(self, worker, script=(), *, default="fail", clock: FakeClock | None = None):
        self.worker = worker
        self.script = list(script)
        self.default = default
        self.clock = clock
        self.started: list[FakeAttempt] = []
        self.tries = 0  # starts asked for, those that raised included: the script's index
        self.specs = []
        self.log_paths: list[Path] = []

    @property
    def stage_dir(self) -> Path:
        return Path(self.worker.stage_dir)

    @property
    def heartbeat_dir(self) -> Path:
        return Path(self.worker.heartbeat_dir)

    def now(self) -> float:
        return self.clock.time() if self.clock is not None else supervisor_module.time.time()

    def start(self, spec, *, number: int, log_path: Path) -> FakeAttempt:
        if len(self.started) >= START_LIMIT:
            raise BudgetOverrun(f"the supervisor started more than {START_LIMIT} attempts")
        index, self.tries = self.tries, self.tries + 1
        behaviour = self.script[index] if index < len(self.script) else self.default
        attempt = FakeAttempt(number=number, launched_at=self.now(),
                              sleep=self.clock.sleep if self.clock is not None else None)
        if behaviour == "fail":
            attempt.code = 1
        elif behaviour == "succeed":
            (self.stage_dir / RESULT_NAME).write_text(json.dumps({"num_steps": 24, "attempt": number}))
            attempt.code = 0
        elif behaviour == "exit0":
            attempt.code = 0
        elif behaviour == "run":
            attempt.code = None
        else:
            behaviour(attempt, self)
        self.started.append(attempt)
        self.specs.append(spec)
        self.log_paths.append(log_path)
        return attempt


def _worker(tmp_path: Path):
    # The fake back end never reads the token shards: they need not exist.
    return worker_config(tmp_path, (tmp_path / "train.npy", tmp_path / "heldout.npy"))


def _config(**changes) -> SupervisorConfig:
    base = dict(hang_timeout_s=3.0, startup_timeout_s=5.0, poll_interval_s=1.0, grace_s=2.0, max_restarts=0)
    return SupervisorConfig(**{**base, **changes})


def _supervise(tmp_path: Path, script=(), *, default="fail", clock: FakeClock | None = None, **changes):
    worker = _worker(tmp_path)
    backend = FakeBackend(worker, script, default=default, clock=clock)
    supervisor = Supervisor(worker=worker, config=_config(**changes), backend=backend)
    return supervisor, backend


def _keep_running(attempt: FakeAttempt, on_poll) -> None:
    """The attempt runs on, and `on_poll(running)` scripts what each poll of it sees."""
    attempt.code = None
    attempt.on_poll = on_poll


def _finish(backend: FakeBackend, running: FakeAttempt) -> None:
    """The attempt writes its result and exits 0: a finished stage."""
    (backend.stage_dir / RESULT_NAME).write_text("{}")
    running.code = 0


def _events(stage_dir: Path, kind: EventKind) -> list[events.Event]:
    return [e for e in events.read(stage_dir) if e.kind is kind]


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(supervisor_module, "time", SimpleNamespace(time=fake.time, sleep=fake.sleep))
    return fake


# --- the budget: exactly max_restarts + 1 unplanned ends -----------------------------------------


@pytest.mark.parametrize("max_restarts", [0, 1, 2])
def test_failing_attempts_exhaust_the_budget_after_exactly_max_restarts_plus_one(tmp_path, max_restarts):
    supervisor, backend = _supervise(tmp_path, max_restarts=max_restarts)
    report = supervisor.run()
    assert report.outcome is Outcome.FAILED
    assert report.num_attempts == max_restarts + 1
    assert len(backend.started) == max_restarts + 1
    assert [a.number for a in backend.started] == list(range(max_restarts + 1))
    assert [f.kind for f in report.faults] == [AttemptEnd.DEAD] * (max_restarts + 1)
    assert [f.attempt for f in report.faults] == list(range(max_restarts + 1))
    assert not any(f.planned for f in report.faults)
    assert report.result is None
    stage_dir = Path(supervisor.worker.stage_dir)
    interruptions = _events(stage_dir, EventKind.INTERRUPTION)
    assert [(e.attempt, e.planned, e.detail) for e in interruptions] == [
        (n, False, "dead") for n in range(max_restarts + 1)]
    written = json.loads((stage_dir / REPORT_NAME).read_text())
    assert written["outcome"] == "failed" and written["num_attempts"] == max_restarts + 1
    assert written["result"] is None and len(written["faults"]) == max_restarts + 1


@pytest.mark.parametrize("max_restarts", [0, 1, 2])
def test_a_success_on_the_last_attempt_inside_the_budget_succeeds(tmp_path, max_restarts):
    script = ["fail"] * max_restarts + ["succeed"]
    supervisor, backend = _supervise(tmp_path, script, max_restarts=max_restarts)
    report = supervisor.run()
    assert report.outcome is Outcome.SUCCEEDED
    assert report.num_attempts == max_restarts + 1 == len(backend.started)
    assert len(report.faults) == max_restarts
    assert report.result == {"num_steps": 24, "attempt": max_restarts}
    assert backend.started[-1].releases == 1  # an attempt that finished on its own is released
    assert all(a.releases == 0 for a in backend.started[:-1])
    written = json.loads((Path(supervisor.worker.stage_dir) / REPORT_NAME).read_text())
    assert written["outcome"] == "succeeded" and written["result"] == report.result


@pytest.mark.parametrize("max_restarts", [0, 1, 2])
def test_one_failure_more_than_the_budget_fails_even_if_the_next_attempt_would_succeed(tmp_path, max_restarts):
    script = ["fail"] * (max_restarts + 1) + ["succeed"]
    supervisor, backend = _supervise(tmp_path, script, max_restarts=max_restarts)
    report = supervisor.run()
    assert report.outcome is Outcome.FAILED and report.num_attempts == max_restarts + 1
    assert len(backend.started) == max_restarts + 1


def test_a_first_attempt_that_succeeds_costs_no_restart(tmp_path):
    supervisor, backend = _supervise(tmp_path, ["succeed"], max_restarts=0)
    report = supervisor.run()
    assert report.outcome is Outcome.SUCCEEDED and report.num_attempts == 1 and report.faults == ()
    assert backend.started[0].terminations == []  # nothing to stop


def test_exit_zero_without_a_result_is_a_dead_attempt_not_a_finished_one(tmp_path):
    supervisor, backend = _supervise(tmp_path, ["exit0", "succeed"], max_restarts=1)
    report = supervisor.run()
    assert report.outcome is Outcome.SUCCEEDED and report.num_attempts == 2
    assert [f.kind for f in report.faults] == [AttemptEnd.DEAD]
    supervisor, _ = _supervise(tmp_path / "again", ["exit0"], max_restarts=0)
    assert supervisor.run().outcome is Outcome.FAILED


def test_a_non_zero_exit_is_dead_even_with_a_result_on_disk(tmp_path):
    def fail_with_result(attempt, backend):
        (backend.stage_dir / RESULT_NAME).write_text("{}")
        attempt.code = 1

    supervisor, _ = _supervise(tmp_path, [fail_with_result], max_restarts=0)
    report = supervisor.run()
    assert report.outcome is Outcome.FAILED and report.result is None


def test_a_dead_attempt_is_terminated_with_the_heartbeat_pids_and_the_grace(tmp_path):
    def dies_after_a_beat(attempt, backend):
        write_beat(backend.heartbeat_dir, rank=0, attempt=attempt.number, step=3, phase="training",
                   at=backend.now())
        attempt.code = 1

    supervisor, backend = _supervise(tmp_path, [dies_after_a_beat], max_restarts=0, grace_s=2.5)
    supervisor.run()
    assert backend.started[0].terminations == [({os.getpid()}, 2.5)]


# --- planned ends cost nothing ---------------------------------------------------------------------


def _spike() -> Spike:
    return Spike(step=20, metric="loss", value=9.0, mean=3.0, std=0.1)


def _add_proposal(stage_dir: Path, worker, *, restart_from_step: int = 16) -> str:
    proposal = ProposalStore(stage_dir).add(proposals.propose(
        _spike(), run_key=worker.run_key, stage=worker.stage, restart_from_step=restart_from_step,
        skip_first=restart_from_step, skip_end=21))
    return proposal.proposal_id


def _approves_on_first_poll(proposal_id: str):
    def behaviour(attempt, backend):
        def on_poll(running):
            if running.polls == 1:
                proposals.decide(backend.stage_dir, proposal_id, approve=True, actor="desk:alice")
        _keep_running(attempt, on_poll)
    return behaviour


def _whole_checkpoint(stage_dir: Path, step: int) -> Path:
    folder = markers.checkpoint_dir(stage_dir, step)
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"m")
    markers.write_marker(folder, step)
    return folder


def test_a_planned_spike_restart_does_not_consume_the_budget(tmp_path):
    worker = _worker(tmp_path)
    stage_dir = Path(worker.stage_dir)
    stage_dir.mkdir(parents=True)
    proposal_id = _add_proposal(stage_dir, worker, restart_from_step=16)
    for step in (8, 16, 24):
        _whole_checkpoint(stage_dir, step)
    backend = FakeBackend(worker, [_approves_on_first_poll(proposal_id), "succeed"])
    supervisor = Supervisor(worker=worker, config=_config(max_restarts=0), backend=backend)
    report = supervisor.run()
    assert report.outcome is Outcome.SUCCEEDED and report.num_attempts == 2
    (fault,) = report.faults
    assert fault.kind is AttemptEnd.SPIKE_RESTART and fault.planned
    assert 0.0 <= fault.detection_seconds < 1.0  # decided at the approval
    assert backend.started[0].terminations  # the running attempt was stopped for the restart
    # The checkpoint at exactly the restart step stays; the one after it is set aside.
    assert [markers.step_of(p) for p in markers.candidates(stage_dir)] == [16, 8]
    assert [p.name for p in stage_dir.glob("discarded-*")] == [f"discarded-step-000000024-{proposal_id}"]
    assert ProposalStore(stage_dir).get(proposal_id).state is ProposalState.APPLIED
    (interruption,) = _events(stage_dir, EventKind.INTERRUPTION)
    assert interruption.planned is True and interruption.detail == "spike_restart"
    second = json.loads((stage_dir / "attempt-1.json").read_text())
    assert second["skip_ranges"] == [[16, 21]] and second["attempt"] == 1


def test_a_planned_restart_then_a_death_exhausts_a_zero_budget_after_two_attempts(tmp_path):
    worker = _worker(tmp_path)
    stage_dir = Path(worker.stage_dir)
    stage_dir.mkdir(parents=True)
    proposal_id = _add_proposal(stage_dir, worker)
    backend = FakeBackend(worker, [_approves_on_first_poll(proposal_id), "fail", "succeed"])
    report = Supervisor(worker=worker, config=_config(max_restarts=0), backend=backend).run()
    assert report.outcome is Outcome.FAILED and report.num_attempts == 2 and len(backend.started) == 2
    assert [(f.kind, f.planned) for f in report.faults] == [(AttemptEnd.SPIKE_RESTART, True),
                                                            (AttemptEnd.DEAD, False)]


def test_a_proposal_approved_after_the_stage_ended_is_applied_before_the_next_attempt(tmp_path):
    worker = _worker(tmp_path)
    stage_dir = Path(worker.stage_dir)
    stage_dir.mkdir(parents=True)
    (stage_dir / RESULT_NAME).write_text(json.dumps({"num_steps": 24}))  # the stage had finished
    proposal_id = _add_proposal(stage_dir, worker, restart_from_step=8)
    proposals.decide(stage_dir, proposal_id, approve=True, actor="desk:alice")
    for step in (8, 16):
        _whole_checkpoint(stage_dir, step)
    # exit 0 without writing a result: finished only if the old result.json survived (it must not)
    backend = FakeBackend(worker, ["exit0"])
    report = Supervisor(worker=worker, config=_config(max_restarts=0), backend=backend).run()
    assert report.outcome is Outcome.FAILED and report.num_attempts == 1
    assert ProposalStore(stage_dir).get(proposal_id).state is ProposalState.APPLIED
    assert [markers.step_of(p) for p in markers.candidates(stage_dir)] == [8]
    assert json.loads((stage_dir / "attempt-0.json").read_text())["skip_ranges"] == [[8, 21]]


# --- stops ------------------------------------------------------------------------------------------


def test_a_stop_request_ends_the_stage_stopped_without_a_restart(tmp_path):
    supervisor = None

    def stop_on_first_poll(attempt, backend):
        _keep_running(attempt, lambda running: supervisor.request_stop())

    supervisor, backend = _supervise(tmp_path, [stop_on_first_poll, "succeed"], max_restarts=3)
    report = supervisor.run()
    assert report.outcome is Outcome.STOPPED and report.num_attempts == 1 and len(backend.started) == 1
    (fault,) = report.faults
    assert fault.kind is AttemptEnd.STOPPED and fault.planned
    assert 0.0 <= fault.detection_seconds < 1.0  # decided at the request, not timed from the launch
    assert backend.started[0].terminations  # the workers were asked to flush and stop
    assert report.result is None


def test_a_stop_requested_before_the_first_attempt_launches_nothing(tmp_path):
    supervisor, backend = _supervise(tmp_path, ["succeed"], max_restarts=3)
    supervisor.request_stop()  # a SIGTERM while the stage was still starting up
    report = supervisor.run()
    assert (report.outcome, report.num_attempts, backend.started) == (Outcome.STOPPED, 0, [])


def test_a_stop_requested_while_a_dead_attempt_is_ended_launches_no_other(tmp_path):
    """A restart would submit a job (on a cluster, to a queue) only for its first poll to cancel it."""
    supervisor = None

    def dies_and_the_desk_stops(attempt, backend):
        attempt.code = 1
        terminate = attempt.terminate

        def stop_meanwhile(pids, *, grace_s):
            supervisor.request_stop()
            return terminate(pids, grace_s=grace_s)

        attempt.terminate = stop_meanwhile

    supervisor, backend = _supervise(tmp_path, [dies_and_the_desk_stops, "succeed"], max_restarts=3)
    report = supervisor.run()
    assert (report.outcome, report.num_attempts, len(backend.started)) == (Outcome.STOPPED, 1, 1)
    assert [f.kind for f in report.faults] == [AttemptEnd.DEAD]


def _all_ranks_stopped(world_size: int, *, code: int = 143, step: int = 5):
    def behaviour(attempt, backend):
        for rank in range(world_size):
            write_beat(backend.heartbeat_dir, rank=rank, attempt=attempt.number, step=step, phase="stopped",
                       at=backend.now())
        attempt.code = code
    return behaviour


def _stopping_at(tmp_path: Path, stop_after_step: int | None, script, **changes):
    """`_supervise` with the worker's planned stop at `stop_after_step`."""
    worker = replace(_worker(tmp_path), stop_after_step=stop_after_step)
    backend = FakeBackend(worker, script)
    return Supervisor(worker=worker, config=_config(**changes), backend=backend), backend


@pytest.mark.parametrize("code", [0, 143])
def test_an_exit_after_every_rank_flushed_at_the_planned_step_is_a_planned_stop(tmp_path, code):
    supervisor, backend = _stopping_at(tmp_path, 5, [_all_ranks_stopped(2, code=code), "succeed"],
                                       max_restarts=3, nproc_per_node=2)
    report = supervisor.run()
    assert report.outcome is Outcome.STOPPED and report.num_attempts == 1 and len(backend.started) == 1
    assert [(f.kind, f.planned) for f in report.faults] == [(AttemptEnd.STOPPED, True)]


@pytest.mark.parametrize("stop_after_step,stopped_at", [(None, 5), (5, 4), (5, 6)])
def test_ranks_stopped_by_a_signal_the_supervisor_did_not_send_are_resumed(tmp_path, stop_after_step, stopped_at):
    """A Kubernetes deadline, a node drain or a Slurm time limit sends the ranks SIGTERM: they flush
    and beat `stopped`, and the launch exits (124 past a Job's deadline). Nobody asked the stage to
    stop: before the fix it ended STOPPED, its run never finished. Below and above the planned step too."""
    supervisor, backend = _stopping_at(tmp_path, stop_after_step, [_all_ranks_stopped(2, code=124, step=stopped_at),
                                                                   "succeed"], max_restarts=1, nproc_per_node=2)
    report = supervisor.run()
    assert (report.outcome, report.num_attempts, len(backend.started)) == (Outcome.SUCCEEDED, 2, 2)
    assert [(f.kind, f.planned) for f in report.faults] == [(AttemptEnd.TERMINATED, False)]
    (interruption,) = _events(supervisor.stage_dir, EventKind.INTERRUPTION)
    assert (interruption.detail, interruption.planned) == ("terminated", False)


def test_unasked_stops_spend_the_restart_budget(tmp_path):
    supervisor, backend = _supervise(tmp_path, [_all_ranks_stopped(1, code=124)] * 2 + ["succeed"], max_restarts=1)
    report = supervisor.run()
    assert (report.outcome, report.num_attempts) == (Outcome.FAILED, 2)
    assert [f.kind for f in report.faults] == [AttemptEnd.TERMINATED] * 2


def test_ranks_that_stopped_on_the_supervisors_request_before_its_poll_are_a_planned_stop(tmp_path):
    """SIGTERM to the whole process group (Dagster ending the run): the ranks may have flushed and
    exited by the supervisor's first poll after its own request."""
    supervisor = None

    def asked_and_stopped(attempt, backend):
        supervisor.request_stop()
        _all_ranks_stopped(1, code=1, step=3)(attempt, backend)

    supervisor, backend = _supervise(tmp_path, [asked_and_stopped, "succeed"], max_restarts=3)
    report = supervisor.run()
    assert (report.outcome, len(backend.started)) == (Outcome.STOPPED, 1)
    assert [(f.kind, f.planned) for f in report.faults] == [(AttemptEnd.STOPPED, True)]


def test_an_exit_with_only_some_ranks_stopped_is_a_death(tmp_path):
    supervisor, backend = _supervise(tmp_path, [_all_ranks_stopped(1), "succeed"], max_restarts=1,
                                     nproc_per_node=2)
    report = supervisor.run()
    assert report.outcome is Outcome.SUCCEEDED and report.num_attempts == 2
    assert [f.kind for f in report.faults] == [AttemptEnd.DEAD]


def test_an_exit_with_a_rank_not_stopped_is_a_death(tmp_path):
    def mixed(attempt, backend):
        write_beat(backend.heartbeat_dir, rank=0, attempt=attempt.number, step=5, phase="stopped", at=backend.now())
        write_beat(backend.heartbeat_dir, rank=1, attempt=attempt.number, step=5, phase="training", at=backend.now())
        attempt.code = 1

    supervisor, _ = _supervise(tmp_path, [mixed], max_restarts=0, nproc_per_node=2)
    assert supervisor.run().faults[0].kind is AttemptEnd.DEAD


# --- numbering, launch spec, records -------------------------------------------------------------------


def test_attempt_numbers_continue_across_supervisor_runs_of_the_same_stage(tmp_path):
    supervisor, backend = _supervise(tmp_path, max_restarts=1)
    assert supervisor.run().num_attempts == 2
    worker = supervisor.worker
    again = FakeBackend(worker, ["fail", "succeed"])
    report = Supervisor(worker=worker, config=_config(max_restarts=1), backend=again).run()
    assert [a.number for a in again.started] == [2, 3]
    assert report.outcome is Outcome.SUCCEEDED and report.num_attempts == 2  # this run's attempts only
    stage_dir = Path(worker.stage_dir)
    assert sorted(p.name for p in stage_dir.glob("attempt-*.json")) == [f"attempt-{n}.json" for n in range(4)]
    allocations = _events(stage_dir, EventKind.ALLOCATION)
    assert [e.attempt for e in allocations] == [1, 3]


def test_each_replica_group_launches_under_its_own_ids(tmp_path):
    """The back ends name an attempt's jobs by its rendezvous id (Slurm's job name, which a lost
    sbatch is cancelled by; a Kubernetes Job's name): two groups of one stage, started beside each
    other, must never share one, or one group's cleanup would cancel the other."""
    from ito_assets.runtime.supervision.replicas import group_worker

    stage = replace(_worker(tmp_path), replica_groups=2)
    ids = []
    for replica in (0, 1):
        worker = group_worker(stage, replica)
        backend = FakeBackend(worker, ["fail", "succeed"])
        Supervisor(worker=worker, config=_config(max_restarts=1), backend=backend).run()
        ids += [spec.run_id for spec in backend.specs]
    assert ids == ["run-test-pretraining-0", "run-test-pretraining-1",
                   "run-test-pretraining-replica-1-0", "run-test-pretraining-replica-1-1"]


@pytest.mark.parametrize("ending", ["failed", "stopped"])
def test_a_later_run_counts_only_its_own_attempts_whatever_the_outcome(tmp_path, ending):
    supervisor, _ = _supervise(tmp_path, max_restarts=2)
    assert supervisor.run().num_attempts == 3  # attempts 0, 1, 2
    worker = supervisor.worker
    if ending == "failed":
        again = FakeBackend(worker, ["fail", "fail"])
        expected = (Outcome.FAILED, 2)
    else:
        worker = replace(worker, stop_after_step=5)
        again = FakeBackend(worker, ["fail", _all_ranks_stopped(1, step=5)])
        expected = (Outcome.STOPPED, 2)
    report = Supervisor(worker=worker, config=_config(max_restarts=1), backend=again).run()
    assert [a.number for a in again.started] == [3, 4]
    assert (report.outcome, report.num_attempts) == expected


def test_the_first_attempt_of_a_fresh_stage_is_number_zero(tmp_path):
    supervisor, backend = _supervise(tmp_path, ["succeed"])
    supervisor.run()
    assert backend.started[0].number == 0
    assert json.loads((Path(supervisor.worker.stage_dir) / "attempt-0.json").read_text())["attempt"] == 0


def test_each_attempt_gets_its_own_config_rendezvous_and_log(tmp_path):
    worker = _worker(tmp_path)
    backend = FakeBackend(worker, ["fail", "succeed"])
    supervisor = Supervisor(worker=worker, config=_config(max_restarts=1, nnodes=2, nproc_per_node=3),
                            backend=backend, env={"B_VAR": "2", "A_VAR": "1"})
    supervisor.run()
    stage_dir = Path(worker.stage_dir)
    for number, spec in enumerate(backend.specs):
        assert spec.run_id == f"{worker.run_key}-{worker.stage}-{number}"
        assert spec.nnodes == 2 and spec.nproc_per_node == 3
        assert spec.module == launch.WORKER_MODULE
        assert spec.args == ("--config", str(stage_dir / f"attempt-{number}.json"))
        assert spec.env[-2:] == (("A_VAR", "1"), ("B_VAR", "2"))
        assert backend.log_paths[number] == stage_dir / f"attempt-{number}.log"
    (allocation,) = _events(stage_dir, EventKind.ALLOCATION)
    assert allocation.num_devices == 6 and allocation.attempt == 1


def test_the_launch_clears_the_previous_attempts_heartbeats(tmp_path):
    worker = _worker(tmp_path)
    stale = Path(worker.heartbeat_dir)
    write_beat(stale, rank=0, attempt=0, step=9, phase="stopped", at=1.0)
    seen = []

    def look(attempt, backend):
        seen.append(sorted(p.name for p in backend.heartbeat_dir.glob("rank*.json")))
        attempt.code = 1

    backend = FakeBackend(worker, [look])
    Supervisor(worker=worker, config=_config(), backend=backend).run()
    assert seen == [[]]


def test_the_supervisor_uses_the_backend_it_was_given_else_the_configs(tmp_path, monkeypatch):
    worker = _worker(tmp_path)
    given = FakeBackend(worker)
    assert Supervisor(worker=worker, config=_config(), backend=given).backend is given
    chosen = FakeBackend(worker)
    asked = []
    monkeypatch.setattr(launch, "backend_for", lambda config: asked.append(config) or chosen)
    supervisor = Supervisor(worker=worker, config=_config())
    assert supervisor.backend is chosen and asked == [supervisor.config.launch]


def test_heartbeats_of_another_attempt_are_ignored(tmp_path):
    # A rank of the previous attempt that outlived the launch writes a late heartbeat: it neither
    # decides how this attempt ended nor gets this attempt's termination signal.
    def late_old_rank(attempt, backend):
        write_beat(backend.heartbeat_dir, rank=0, attempt=attempt.number - 1, step=5, phase="stopped",
                   at=backend.now(), pid=1)
        attempt.code = 1

    supervisor, backend = _supervise(tmp_path, ["fail", late_old_rank, "succeed"], max_restarts=1, grace_s=2.0)
    report = supervisor.run()
    assert report.outcome is Outcome.FAILED  # a dead attempt, not a planned stop
    assert [f.kind for f in report.faults] == [AttemptEnd.DEAD, AttemptEnd.DEAD]
    assert backend.started[1].terminations == [(set(), 2.0)]


def test_the_supervision_report_file_has_sorted_keys(tmp_path):
    supervisor, _ = _supervise(tmp_path, ["succeed"])
    supervisor.run()
    text = (Path(supervisor.worker.stage_dir) / REPORT_NAME).read_text()
    assert list(json.loads(text)) == sorted(json.loads(text))
    assert text == json.dumps(json.loads(text), sort_keys=True)


# --- detection and recovery seconds, hang and start-up bounds (fake clock) ----------------------------


def _running_with_beats(phase: str, *, world_size: int = 1, step: int = 4, at_offset: float = 0.0):
    def behaviour(attempt, backend):
        for rank in range(world_size):
            write_beat(backend.heartbeat_dir, rank=rank, attempt=attempt.number, step=step, phase=phase,
                       at=backend.now() + at_offset)
        attempt.code = None
    return behaviour


def test_a_silent_rank_is_hung_only_once_its_heartbeat_is_older_than_the_bound(tmp_path, clock):
    # beat at T0; polls every 1 s; hang bound 3 s: T0+3 is not past the bound, T0+4 is.
    supervisor, backend = _supervise(tmp_path, [_running_with_beats("training")], clock=clock,
                                     hang_timeout_s=3.0, startup_timeout_s=50.0, max_restarts=0)
    report = supervisor.run()
    (fault,) = report.faults
    assert fault.kind is AttemptEnd.HUNG and not fault.planned
    assert fault.detected_at == T0 + 4.0 and fault.detection_seconds == 4.0
    assert backend.started[0].polls == 5 and clock.sleeps == [1.0] * 4
    assert report.outcome is Outcome.FAILED
    (interruption,) = _events(Path(supervisor.worker.stage_dir), EventKind.INTERRUPTION)
    assert interruption.seconds == 4.0 and interruption.detail == "hung" and interruption.planned is False
    assert interruption.at == T0 + 4.0
    config = json.loads((Path(supervisor.worker.stage_dir) / "attempt-0.json").read_text())
    assert config["launched_at"] == T0 and config["attempt"] == 0


def _beating_every_poll(phase: str, *, advance: bool):
    """A rank that writes a fresh heartbeat at every poll (the fake clock's time), at one step or one further each time."""
    def behaviour(attempt, backend):
        def on_poll(running):
            step = 4 + (running.polls if advance else 0)
            write_beat(backend.heartbeat_dir, rank=0, attempt=running.number, step=step, phase=phase, at=backend.now())
        _keep_running(attempt, on_poll)
    return behaviour


def test_a_rank_that_beats_at_one_training_step_is_hung_once_the_step_is_older_than_the_bound(tmp_path, clock):
    """A replica group whose steps are never committed beats "training" at the same step, again and
    again, with fresh times: alive by its times, it makes no progress, and is taken for hung at the
    hang bound from the first beat of that step, as a silent rank is (T0 + 3 is not past it, T0 + 4 is)."""
    supervisor, backend = _supervise(tmp_path, [_beating_every_poll("training", advance=False)], clock=clock,
                                     hang_timeout_s=3.0, startup_timeout_s=50.0, max_restarts=0)
    (fault,) = supervisor.run().faults
    assert fault.kind is AttemptEnd.HUNG and fault.detected_at == T0 + 4.0 and fault.detection_seconds == 4.0
    assert backend.started[0].polls == 5


@pytest.mark.parametrize("phase,advance", [("training", True), ("checkpointing", False), ("evaluating", False),
                                           ("awaiting_desk", False)])
def test_a_rank_that_progresses_or_ticks_through_a_long_phase_is_never_hung(tmp_path, clock, phase, advance):
    def stop_after_the_bound(attempt, backend):
        _beating_every_poll(phase, advance=advance)(attempt, backend)
        beat = attempt.on_poll

        def on_poll(running):
            beat(running)
            if running.polls == 12:  # four times the hang bound
                running.code = 1
        attempt.on_poll = on_poll

    supervisor, backend = _supervise(tmp_path, [stop_after_the_bound], clock=clock, hang_timeout_s=3.0,
                                     startup_timeout_s=50.0, max_restarts=0)
    (fault,) = supervisor.run().faults
    assert fault.kind is AttemptEnd.DEAD and backend.started[0].polls == 12


def test_a_rank_still_starting_has_the_start_up_bound_not_the_hang_bound(tmp_path, clock):
    supervisor, backend = _supervise(tmp_path, [_running_with_beats("starting")], clock=clock,
                                     hang_timeout_s=2.0, startup_timeout_s=6.0, max_restarts=0)
    (fault,) = supervisor.run().faults
    assert fault.kind is AttemptEnd.HUNG and fault.detection_seconds == 7.0


def test_no_heartbeat_at_all_is_hung_once_past_the_start_up_bound(tmp_path, clock):
    supervisor, backend = _supervise(tmp_path, ["run"], clock=clock, hang_timeout_s=2.0, startup_timeout_s=5.0,
                                     max_restarts=0)
    (fault,) = supervisor.run().faults
    assert fault.kind is AttemptEnd.HUNG
    assert fault.detected_at == T0 + 6.0 and fault.detection_seconds == 6.0  # from the launch


def test_fewer_heartbeats_than_ranks_keep_the_start_up_bound(tmp_path, clock):
    # world size 2, one rank beating: the attempt is still starting up, the hang bound does not apply.
    supervisor, backend = _supervise(tmp_path, [_running_with_beats("training", world_size=1)], clock=clock,
                                     nproc_per_node=2, hang_timeout_s=2.0, startup_timeout_s=5.0, max_restarts=0)
    (fault,) = supervisor.run().faults
    assert fault.kind is AttemptEnd.HUNG and fault.detected_at == T0 + 6.0


def _ended_then(phase: str, *, exit_at_poll: int | None = None, result: bool = False):
    """One rank beats `phase` at T0 (step 4), with the result written first where `result`; its
    launch exits 1 at poll `exit_at_poll`, or never (a teardown that hangs)."""
    def behaviour(attempt, backend):
        if result:
            (backend.stage_dir / RESULT_NAME).write_text(json.dumps({"num_steps": 4}))
        write_beat(backend.heartbeat_dir, rank=0, attempt=attempt.number, step=4, phase=phase, at=backend.now())

        def on_poll(running):
            if running.polls == exit_at_poll:
                running.code = 1
        _keep_running(attempt, on_poll)
    return behaviour


@pytest.mark.parametrize("phase", ["finished", "stopped"])
def test_a_finished_or_stopped_rank_that_exits_within_the_hang_bound_is_not_hung(tmp_path, clock, phase):
    # beat at T0, polls at T0, T0+1, T0+2 (= the 2 s bound, not past it): the exit at that poll is seen as an exit.
    supervisor, backend = _supervise(tmp_path, [_ended_then(phase, exit_at_poll=3)], clock=clock,
                                     hang_timeout_s=2.0, startup_timeout_s=3.0, max_restarts=0)
    (fault,) = supervisor.run().faults
    assert fault.kind is not AttemptEnd.HUNG and backend.started[0].polls == 3


@pytest.mark.parametrize("phase,result,kind", [
    ("finished", False, AttemptEnd.HUNG),  # rank 0 writes the result before it beats `finished`
    ("stopped", False, AttemptEnd.TERMINATED),  # flushed on a SIGTERM nobody here sent: resumed
])
def test_a_rank_that_ended_but_never_exits_is_ended_past_the_hang_bound(tmp_path, clock, phase, result, kind):
    """A rank stuck in its teardown (a process group, a generator or a pipe that does not close)
    after its last beat: before the fix the supervisor waited for its exit for ever."""
    supervisor, backend = _supervise(tmp_path, [_ended_then(phase, result=result), "succeed"], clock=clock,
                                     hang_timeout_s=2.0, startup_timeout_s=3.0, max_restarts=1)
    report = supervisor.run()
    (fault,) = report.faults
    assert (fault.kind, fault.planned, fault.detected_at) == (kind, False, T0 + 3.0)  # T0+2 is the bound, T0+3 past it
    assert backend.started[0].polls == 4 and backend.started[0].terminations
    assert (report.outcome, report.num_attempts) == (Outcome.SUCCEEDED, 2)


def test_ranks_that_stopped_at_the_planned_step_and_never_exit_end_the_stage_stopped(tmp_path, clock):
    worker = replace(_worker(tmp_path), stop_after_step=4)
    backend = FakeBackend(worker, [_ended_then("stopped"), "succeed"], clock=clock)
    report = Supervisor(worker=worker, config=_config(hang_timeout_s=2.0, max_restarts=1), backend=backend).run()
    assert (report.outcome, len(backend.started)) == (Outcome.STOPPED, 1) and backend.started[0].terminations
    assert [(f.kind, f.planned) for f in report.faults] == [(AttemptEnd.STOPPED, True)]


def test_a_finished_stage_whose_ranks_never_exit_succeeds_once_they_are_ended(tmp_path, clock, capsys):
    supervisor, backend = _supervise(tmp_path, [_ended_then("finished", result=True)], clock=clock,
                                     hang_timeout_s=2.0, startup_timeout_s=3.0, max_restarts=0)
    report = supervisor.run()
    assert (report.outcome, report.num_attempts, report.faults) == (Outcome.SUCCEEDED, 1, ())
    (attempt,) = backend.started
    assert attempt.polls == 4 and len(attempt.terminations) == 1 and attempt.releases == 1
    assert report.result == {"num_steps": 4}
    assert "finished but did not exit within 2 s" in capsys.readouterr().err


def test_a_result_cut_short_is_no_finished_stage(tmp_path, clock):
    def torn(attempt, backend):
        _ended_then("finished", result=True)(attempt, backend)
        (backend.stage_dir / RESULT_NAME).write_text('{"num_steps":')

    supervisor, backend = _supervise(tmp_path, [torn], clock=clock, hang_timeout_s=2.0, startup_timeout_s=3.0)
    report = supervisor.run()
    assert report.outcome is Outcome.FAILED and [f.kind for f in report.faults] == [AttemptEnd.HUNG]


def _beat(rank: int, phase: str, at: float) -> heartbeat.Heartbeat:
    return heartbeat.Heartbeat(rank=rank, pid=os.getpid(), attempt=0, step=4, phase=phase, at=at)


@pytest.mark.parametrize("phase", ["finished", "stopped"])
def test_a_stale_rank_after_a_finished_one_is_still_hung(tmp_path, clock, phase):
    supervisor, _ = _supervise(tmp_path, clock=clock, nproc_per_node=3, hang_timeout_s=3.0)
    attempt = FakeAttempt(number=0, launched_at=T0 - 100.0)
    beats = {0: _beat(0, phase, T0 - 50.0), 1: _beat(1, "training", T0), 2: _beat(2, "training", T0 - 3.0)}
    assert not supervisor._hung(attempt, beats)  # exactly at the bound
    beats[2] = _beat(2, "training", down_from(T0 - 3.0))
    assert supervisor._hung(attempt, beats)


@pytest.mark.parametrize("phase", ["finished", "stopped"])
def test_ranks_that_all_ended_get_the_hang_bound_from_the_last_ones_end(tmp_path, clock, phase):
    """Ranks other than 0 beat `finished` and exit while rank 0 still evaluates: only once every rank
    ended does the bound run, from the last one's beat (at it, not hung; past it, hung)."""
    supervisor, _ = _supervise(tmp_path, clock=clock, nproc_per_node=3, hang_timeout_s=3.0)
    attempt = FakeAttempt(number=0, launched_at=T0 - 100.0)
    beats = {0: _beat(0, phase, T0 - 3.0), 1: _beat(1, phase, T0 - 50.0), 2: _beat(2, phase, T0 - 50.0)}
    assert not supervisor._hung(attempt, beats)
    assert not supervisor._hung(attempt, {**beats, 0: _beat(0, "evaluating", T0 - 1.0)})
    assert supervisor._hung(attempt, {**beats, 0: _beat(0, phase, down_from(T0 - 3.0))})


def down_from(x: float) -> float:
    return math.nextafter(x, -math.inf)


def test_the_start_up_bound_exactly(tmp_path, clock):
    supervisor, _ = _supervise(tmp_path, clock=clock, nproc_per_node=2, startup_timeout_s=5.0, hang_timeout_s=1.0)
    at_bound = FakeAttempt(number=0, launched_at=T0 - 5.0)
    assert not supervisor._hung(at_bound, {})
    assert not supervisor._hung(at_bound, {0: _beat(0, "training", T0 - 50.0)})  # one of two ranks
    past = FakeAttempt(number=0, launched_at=down_from(T0 - 5.0))
    assert supervisor._hung(past, {})
    starting = {0: _beat(0, "starting", T0 - 5.0), 1: _beat(1, "starting", T0 - 5.0)}
    assert not supervisor._hung(at_bound, starting)
    starting[1] = _beat(1, "starting", down_from(T0 - 5.0))
    assert supervisor._hung(at_bound, starting)


def test_an_attempt_never_records_its_own_recovery(tmp_path, clock):
    supervisor, _ = _supervise(tmp_path, clock=clock, hang_timeout_s=50.0, startup_timeout_s=50.0)
    supervisor.stage_dir.mkdir(parents=True)
    attempt = FakeAttempt(number=0, launched_at=T0, code=1)
    watch = supervisor._poll(attempt)
    supervisor._interrupt(attempt, watch)
    write_beat(Path(supervisor.worker.heartbeat_dir), rank=0, attempt=0, step=7, phase="training", at=T0 + 1.0)
    supervisor._poll(attempt)  # the same attempt again: its heartbeats are no recovery
    assert supervisor.faults[-1].recovery_seconds is None


def _recover_after_one_failure(tmp_path, clock, then):
    """A stage whose first attempt dies and whose second runs `then`, with bounds far from the test's
    times: only recovery is measured. -> (supervisor, report)"""
    supervisor, _ = _supervise(tmp_path, ["fail", then], clock=clock, max_restarts=1, hang_timeout_s=50.0,
                               startup_timeout_s=50.0)
    return supervisor, supervisor.run()


def test_a_heartbeat_at_step_zero_after_the_start_is_the_first_sign_of_recovery(tmp_path, clock):
    def step_zero(attempt, backend):
        write_beat(backend.heartbeat_dir, rank=0, attempt=attempt.number, step=0, phase="training",
                   at=backend.now() + 1.5)

        def on_poll(running):
            if running.polls == 2:
                _finish(backend, running)
        _keep_running(attempt, on_poll)

    _, report = _recover_after_one_failure(tmp_path, clock, step_zero)
    assert report.faults[0].recovery_seconds == 1.5


def test_the_detection_runs_from_the_oldest_of_the_newest_heartbeats(tmp_path, clock):
    def two_ranks(attempt, backend):
        write_beat(backend.heartbeat_dir, rank=0, attempt=attempt.number, step=4, phase="training", at=T0 - 2.0)
        write_beat(backend.heartbeat_dir, rank=1, attempt=attempt.number, step=4, phase="training", at=T0 - 1.0)
        attempt.code = 1

    supervisor, _ = _supervise(tmp_path, [two_ranks], clock=clock, nproc_per_node=2)
    (fault,) = supervisor.run().faults
    assert fault.kind is AttemptEnd.DEAD and fault.detection_seconds == 2.0


def test_detection_seconds_are_never_negative(tmp_path, clock):
    def beat_in_the_future(attempt, backend):
        write_beat(backend.heartbeat_dir, rank=0, attempt=attempt.number, step=4, phase="training", at=T0 + 5.0)
        attempt.code = 1

    supervisor, _ = _supervise(tmp_path, [beat_in_the_future], clock=clock)
    assert supervisor.run().faults[0].detection_seconds == 0.0


def test_a_death_at_launch_is_detected_in_zero_seconds(tmp_path, clock):
    supervisor, _ = _supervise(tmp_path, ["fail"], clock=clock)
    (fault,) = supervisor.run().faults
    assert fault.detected_at == T0 and fault.detection_seconds == 0.0


def test_recovery_runs_from_the_detection_to_the_next_attempts_first_step(tmp_path, clock):
    def first_step_later(attempt, backend):
        write_beat(backend.heartbeat_dir, rank=0, attempt=attempt.number, step=-1, phase="training",
                   at=backend.now())  # no step yet

        def on_poll(running):
            if running.polls == 2:
                write_beat(backend.heartbeat_dir, rank=0, attempt=running.number, step=9, phase="starting",
                           at=backend.now())  # resuming: not a step
            if running.polls == 3:
                write_beat(backend.heartbeat_dir, rank=0, attempt=running.number, step=9, phase="training",
                           at=backend.now() + 0.5)
            if running.polls == 5:
                _finish(backend, running)
        _keep_running(attempt, on_poll)

    supervisor, report = _recover_after_one_failure(tmp_path, clock, first_step_later)
    assert report.outcome is Outcome.SUCCEEDED
    (fault,) = report.faults
    # detected at T0; attempt 1 polls at T0, T0+1, T0+2 (first step written at T0+2.5).
    assert fault.detected_at == T0 and fault.recovery_seconds == 2.5
    (recovery,) = _events(Path(supervisor.worker.stage_dir), EventKind.RECOVERY)
    assert recovery.seconds == 2.5 and recovery.attempt == 1 and recovery.detail == "dead"


def test_recovery_is_recorded_once_per_fault(tmp_path, clock):
    def steps_for_a_while(attempt, backend):
        def on_poll(running):
            write_beat(backend.heartbeat_dir, rank=0, attempt=running.number, step=running.polls,
                       phase="training", at=backend.now())
            if running.polls == 4:
                running.code = 1
        _keep_running(attempt, on_poll)

    supervisor, report = _recover_after_one_failure(tmp_path, clock, steps_for_a_while)
    assert report.faults[0].recovery_seconds == 0.0 and report.faults[1].recovery_seconds is None
    recoveries = _events(Path(supervisor.worker.stage_dir), EventKind.RECOVERY)
    assert [(e.attempt, e.seconds) for e in recoveries] == [(1, 0.0)]


def test_the_allocation_covers_the_whole_supervision(tmp_path, clock):
    def slow_fail(attempt, backend):
        attempt.code = None
        attempt.on_poll = lambda running: setattr(running, "code", 1) if running.polls == 3 else None

    supervisor, _ = _supervise(tmp_path, [slow_fail], clock=clock, nproc_per_node=2, startup_timeout_s=50.0)
    supervisor.run()
    (allocation,) = _events(Path(supervisor.worker.stage_dir), EventKind.ALLOCATION)
    assert allocation.seconds == 2.0 and allocation.num_devices == 2 and allocation.attempt == 0


def test_the_allocation_is_recorded_even_when_the_back_end_raises(tmp_path):
    def boom(attempt, backend):
        raise ValueError("a setting the back end refuses")  # a mistake: no start would succeed

    supervisor, _ = _supervise(tmp_path, [boom])
    with pytest.raises(ValueError, match="a setting the back end refuses"):
        supervisor.run()
    assert len(_events(Path(supervisor.worker.stage_dir), EventKind.ALLOCATION)) == 1


def _not_answering(attempt, backend):
    raise RuntimeError(f"sbatch did not answer for attempt {attempt.number}")  # what the back ends raise


@pytest.mark.parametrize("max_restarts", [0, 1, 2])
def test_attempts_the_back_end_could_not_start_spend_the_budget_then_fail_with_its_sentence(tmp_path, max_restarts,
                                                                                           capsys):
    supervisor, backend = _supervise(tmp_path, default=_not_answering, max_restarts=max_restarts, poll_interval_s=0.01)
    report = supervisor.run()
    assert report.outcome is Outcome.FAILED and report.num_attempts == max_restarts + 1
    assert [f.kind for f in report.faults] == [AttemptEnd.NOT_STARTED] * (max_restarts + 1)
    assert report.error == f"sbatch did not answer for attempt {max_restarts}"
    err = capsys.readouterr().err
    assert err.count("could not be started") == max_restarts + 1 and "Traceback" not in err
    assert err.rstrip().endswith("the restart budget is spent")


@pytest.mark.parametrize("max_restarts", [1, 2])
def test_a_start_that_fails_within_the_budget_is_followed_by_one_that_runs(tmp_path, max_restarts):
    supervisor, backend = _supervise(tmp_path, [_not_answering] * max_restarts + ["succeed"], max_restarts=max_restarts,
                                     poll_interval_s=0.01)
    report = supervisor.run()
    assert report.outcome is Outcome.SUCCEEDED and report.num_attempts == max_restarts + 1
    assert [f.kind for f in report.faults] == [AttemptEnd.NOT_STARTED] * max_restarts
    interruptions = _events(Path(supervisor.worker.stage_dir), EventKind.INTERRUPTION)
    assert [(e.attempt, e.detail) for e in interruptions] == [(n, "not_started") for n in range(max_restarts)]


def test_the_relay_is_forwarded_on_every_poll_and_once_at_the_end(tmp_path, clock):
    class Relay:
        forwards = 0

        def forward(self):
            Relay.forwards += 1

    def two_polls(attempt, backend):
        attempt.code = None
        attempt.on_poll = lambda running: setattr(running, "code", 1) if running.polls == 2 else None

    supervisor, _ = _supervise(tmp_path, [two_polls], clock=clock, startup_timeout_s=50.0)
    supervisor.relay = Relay()
    supervisor.run()
    assert Relay.forwards == 3


# --- SupervisorConfig ---------------------------------------------------------------------------------


@pytest.mark.parametrize("field_name", ["nproc_per_node", "nnodes"])
def test_node_and_rank_counts_must_be_positive(field_name):
    with pytest.raises(ValueError, match="nproc_per_node and nnodes must be positive"):
        SupervisorConfig(**{field_name: 0})
    with pytest.raises(ValueError):
        SupervisorConfig(**{field_name: -1})
    assert getattr(SupervisorConfig(**{field_name: 1}), field_name) == 1


def test_max_restarts_zero_is_accepted_and_negative_refused():
    with pytest.raises(ValueError, match="max_restarts >= 0"):
        SupervisorConfig(max_restarts=-1)
    assert SupervisorConfig(max_restarts=0).max_restarts == 0
    assert SupervisorConfig(max_restarts=1).max_restarts == 1


@pytest.mark.parametrize("field_name", ["hang_timeout_s", "startup_timeout_s", "poll_interval_s", "grace_s"])
def test_every_bound_must_be_positive_and_at_most_a_day(field_name):
    # NaN passed `<= 0`; an infinite poll never polls; 1e300 s switched hang detection off.
    longest = {"hang_timeout_s": MAX_WAIT_S, "startup_timeout_s": MAX_WAIT_S, "poll_interval_s": MAX_WAIT_S}
    for value in (0.0, -1.0, float("nan"), float("inf"), 1e300, math.nextafter(MAX_WAIT_S, math.inf)):
        with pytest.raises(ValueError, match=f"^{field_name} must be positive and at most 86400 s \\(a day\\)$"):
            SupervisorConfig(**{**longest, field_name: value})
    assert getattr(SupervisorConfig(**{"poll_interval_s": 1e-9, field_name: 1e-9}), field_name) == 1e-9
    assert getattr(SupervisorConfig(**{**longest, field_name: MAX_WAIT_S}), field_name) == MAX_WAIT_S


def test_a_poll_rarer_than_the_hang_or_startup_bound_is_refused():
    assert SupervisorConfig(hang_timeout_s=10, startup_timeout_s=10, poll_interval_s=10).poll_interval_s == 10
    for bounds in ({"hang_timeout_s": 10}, {"startup_timeout_s": 10}):
        with pytest.raises(ValueError, match="^poll_interval_s must not exceed hang_timeout_s nor startup_timeout_s$"):
            SupervisorConfig(**bounds, poll_interval_s=math.nextafter(10, math.inf))


def test_the_defaults_are_the_documented_ones():
    config = SupervisorConfig()
    assert (config.nproc_per_node, config.nnodes, config.max_restarts) == (1, 1, 3)
    assert (config.hang_timeout_s, config.startup_timeout_s, config.poll_interval_s, config.grace_s) == (
        300.0, 300.0, 5.0, 60.0)
    assert config.launch == LaunchConfig() and config.world_size == 1


def test_world_size_is_nodes_times_ranks_per_node():
    assert SupervisorConfig(nnodes=3, nproc_per_node=4).world_size == 12


def test_from_dict_round_trips_asdict():
    config = SupervisorConfig(nnodes=2, nproc_per_node=3, hang_timeout_s=7.0, max_restarts=0)
    assert SupervisorConfig.from_dict(asdict(config)) == config
    assert SupervisorConfig.from_dict({}) == SupervisorConfig()
    slurm = SupervisorConfig(launch=LaunchConfig(backend="slurm", slurm=SlurmSettings(partition="gpu",
                                                                                      time_limit="02:00:00")))
    assert SupervisorConfig.from_dict(json.loads(json.dumps(asdict(slurm)))) == slurm
    with pytest.raises(ValueError, match="slurm settings are required"):
        SupervisorConfig.from_dict({"launch": {"backend": "slurm"}})


# --- the command line ------------------------------------------------------------------------------------


def test_stage_arguments_take_json_or_a_path(tmp_path):
    worker = _worker(tmp_path)
    supervisor_json = json.dumps({"max_restarts": 0, "nproc_per_node": 2})
    path = tmp_path / "supervisor.json"
    path.write_text(supervisor_json)
    for argument in (supervisor_json, str(path), "  " + supervisor_json):
        parsed_worker, parsed = stage_arguments("prog", ["--worker", worker.to_json(), "--supervisor", argument])
        assert parsed_worker == worker and parsed == SupervisorConfig(max_restarts=0, nproc_per_node=2)
    _, default = stage_arguments("prog", ["--worker", worker.to_json()])
    assert default == SupervisorConfig()
    with pytest.raises(SystemExit):
        stage_arguments("prog", ["--supervisor", "{}"])  # --worker is required


@pytest.mark.parametrize(("script", "code", "outcome"), [(["succeed"], 0, "succeeded"), (["fail"], 1, "failed")])
def test_main_runs_the_stage_and_exits_zero_only_on_success(tmp_path, monkeypatch, capsys, script, code, outcome):
    worker = _worker(tmp_path)
    backend = FakeBackend(worker, script)
    monkeypatch.setattr(launch, "backend_for", lambda config: backend)
    handlers = {}
    monkeypatch.setattr(supervisor_module.signal, "signal", lambda number, handler: handlers.__setitem__(number, handler))
    rc = main(["--worker", worker.to_json(), "--supervisor", json.dumps({"max_restarts": 0})])
    assert rc == code
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == {"stage": worker.stage, "outcome": outcome, "num_attempts": 1}
    assert set(handlers) == {supervisor_module.signal.SIGTERM, supervisor_module.signal.SIGINT}
    (handler,) = set(handlers.values())
    assert handler.__name__ == "request_stop"


def test_main_relays_through_the_channel_for_its_back_end(tmp_path, monkeypatch, capsys):
    worker = _worker(tmp_path)
    backend = FakeBackend(worker, ["succeed"])
    monkeypatch.setattr(launch, "backend_for", lambda config: backend)
    monkeypatch.setattr(supervisor_module.signal, "signal", lambda number, handler: None)
    opened = []

    class Relay:
        forwards = 0

        def forward(self):
            Relay.forwards += 1

    @contextlib.contextmanager
    def fake_open_relay(kind, metrics_path):
        opened.append((kind, metrics_path))
        yield Relay()

    monkeypatch.setattr(supervisor_module, "open_relay", fake_open_relay)
    assert main(["--worker", worker.to_json()]) == 0
    assert opened == [(BackendKind.LOCAL, Path(worker.metrics_path))]
    assert Relay.forwards >= 2  # a poll and the end of the run


def _help(capsys, monkeypatch, call) -> str:
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit) as caught:
        call()
    assert caught.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_the_command_lines_help(capsys, monkeypatch):
    text = _help(capsys, monkeypatch, lambda: stage_arguments("my-prog", ["--help"]))
    assert text.startswith("usage: my-prog ")
    assert "--worker WORKER the stage's WorkerConfig (JSON or a path to it)" in text
    assert "--supervisor SUPERVISOR SupervisorConfig fields (JSON or a path to it)" in text
    text = _help(capsys, monkeypatch, lambda: main(["--help"]))
    assert text.startswith("usage: ito_assets.runtime.supervision.supervisor ")


# --- one supervisor per stage folder -------------------------------------------------------------------


def test_a_second_supervisor_of_a_stage_starts_nothing_and_writes_nothing_there(tmp_path):
    """Two runs of one stage at once (one launched by hand while the sensor's runs): the second
    would launch attempts beside the first's on the same checkpoints and heartbeats."""
    first, _ = _supervise(tmp_path, ["succeed"])
    second = Supervisor(worker=first.worker, config=first.config, backend=FakeBackend(first.worker, ["succeed"]))
    first.stage_dir.mkdir(parents=True)
    with supervisor_module.supervising(first.stage_dir):  # the first is watching its attempt
        before = sorted(p.name for p in first.stage_dir.iterdir())
        with pytest.raises(supervisor_module.StageBusy, match=f"supervisor pid {os.getpid()} on .* already supervises"):
            second.run()
        assert second.backend.started == [] and sorted(p.name for p in first.stage_dir.iterdir()) == before
    assert second.run().outcome is Outcome.SUCCEEDED  # once it has ended, the stage is anyone's


def test_a_killed_supervisors_lock_file_holds_nobody_back(tmp_path):
    supervisor, backend = _supervise(tmp_path, ["succeed"])
    supervisor.stage_dir.mkdir(parents=True)
    (supervisor.stage_dir / supervisor_module.LOCK_NAME).write_text("supervisor pid 1 on gone\n")  # no flock held
    assert supervisor.run().outcome is Outcome.SUCCEEDED and len(backend.started) == 1


def test_main_says_who_holds_the_stage_and_exits_one(tmp_path, monkeypatch, capsys):
    worker = _worker(tmp_path)
    backend = FakeBackend(worker, ["succeed"])
    monkeypatch.setattr(launch, "backend_for", lambda config: backend)
    monkeypatch.setattr(supervisor_module.signal, "signal", lambda number, handler: None)
    Path(worker.stage_dir).mkdir(parents=True)
    with supervisor_module.supervising(Path(worker.stage_dir)):
        assert supervisor_module.main(["--worker", worker.to_json(), "--supervisor", "{}"]) == 1
    err = capsys.readouterr().err
    assert "already supervises the attempts in" in err and "Traceback" not in err and backend.started == []


def _launched(supervisor: Supervisor, launch_id: str) -> Supervisor:
    """`supervisor` as `stage_run.prepare` starts it: its folder's config written by `launch_id`."""
    worker = replace(supervisor.worker, launch_id=launch_id)
    supervisor.stage_dir.mkdir(parents=True, exist_ok=True)
    (supervisor.stage_dir / CONFIG_NAME).write_text(worker.to_json())
    return Supervisor(worker=worker, config=replace(supervisor.config, launch_id=launch_id), backend=supervisor.backend)


@pytest.mark.parametrize("folder_holds", ["a later launch's config", "no config", "a config that does not read"])
def test_a_supervisor_whose_config_a_later_launch_rewrote_starts_nothing(tmp_path, folder_holds):
    """Two launches of one stage: the first writes its config and releases the folder, the second
    writes its own over it (or is half-way: it removed the first's) before the first's supervisor
    takes the lock. The first's supervisor would train the second's inputs as the first's."""
    supervisor, backend = _supervise(tmp_path, ["succeed"])
    first = _launched(supervisor, "a" * 32)
    config = first.stage_dir / CONFIG_NAME
    if folder_holds == "a later launch's config":
        config.write_text(replace(first.worker, launch_id="b" * 32).to_json())
    elif folder_holds == "no config":
        config.unlink()
    else:
        config.write_bytes(b"\xff{")
    before = sorted(p.name for p in first.stage_dir.iterdir())
    with pytest.raises(supervisor_module.StageSuperseded, match="a later launch of this stage rewrote its inputs in .*: "
                                                                "this supervisor started nothing"):
        first.run()
    after = sorted(p.name for p in first.stage_dir.iterdir() if p.name != supervisor_module.LOCK_NAME)
    assert backend.started == [] and after == before and not events.read(first.stage_dir)


def test_a_supervisor_runs_its_own_launchs_config_and_one_started_by_hand_runs_any(tmp_path):
    supervisor, backend = _supervise(tmp_path, ["succeed", "succeed"])
    assert _launched(supervisor, "a" * 32).run().outcome is Outcome.SUCCEEDED
    (supervisor.stage_dir / CONFIG_NAME).write_text(replace(supervisor.worker, launch_id="b" * 32).to_json())
    assert supervisor.config.launch_id == "" and supervisor.run().outcome is Outcome.SUCCEEDED  # no launch named
    assert len(backend.started) == 2


def test_main_says_a_later_launch_superseded_it_and_exits_one(tmp_path, monkeypatch, capsys):
    worker = replace(_worker(tmp_path), launch_id="b" * 32)
    backend = FakeBackend(worker, ["succeed"])
    monkeypatch.setattr(launch, "backend_for", lambda config: backend)
    monkeypatch.setattr(supervisor_module.signal, "signal", lambda number, handler: None)
    Path(worker.stage_dir).mkdir(parents=True)
    (Path(worker.stage_dir) / CONFIG_NAME).write_text(worker.to_json())
    assert supervisor_module.main(["--worker", worker.to_json(), "--supervisor", json.dumps({"launch_id": "a" * 32})]) == 1
    err = capsys.readouterr().err
    assert "a later launch of this stage rewrote its config" in err and "Traceback" not in err and backend.started == []


def _held_for(folder: Path, seconds: float, role: str) -> threading.Thread:
    """The folder's lock held by `role` (another open file: flock tells them apart) for `seconds`."""
    taken = threading.Event()

    def hold():
        with supervisor_module.supervising(folder, role=role):
            taken.set()
            time.sleep(seconds)

    thread = threading.Thread(target=hold)
    thread.start()
    taken.wait()
    return thread


def test_a_launchs_brief_hold_on_the_folder_is_waited_for_and_a_supervisors_is_not(tmp_path):
    """A launch holds the folder only while it writes its inputs or reads its result; refused at
    once, a supervisor (or the launch reading back) would fail on a moment's overlap."""
    started = time.monotonic()
    holder = _held_for(tmp_path, 0.3, supervisor_module.LAUNCH_ROLE)
    with supervisor_module.supervising(tmp_path):
        assert time.monotonic() - started >= 0.3
    holder.join()
    holder = _held_for(tmp_path, 0.3, "supervisor")
    with pytest.raises(supervisor_module.StageBusy, match="supervisor pid"):
        with supervisor_module.supervising(tmp_path):
            pass
    holder.join()


def test_a_launch_that_holds_the_folder_too_long_is_taken_for_a_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor_module, "LAUNCH_HOLD_WAIT_S", 0.1)
    holder = _held_for(tmp_path, 0.5, supervisor_module.LAUNCH_ROLE)
    with pytest.raises(supervisor_module.StageBusy, match="post-training launch pid .* has held the stage folder .* for "
                                                          "over 0 s: this supervisor started nothing"):
        with supervisor_module.supervising(tmp_path):
            pass
    holder.join()


def test_a_holder_that_waited_leaves_a_note_the_next_one_can_read(tmp_path):
    """Its note over the last one, from the file's start (a read while waiting moved the file's
    position), cut to its length: a third comes and waits for it in turn."""
    first = _held_for(tmp_path, 0.3, supervisor_module.LAUNCH_ROLE)
    second = _held_for(tmp_path, 0.3, supervisor_module.LAUNCH_ROLE)  # waited for the first
    first.join()
    note = (tmp_path / supervisor_module.LOCK_NAME).read_bytes()
    assert note.startswith(b"post-training launch pid ") and b"\0" not in note and note.count(b"\n") == 1
    started = time.monotonic()
    with supervisor_module.supervising(tmp_path):
        assert time.monotonic() - started >= 0.1  # waited for the second too
    second.join()


def test_a_lock_held_before_its_note_is_written_is_waited_for_a_moment(tmp_path, monkeypatch):
    """A holder writes its note just after it takes the lock: an empty note is a holder of a
    moment ago, waited for a second at most, then taken for "another process"."""
    monkeypatch.setattr(supervisor_module, "NOTE_POLLS", 4)
    path = tmp_path / supervisor_module.LOCK_NAME
    with open(path, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # held, no note
        started = time.monotonic()
        with pytest.raises(supervisor_module.StageBusy, match="another process already supervises"):
            with supervisor_module.supervising(tmp_path):
                pass
        assert time.monotonic() - started >= 3 * supervisor_module.LOCK_POLL_S


def test_a_held_folder_is_refused_under_the_supervisors_test_clock(tmp_path, monkeypatch):
    """The lock's wait is on other processes, in real time, whatever clock drives the loop."""
    monkeypatch.setattr(supervisor_module, "time", SimpleNamespace(time=lambda: 0.0, sleep=lambda seconds: None))
    holder = _held_for(tmp_path, 0.3, "supervisor")
    with pytest.raises(supervisor_module.StageBusy, match="already supervises"):
        with supervisor_module.supervising(tmp_path):
            pass
    holder.join()


def test_a_supervisor_waiting_on_a_launch_that_supersedes_it_says_so(tmp_path):
    """The launch that holds the folder writes its own config: the waiting supervisor's launch is
    superseded, which it says rather than "busy", and it starts nothing."""
    supervisor, backend = _supervise(tmp_path, ["succeed"])
    first = _launched(supervisor, "a" * 32)
    holder = _held_for(first.stage_dir, 0.3, supervisor_module.LAUNCH_ROLE)
    (first.stage_dir / CONFIG_NAME).write_text(replace(first.worker, launch_id="b" * 32).to_json())
    with pytest.raises(supervisor_module.StageSuperseded):
        first.run()
    holder.join()
    assert backend.started == []


def test_the_arguments_of_a_superseded_launch_are_refused_before_any_lock(tmp_path):
    worker = replace(_worker(tmp_path), launch_id="a" * 32)
    path = tmp_path / CONFIG_NAME
    mine = json.dumps({"launch_id": "a" * 32})
    for config in (None, replace(worker, launch_id="b" * 32)):  # removed, or rewritten, by a later launch
        path.unlink(missing_ok=True)
        if config is not None:
            path.write_text(config.to_json())
        with pytest.raises(supervisor_module.StageSuperseded, match="rewrote its config before this supervisor read it"):
            stage_arguments("prog", ["--worker", str(path), "--supervisor", mine])
        with pytest.raises(supervisor_module.StageSuperseded):  # an inline config is compared too
            stage_arguments("prog", ["--worker", (config or replace(worker, launch_id="")).to_json(), "--supervisor", mine])
    path.write_text(worker.to_json())
    assert stage_arguments("prog", ["--worker", str(path), "--supervisor", mine])[0] == worker
    path.unlink()
    with pytest.raises(FileNotFoundError):  # no launch named: a missing file is the caller's mistake
        stage_arguments("prog", ["--worker", str(path)])


def test_a_file_system_without_locks_runs_the_stage_and_says_so(tmp_path, monkeypatch, capsys):
    """Lustre mounted without flock, NFS with nolock: the shared storage a cluster's stages use."""
    def no_locks(handle, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(supervisor_module.fcntl, "flock", no_locks)
    supervisor, backend = _supervise(tmp_path, ["succeed"])
    assert supervisor.run().outcome is Outcome.SUCCEEDED and len(backend.started) == 1
    assert "takes no locks" in capsys.readouterr().err


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path):
    supervisor, backend = _supervise(tmp_path, ["succeed"])
    supervisor.stage_dir.mkdir(parents=True)
    target = tmp_path / "someone-elses-file"
    target.write_text("theirs\n")
    (supervisor.stage_dir / supervisor_module.LOCK_NAME).symlink_to(target)
    report = supervisor.run()
    assert (report.outcome, report.error_code, backend.started) == (Outcome.FAILED, "CHECKPOINT_STORAGE_INVALID", [])
    assert target.read_text() == "theirs\n"


def test_an_unexpected_error_while_watching_ends_the_attempt_before_it_is_raised(tmp_path, monkeypatch):
    """A replica group's supervisor runs on a thread: an error there would otherwise leave its
    attempt running, joining the quorum with nobody watching it."""
    supervisor, backend = _supervise(tmp_path, ["run"], max_restarts=3)
    real, calls = supervisor_module.proposals.approved_restart, [0]

    def fails_after_the_launch(stage_dir):
        calls[0] += 1
        if calls[0] > 2:
            raise ValueError("a bug")
        return real(stage_dir)

    monkeypatch.setattr(supervisor_module.proposals, "approved_restart", fails_after_the_launch)
    with pytest.raises(ValueError, match="a bug"):
        supervisor.run()
    (attempt,) = backend.started
    assert attempt.terminations == [(set(), supervisor.config.grace_s)]
