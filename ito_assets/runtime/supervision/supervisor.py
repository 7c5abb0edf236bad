"""The supervisor: runs a stage's attempts, notices a dead or hung worker, and restarts the stage
from its newest whole checkpoint under the same run record.

- dead: the launch exits non-zero (torchrun stops the other ranks when one dies; a rank that is
  a world of its own is the launch).
- hung: a live rank's heartbeat is older than `hang_timeout_s`, or it beats in training at one step
  that long without progress (or no heartbeat arrives within `startup_timeout_s` of the launch).
  Ranks that all beat their end (`finished`, `stopped`) get `hang_timeout_s` from the last of those
  beats to exit: past it they are ended, and the attempt counts as what their beats say (finished,
  with its result on disk; stopped) or else as hung.
- an approved spike proposal: a planned restart from the proposal's checkpoint, skipping its
  batches; checkpoints after that step are set aside (renamed `discarded-step-*`, kept for audit).
  A proposal approved while no attempt runs (the stage had already ended) is applied before the
  next attempt starts, so re-running the stage carries it out. Replica groups other than 0 follow
  group 0's proposals (`_follow`): they restart too, once group 0's supervisor has applied it.
- a stop request (SIGTERM/SIGINT to the supervisor, e.g. Dagster terminating the run): the workers
  flush a checkpoint within the grace period and the supervisor exits without restarting; so it
  does when the ranks stop at the config's `stop_after_step`. Ranks that flushed and stopped on a
  signal the supervisor did not send (a Kubernetes deadline, a node drain, a Slurm time limit or
  preemption) end the attempt `terminated`: unplanned, resumed within the restart budget.
- the stage folder cannot be written (a full disk, a vanished or unwritable folder): the stage
  ends FAILED with STORAGE_FULL or CHECKPOINT_STORAGE_INVALID and one plain sentence, without a
  restart (none could help) and without a traceback.
- another supervisor already watches the stage folder (a second run of the same stage, launched
  while the first runs): this one launches nothing, writes no event or report there and exits with
  one sentence naming the other (`StageBusy`); two would launch attempts beside each other on one
  folder. A file system without locks (Lustre without `flock`, NFS with `nolock`) is said on
  stderr, and the stage runs unguarded.
- an attempt the back end could not start (sbatch, the Kubernetes API or their sweep of what earlier
  starts left got no answer): a fault on the restart budget, said on stderr; the next attempt is
  started after a poll interval, and the stage ends FAILED with the back end's sentence once the
  budget is spent.
- the workers could not write their last checkpoint (their heartbeats say so, with the code): a
  full disk ends the stage FAILED with STORAGE_FULL at once; any other storage error is retried
  once, outside the restart budget (a storage hiccup clears), and ends it FAILED with
  CHECKPOINT_STORAGE_INVALID when the next attempt fails the same way.
- a rank refused its inputs with a code (its heartbeat says which: the eval suite changed since the
  plan, DPO's reference is not finite): the stage ends FAILED with that code at once, off the
  budget; a restart would read the same inputs and spend its compute to fail again.

Attempts run where `SupervisorConfig.launch` says (`ito_assets.launch.backend`): torchrun on this
machine (a lone rank without it), an sbatch job, or a Kubernetes Job; the supervisor only polls and terminates them. When
they run remotely, it relays rank 0's metrics to its Dagster Pipes channel (`relay`).

Detection seconds run from the faulty rank's last sign of life (the oldest of the ranks' newest
heartbeats, else the launch) to the moment the supervisor decided; recovery seconds from that decision to the first step of the next
attempt. Both go to the event log as INTERRUPTION and RECOVERY events.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import fcntl
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from time import monotonic
from time import sleep as _pause
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ito_assets.errors import ErrorCode, disk_full
from ito_assets.launch.backend import Attempt, Backend, LaunchConfig
from ito_assets.runtime.record import events
from ito_assets.runtime.supervision import heartbeat
from ito_assets.runtime.checkpoint import holds
from ito_assets.runtime.supervision import launch
from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.supervision import proposals
from ito_assets.runtime.stage.config import RESULT_NAME, WorkerConfig, launch_of
from ito_assets.runtime.record.events import Event, EventKind
from ito_assets.runtime.supervision.relay import MetricsRelay, open_relay
from ito_assets.runtime.record.storage import NO_LOCKS, write_atomic
from ito_assets.runtime.worker.reporting import PIPES_CONTEXT_ENV_VAR

REPORT_NAME = "supervision.json"
_ATTEMPT_NUMBER = re.compile(r"[0-9]{1,9}")  # the attempt logs' names: attempt-<n>.json


# The longest wait any bound may set: a day. Longer is no bound (1e300 s switched hang detection
# off and a SIGKILL after SIGTERM never came).
MAX_WAIT_S = 86_400.0


@dataclass(frozen=True, kw_only=True)
class SupervisorConfig:
    nproc_per_node: int = 1
    # Nodes of one attempt. On this machine several nodes are several torchrun launchers on
    # loopback (c10d rendezvous): the multi-node path, exercised for real without a cluster.
    nnodes: int = 1
    # 300 s: a failure must be detected in under 10 minutes (booked GPUs idle until then); a
    # 5-minute bound plus one poll leaves half of that as margin, and a healthy step (even a 70B
    # step) beats far more often.
    hang_timeout_s: float = 300.0
    # Launch to the first step: interpreter, torch import, rendezvous, checkpoint load.
    startup_timeout_s: float = 300.0
    poll_interval_s: float = 5.0
    # 60 s between SIGTERM and SIGKILL: time for the workers to flush one checkpoint (Kubernetes'
    # default grace is 30 s; a large asynchronous save needs the margin).
    grace_s: float = 60.0
    # Unplanned restarts before the stage fails: torchelastic's documented example value (3).
    max_restarts: int = 3
    # Where the attempts run: this machine (default), Slurm or Kubernetes (`ito_assets.launch.backend`).
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    # The launch this supervisor runs (`WorkerConfig.launch_id`), on its command line: once it holds
    # the stage folder's lock it starts nothing unless the folder's config is still that launch's.
    # Empty: a supervisor started by hand or a test, which runs whatever config it was given.
    launch_id: str = ""

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1 or self.nnodes < 1 or self.max_restarts < 0:
            raise ValueError("nproc_per_node and nnodes must be positive and max_restarts >= 0")
        for name in ("hang_timeout_s", "startup_timeout_s", "poll_interval_s", "grace_s"):
            if not 0 < getattr(self, name) <= MAX_WAIT_S:  # NaN too
                raise ValueError(f"{name} must be positive and at most {MAX_WAIT_S:.0f} s (a day)")
        # A hang is seen at a poll: a poll rarer than the hang bound would stretch every detection.
        if self.poll_interval_s > min(self.hang_timeout_s, self.startup_timeout_s):
            raise ValueError("poll_interval_s must not exceed hang_timeout_s nor startup_timeout_s")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @classmethod
    def from_dict(cls, data: dict) -> SupervisorConfig:
        """From JSON (`dataclasses.asdict` of one): the `--supervisor` argument."""
        launch_config = LaunchConfig.from_dict(data.get("launch", {}))
        return cls(**{**data, "launch": launch_config})


class AttemptEnd(str, enum.Enum):
    FINISHED = "finished"
    DEAD = "dead"  # torchrun exited non-zero: a rank died
    HUNG = "hung"  # a live rank's heartbeat went stale
    SPIKE_RESTART = "spike_restart"  # the desk approved a spike proposal (planned)
    STOPPED = "stopped"  # a stop request, or the planned stop at `stop_after_step` the workers flushed (planned)
    # Every rank flushed and stopped on a signal the supervisor did not send (a Kubernetes deadline,
    # a node drain, a Slurm time limit or preemption): unplanned, resumed within the restart budget.
    TERMINATED = "terminated"
    STORAGE = "storage"  # the workers' last checkpoint could not be written (off the restart budget)
    REFUSED = "refused"  # a rank refused its inputs with a code no restart changes
    NOT_STARTED = "not_started"  # the back end could not start it: a scheduler or API that did not answer


PLANNED_ENDS = frozenset({AttemptEnd.SPIKE_RESTART, AttemptEnd.STOPPED})
# A rank's last phases: after either only its exit is left.
_END_PHASES = ("finished", "stopped")


class Outcome(str, enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # more unplanned restarts than allowed
    STOPPED = "stopped"


@dataclass(frozen=True, kw_only=True)
class Fault:
    kind: AttemptEnd
    attempt: int
    planned: bool
    detected_at: float
    detection_seconds: float
    recovery_seconds: float | None = None  # filled when the next attempt took its first step
    error_code: str | None = None  # STORAGE, REFUSED: the code, from the workers' heartbeats


@dataclass(frozen=True, kw_only=True)
class SupervisionReport:
    stage: str
    outcome: Outcome
    num_attempts: int
    faults: tuple[Fault, ...]
    result: dict | None  # the worker's result.json when succeeded
    # FAILED for the stage folder's storage (STORAGE_FULL, CHECKPOINT_STORAGE_INVALID): restarting cannot help.
    error_code: str | None = None
    error: str = ""


@dataclass
class _Watch:
    """What one poll concluded about the attempt."""

    kind: AttemptEnd | None = None  # None: still running
    last_sign: float = 0.0
    proposal_id: str | None = None
    error_code: str | None = None  # STORAGE: the code the workers' heartbeats name
    running: bool = False  # ended by its heartbeats while its launch still runs (a teardown that hangs)


@dataclass
class Supervisor:
    worker: WorkerConfig
    config: SupervisorConfig
    faults: list[Fault] = field(default_factory=list)
    stop_requested: bool = False
    backend: Backend | None = None  # None: the one `config.launch` names
    env: dict[str, str] = field(default_factory=dict)  # for the workers (a replica group's lighthouse)
    relay: MetricsRelay | None = None  # remote ranks' metrics to this process's Pipes channel
    # Take the stage folder's lock (`supervising`); False where the caller holds it for this
    # supervisor (the replica stage, for all its groups).
    lock: bool = True
    # Replica group 0's: called once it applied a restart the desk ordered, before its next launch,
    # to wait for the other groups to end their attempts (`ReplicaStage`).
    after_apply: Callable[[str], None] | None = None
    _beats: heartbeat.Observer | None = field(default=None, init=False, repr=False)  # the attempt watched
    _followed: set[str] = field(default_factory=set, init=False, repr=False)  # restarts a follower carried out

    def __post_init__(self) -> None:
        self.backend = self.backend or launch.backend_for(self.config.launch)

    @property
    def stage_dir(self) -> Path:
        return Path(self.worker.stage_dir)

    @property
    def leads_restarts(self) -> bool:
        """Whether this supervisor carries out the desk's spike restarts (a stage's, replica group
        0's); another replica group follows group 0's, from group 0's folder (`_follow`)."""
        return self.worker.resume_dir is None

    @property
    def proposals_dir(self) -> Path:
        return Path(self.worker.resume_dir or self.worker.stage_dir)

    def request_stop(self, *_: object) -> None:
        self.stop_requested = True

    def run(self) -> SupervisionReport:
        self.stage_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as held:
            try:
                if self.lock:
                    held.enter_context(supervising(self.stage_dir, launch_id=self.config.launch_id))
            except OSError as error:  # the lock's file cannot be made: as any write to the folder
                if not self._in_stage_storage(error):
                    raise
                return self._storage_failure(error, 0)
            return self._run()

    def _run(self) -> SupervisionReport:
        started, attempt_number, unplanned, launched = time.time(), 0, 0, 0
        running: Attempt | None = None  # launched and not yet ended by this loop
        try:
            attempt_number = first = self._next_attempt_number()
            while True:
                self._apply_approved(attempt_number)  # approved while no attempt ran (e.g. after the stage ended)
                if self.stop_requested:  # asked before the first attempt or while the last one ended
                    return self._report(Outcome.STOPPED, attempt_number - first)
                try:
                    attempt = running = self._launch(attempt_number)
                except RuntimeError as error:  # the back ends' "could not start": worth another try
                    unplanned += 1
                    if self._not_started(attempt_number, error, spent=unplanned > self.config.max_restarts):
                        return self._report(Outcome.FAILED, attempt_number + 1 - first, error=str(error))
                    attempt_number += 1
                    continue
                launched += 1
                watch = self._watch(attempt)
                if watch.kind is AttemptEnd.FINISHED:
                    self._end_finished(attempt, watch)
                    return self._report(Outcome.SUCCEEDED, attempt_number + 1 - first)
                fault = self._interrupt(attempt, watch)
                running = None
                if fault.kind is AttemptEnd.STOPPED:
                    return self._report(Outcome.STOPPED, attempt_number + 1 - first)
                if fault.kind is AttemptEnd.REFUSED:
                    return self._refused(fault, attempt_number + 1 - first)
                if fault.kind is AttemptEnd.STORAGE:
                    if not self._retry_storage(fault):
                        return self._workers_storage_failure(fault, attempt_number + 1 - first)
                    attempt_number += 1
                    continue
                unplanned += 0 if fault.planned else 1
                if unplanned > self.config.max_restarts:
                    return self._report(Outcome.FAILED, attempt_number + 1 - first)
                attempt_number += 1
        except OSError as error:  # the stage folder cannot be written: no restart can fix that
            self._end_unwatched(running)
            if not self._in_stage_storage(error):
                raise
            return self._storage_failure(error, launched)
        except BaseException:
            self._end_unwatched(running)
            raise
        finally:
            if self.relay is not None:
                self.relay.forward()
            with contextlib.suppress(OSError):  # already reported when the folder is the problem
                self._event(EventKind.ALLOCATION, attempt=attempt_number, seconds=time.time() - started,
                            num_devices=self.config.world_size)

    def _not_started(self, number: int, error: RuntimeError, *, spent: bool) -> bool:
        """Record that attempt `number` could not be started (a fault on the restart budget: a
        scheduler or API that did not answer may answer the next time) and say so on stderr, the
        stage's log; returns `spent`, after a poll interval's wait when another try follows."""
        fault = Fault(kind=AttemptEnd.NOT_STARTED, attempt=number, planned=False, detected_at=time.time(),
                      detection_seconds=0.0)
        self.faults.append(fault)
        self._event(EventKind.INTERRUPTION, attempt=number, planned=False, seconds=0.0, detail=fault.kind.value)
        then = "the restart budget is spent" if spent else "the next attempt is started"
        print(f"attempt {number} of {self.worker.stage} could not be started ({error}); {then}", file=sys.stderr, flush=True)
        if not spent:
            time.sleep(self.config.poll_interval_s)
        return spent

    def _end_finished(self, attempt: Attempt, watch: _Watch) -> None:
        """Free what a finished attempt holds; its ranks first, where they never exited."""
        if watch.running:
            pids = {b.pid for b in heartbeat.read_all(Path(self.worker.heartbeat_dir), attempt=attempt.number).values()}
            attempt.terminate(pids, grace_s=self.config.grace_s)
        attempt.release()

    def _end_unwatched(self, running: Attempt | None) -> None:
        """End the attempt this supervisor leaves without watching it (its ranks would hold the devices
        to their end); what fails meanwhile (the broken folder its log is in) must not stop that."""
        if running is not None:
            with contextlib.suppress(Exception):
                running.terminate(set(), grace_s=self.config.grace_s)  # the launchers take their ranks

    def _next_attempt_number(self) -> int:
        """Attempt numbers continue across supervisor runs of the same stage (a retried step), so
        that the event log orders every attempt the stage ever had."""
        numbers = [int(p.stem[len("attempt-"):]) for p in self.stage_dir.glob("attempt-*.json")
                   if _ATTEMPT_NUMBER.fullmatch(p.stem[len("attempt-"):])]  # a stray `attempt-notes.json` is no attempt
        return max(numbers, default=-1) + 1

    # --- one attempt ----------------------------------------------------------------------------

    def _launch(self, number: int) -> Attempt:
        heartbeat.clear(Path(self.worker.heartbeat_dir))
        config = self.worker.with_attempt(number, time.time(), proposals.skip_ranges(self.proposals_dir))
        config_path = self.stage_dir / f"attempt-{number}.json"
        write_atomic(config_path, config.to_json().encode())
        # A rendezvous id per attempt and replica group: a restarted attempt never meets the old
        # one's ranks, and the back ends name a group's jobs by it, so one group's cleanup (Slurm's
        # scancel by name, a Kubernetes Job name) never reaches another group running beside it.
        group = f"-replica-{self.worker.replica_id}" if self.worker.replica_id else ""
        spec = launch.worker_spec(config_path, nnodes=self.config.nnodes, nproc_per_node=self.config.nproc_per_node,
                                  rdzv_id=f"{self.worker.run_key}-{self.worker.stage}{group}-{number}")
        spec = replace(spec, env=(*spec.env, *sorted(self.env.items())))
        return self.backend.start(spec, number=number, log_path=self.stage_dir / f"attempt-{number}.log")

    def _watch(self, attempt: Attempt) -> _Watch:
        while True:
            watch = self._poll(attempt)
            if watch.kind is not None:
                return watch
            attempt.wait(self.config.poll_interval_s)  # wakes early where a launcher exit is cheap to see

    def _poll(self, attempt: Attempt) -> _Watch:
        if self.relay is not None:
            self.relay.forward()
        if self._beats is None or self._beats.attempt != attempt.number:
            self._beats = heartbeat.Observer(Path(self.worker.heartbeat_dir), attempt=attempt.number,
                                             since=attempt.launched_at)
        beats = heartbeat.read_all(Path(self.worker.heartbeat_dir), attempt=attempt.number)
        self._note_recovery(attempt, beats)
        # The faulty rank is the one whose newest heartbeat is oldest; its last sign of life.
        last_sign = min(b.at for b in beats.values()) if beats else attempt.launched_at
        code = attempt.exit_code()
        failed = [b.detail for b in beats.values() if b.phase == heartbeat.STORAGE_FAILED]
        if code is not None and failed:
            return _Watch(kind=AttemptEnd.STORAGE, last_sign=last_sign, error_code=failed[0])
        refused = [b.detail for b in beats.values() if b.phase == heartbeat.REFUSED]
        if code and refused:  # a rank's exit, not a beat alone, ends the attempt
            return _Watch(kind=AttemptEnd.REFUSED, last_sign=last_sign, error_code=refused[0])
        if code is not None:
            return _Watch(kind=self._exit_kind(code, beats), last_sign=last_sign)
        if self.stop_requested:
            return _Watch(kind=AttemptEnd.STOPPED, last_sign=time.time())
        observed = self._beats.read(time.time())  # on this clock: a worker's may be set wrong
        if self._hung(attempt, observed):
            # Its last sign as observed: a rank that beats without progress last progressed then.
            kind = self._ended_without_exit(attempt, observed) or AttemptEnd.HUNG
            return _Watch(kind=kind, last_sign=min((b.at for b in observed.values()), default=last_sign), running=True)
        ordered = self._restart_ordered()
        if ordered is not None:
            return _Watch(kind=AttemptEnd.SPIKE_RESTART, last_sign=time.time(), proposal_id=ordered)
        return _Watch()

    def _restart_ordered(self) -> str | None:
        """The id of a restart the desk ordered that this attempt must end for: an approved proposal;
        for a follower, one group 0's supervisor has applied (set the later checkpoints aside), so
        that its next attempt resumes on the rewound lineage. An approval alone leaves a follower
        training: group 0 may never apply it (it finished first)."""
        if self.leads_restarts:
            approved = proposals.approved_restart(self.stage_dir)
            return None if approved is None else approved.proposal_id
        return next((p for p in self._applied() if p not in self._followed), None)

    def _applied(self) -> list[str]:
        """The ids of group 0's applied restarts, oldest first (a follower's)."""
        return [p.proposal_id for p in proposals.ProposalStore(self.proposals_dir).all()
                if p.state is proposals.ProposalState.APPLIED]

    def _exit_kind(self, code: int, beats: dict[int, heartbeat.Heartbeat]) -> AttemptEnd:
        if code == 0 and (self.stage_dir / RESULT_NAME).exists():
            return AttemptEnd.FINISHED
        return self._stop_kind(beats) or AttemptEnd.DEAD

    def _stop_kind(self, beats: dict[int, heartbeat.Heartbeat]) -> AttemptEnd | None:
        """Every rank flushed a checkpoint and beat `stopped`: STOPPED where this supervisor asked for
        it or the ranks stopped at the config's `stop_after_step`, else TERMINATED (someone else sent
        the SIGTERM: the run is not over, so it resumes). None unless every rank stopped."""
        if len(beats) != self.config.world_size or any(b.phase != "stopped" for b in beats.values()):
            return None
        at_planned_step = all(b.step == self.worker.stop_after_step for b in beats.values())
        return AttemptEnd.STOPPED if self.stop_requested or at_planned_step else AttemptEnd.TERMINATED

    def _ended_without_exit(self, attempt: Attempt, beats: dict[int, heartbeat.Heartbeat]) -> AttemptEnd | None:
        """A hung attempt whose ranks had all beat their end (stuck in teardown: a process group,
        a generator or a pipe that does not close): what their beats say it ended as, or None.
        FINISHED needs the result on disk, written whole (atomically) before the `finished` beat."""
        if beats and all(b.phase == "finished" for b in beats.values()) and self._result_is_whole():
            print(f"the ranks of attempt {attempt.number} of {self.worker.stage} finished but did not exit within "
                  f"{self.config.hang_timeout_s:g} s; they were ended", file=sys.stderr, flush=True)
            return AttemptEnd.FINISHED
        return self._stop_kind(beats)

    def _result_is_whole(self) -> bool:
        try:
            return isinstance(json.loads((self.stage_dir / RESULT_NAME).read_text()), dict)
        except (OSError, ValueError):
            return False

    def _hung(self, attempt: Attempt, beats: dict[int, heartbeat.Heartbeat]) -> bool:
        now = time.time()
        if len(beats) < self.config.world_size:
            return now - attempt.launched_at > self.config.startup_timeout_s
        if all(b.phase in _END_PHASES for b in beats.values()):
            # Only the exit is left, from the last rank's end on: teardown gets the hang bound. A
            # rank that ended earlier (others still evaluating) may long have exited.
            return now - max(b.at for b in beats.values()) > self.config.hang_timeout_s
        for beat in beats.values():
            if beat.phase in _END_PHASES:
                continue
            # Resuming (loading a checkpoint, joining the group) has the start-up bound.
            bound = (self.config.startup_timeout_s if beat.phase in ("starting", heartbeat.JOINING)
                     else self.config.hang_timeout_s)
            if now - beat.at > bound:
                return True
        return False

    # --- interruption and recovery --------------------------------------------------------------

    def _interrupt(self, attempt: Attempt, watch: _Watch) -> Fault:
        detected_at = time.time()
        planned = watch.kind in PLANNED_ENDS
        fault = Fault(kind=watch.kind, attempt=attempt.number, planned=planned, detected_at=detected_at,
                      detection_seconds=max(0.0, detected_at - watch.last_sign), error_code=watch.error_code)
        self.faults.append(fault)
        self._event(EventKind.INTERRUPTION, attempt=attempt.number, planned=planned,
                    seconds=fault.detection_seconds, detail=watch.kind.value)
        pids = {b.pid for b in heartbeat.read_all(Path(self.worker.heartbeat_dir), attempt=attempt.number).values()}
        attempt.terminate(pids, grace_s=self.config.grace_s)
        if watch.proposal_id is not None and self.leads_restarts:
            self._apply(watch.proposal_id, attempt.number + 1)
        elif watch.proposal_id is not None:
            (self.stage_dir / RESULT_NAME).unlink(missing_ok=True)  # as group 0's: the stage trains again
            self._follow(attempt.number + 1)
        return fault

    def _apply_approved(self, next_attempt: int) -> None:
        if not self.leads_restarts:
            self._follow(next_attempt)
            return
        while (approved := proposals.approved_restart(self.stage_dir)) is not None:
            self._apply(approved.proposal_id, next_attempt)

    def _follow(self, next_attempt: int) -> None:
        """A follower replica group's side of the desk's restarts: every restart group 0's
        supervisor has applied counts as followed once this group has no attempt from before it
        (checked before each launch and after each attempt a restart ended): its next attempt
        resumes from group 0's newest checkpoint, at or behind the proposal's, and skips the same
        batches. Left training, it would be ahead of group 0, which would heal forward from it
        and undo the rewind."""
        applied = self._applied()
        self._record_rewinds(applied, next_attempt)
        self._followed.update(applied)

    def followed(self, proposal_id: str) -> bool:
        """Whether this follower ended its attempt for the restart and will resume after it."""
        return proposal_id in self._followed

    def _apply(self, proposal_id: str, next_attempt: int) -> None:
        """Set aside the checkpoints after the proposal's restart step, then mark it applied."""
        self._record_rewinds([proposal_id], next_attempt)
        store = proposals.ProposalStore(self.stage_dir)
        proposal = store.get(proposal_id)
        for path in markers.candidates(self.stage_dir):
            if markers.step_of(path) > proposal.restart_from_step:
                path.rename(path.with_name(f"discarded-{path.name}-{proposal_id}"))
        (self.stage_dir / RESULT_NAME).unlink(missing_ok=True)
        store.mark_applied(proposal_id)
        holds.release(self.stage_dir, proposal_id)
        if self.after_apply is not None:
            self.after_apply(proposal_id)

    def _record_rewinds(self, proposal_ids: list[str], next_attempt: int) -> None:
        """The telemetry's record of each restart this group has not recorded yet: every step its
        attempts before `next_attempt` trained past the restart step is wasted, also where the next
        attempt resumes from a later checkpoint on the rewound lineage or heals forward to its
        peers. Once per restart, whatever supervisor of the stage applies or follows it."""
        recorded = {e.detail for e in events.read(self.stage_dir) if e.kind is EventKind.REWIND}
        store = proposals.ProposalStore(self.proposals_dir)
        for proposal_id in proposal_ids:
            if proposal_id not in recorded:
                self._event(EventKind.REWIND, attempt=next_attempt, step=store.get(proposal_id).restart_from_step,
                            detail=proposal_id)

    def _note_recovery(self, attempt: Attempt, beats: dict[int, heartbeat.Heartbeat]) -> None:
        if not self.faults or self.faults[-1].recovery_seconds is not None or self.faults[-1].attempt >= attempt.number:
            return
        first_step = [b.at for b in beats.values() if b.step >= 0 and b.phase != "starting"]
        if not first_step:
            return
        last = self.faults[-1]
        seconds = max(0.0, min(first_step) - last.detected_at)
        self.faults[-1] = Fault(**{**asdict(last), "recovery_seconds": seconds})
        self._event(EventKind.RECOVERY, attempt=attempt.number, seconds=seconds, detail=last.kind.value)

    # --- records --------------------------------------------------------------------------------

    def _event(self, kind: EventKind, **fields) -> None:
        events.append(self.stage_dir, Event(kind=kind, at=time.time(), **fields))

    def _report(self, outcome: str, num_attempts: int, *, error_code: ErrorCode | None = None,
                error: str = "") -> SupervisionReport:
        result_path = self.stage_dir / RESULT_NAME
        result = json.loads(result_path.read_text()) if outcome is Outcome.SUCCEEDED else None
        report = SupervisionReport(stage=self.worker.stage, outcome=outcome, num_attempts=num_attempts,
                                   faults=tuple(self.faults), result=result,
                                   error_code=error_code.value if error_code else None, error=error)
        write_atomic(self.stage_dir / REPORT_NAME, json.dumps(asdict(report), sort_keys=True).encode())
        return report

    def _in_stage_storage(self, error: OSError) -> bool:
        """A full disk anywhere, or an error on a path in the stage folder: not, say, a launcher
        that is missing (that one keeps its traceback)."""
        if disk_full(error):
            return True
        paths = [Path(p) for p in (error.filename, error.filename2) if p]
        return any(p.is_relative_to(self.stage_dir) or p.is_relative_to(self.worker.heartbeat_dir) for p in paths)

    def _retry_storage(self, fault: Fault) -> bool:
        """Once, for an error that may pass (EIO on a network mount); never for a full disk, and
        never when the attempt before failed the same way."""
        before = self.faults[-2] if len(self.faults) > 1 else None
        again = before is not None and before.kind is AttemptEnd.STORAGE and before.attempt == fault.attempt - 1
        return fault.error_code != ErrorCode.STORAGE_FULL.value and not again

    def _workers_storage_failure(self, fault: Fault, num_attempts: int) -> SupervisionReport:
        known = {c.value for c in (ErrorCode.STORAGE_FULL, ErrorCode.CHECKPOINT_STORAGE_INVALID)}
        code = ErrorCode(fault.error_code) if fault.error_code in known else ErrorCode.CHECKPOINT_STORAGE_INVALID
        message = (f"{code.value}: the workers of {self.worker.stage} could not write their last checkpoint "
                   f"(attempt-{fault.attempt}.log says why); the stage stopped, its newest whole checkpoint is "
                   "kept for a retry")
        return self._end_for_storage(code, message, num_attempts)

    def _refused(self, fault: Fault, num_attempts: int) -> SupervisionReport:
        """FAILED with the code a rank refused its inputs with (another code, or a forged heartbeat's
        text, is INTERNAL_ERROR), one sentence on stderr and in the report."""
        known = fault.error_code in heartbeat.REFUSAL_CODES
        code = ErrorCode(fault.error_code) if known else ErrorCode.INTERNAL_ERROR
        message = (f"{code.value}: the workers of {self.worker.stage} refused their inputs "
                   f"(attempt-{fault.attempt}.log says why); a restart would read the same, so none was made")
        print(message, file=sys.stderr, flush=True)
        return self._report(Outcome.FAILED, num_attempts, error_code=code, error=message)

    def _storage_failure(self, error: OSError, num_attempts: int) -> SupervisionReport:
        code = ErrorCode.STORAGE_FULL if disk_full(error) else ErrorCode.CHECKPOINT_STORAGE_INVALID
        reason = error.strerror or type(error).__name__
        message = (f"{code.value}: the stage folder of {self.worker.stage} could not be written ({reason}); "
                   "the stage stopped, its newest whole checkpoint is kept for a retry")
        return self._end_for_storage(code, message, num_attempts)

    def _end_for_storage(self, code: ErrorCode, message: str, num_attempts: int) -> SupervisionReport:
        """The stage ends FAILED with the storage's code and a plain sentence, on stderr (the stage
        asset's log under Pipes) and in the report where it can still be written; never a traceback.
        The newest whole checkpoint stays where it was: a retry resumes from it once storage is fixed."""
        print(message, file=sys.stderr, flush=True)
        try:
            return self._report(Outcome.FAILED, num_attempts, error_code=code, error=message)
        except OSError:
            return SupervisionReport(stage=self.worker.stage, outcome=Outcome.FAILED, num_attempts=num_attempts,
                                     faults=tuple(self.faults), result=None, error_code=code.value, error=message)


def stage_arguments(prog: str, argv: list[str] | None) -> tuple[WorkerConfig, SupervisorConfig]:
    """`--worker W.json --supervisor S.json` (each JSON or a path to it): what Pipes passes to a
    stage's supervising process, a single supervisor or a replica stage."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--worker", required=True, help="the stage's WorkerConfig (JSON or a path to it)")
    parser.add_argument("--supervisor", default="{}", help="SupervisorConfig fields (JSON or a path to it)")
    args = parser.parse_args(argv)
    text = args.supervisor if args.supervisor.lstrip().startswith("{") else Path(args.supervisor).read_text()
    config = SupervisorConfig.from_dict(json.loads(text))
    try:
        worker = WorkerConfig.from_argument(args.worker)
    except FileNotFoundError:
        if not config.launch_id:
            raise
        worker = None  # a later launch removed this one's config before it could be read
    if config.launch_id and (worker is None or worker.launch_id != config.launch_id):
        raise StageSuperseded("a later launch of this stage rewrote its config before this supervisor read it: "
                              "it started nothing (the later launch's supervisor runs the stage)")
    return worker, config


def refused_arguments(prog: str, argv: list[str] | None) -> tuple[WorkerConfig, SupervisorConfig] | None:
    """`stage_arguments`, or None where a later launch superseded this one (said on stderr)."""
    try:
        return stage_arguments(prog, argv)
    except StageSuperseded as superseded:
        print(superseded, file=sys.stderr, flush=True)
        return None


LOCK_NAME = "supervisor.lock"
# Who a post-training launch says it is in the lock's note (`supervising`'s role).
LAUNCH_ROLE = "post-training launch"
# How long one waits for a launch's hold on the folder: a launch holds it only while it writes its
# inputs or reads back its result, one model's weights at most each, where a supervisor holds it
# for a whole stage (refused at once). A launch stuck longer than this is taken for a holder.
LAUNCH_HOLD_WAIT_S = 300.0
LOCK_POLL_S = 0.05
NOTE_POLLS = 20  # polls (a second) a lock held without a note yet is waited for


class StageSuperseded(RuntimeError):
    """The stage folder's config is not the launch's that asks: a later launch rewrote the
    folder's inputs (or is writing them) after this one wrote its own."""


class StageBusy(RuntimeError):
    """Another supervisor (or a launch writing its inputs) holds the stage folder's lock; `holder`:
    the note it left, e.g. "supervisor pid 12 on node-3"."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


@contextlib.contextmanager
def supervising(stage_dir: Path, role: str = "supervisor", launch_id: str = ""):
    """Hold the stage folder's lock while its attempts are supervised (or, `role` "post-training
    launch", while a launch writes their inputs or reads their result), or raise StageBusy naming
    the holder. flock: the kernel releases it when the holder dies, so a killed supervisor leaves
    no stale lock behind (only its note of who held it, which the next holder rewrites).
    `launch_id`: once the lock is held, StageSuperseded unless the folder's config is that launch's.
    A launch releases the lock between writing the inputs and its supervisor taking it, and
    another launch may write in between: the supervisor that then takes the lock runs only its
    own launch's config, and a launch reads back only its own supervisor's result."""
    path = stage_dir / LOCK_NAME
    # Never through a link: the note written into it would overwrite whatever file it names.
    handle = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600), "r+")
    try:
        try:
            _lock(handle, stage_dir, role, launch_id)
        except OSError as error:
            if error.errno not in NO_LOCKS:
                raise
            # Lustre without -o flock, NFS with nolock: the stage runs as before locks, unguarded.
            if role != LAUNCH_ROLE:  # said once, by the supervisor, not at each of a launch's holds
                print(f"the file system of {stage_dir} takes no locks ({error.strerror}): a second supervisor of "
                      "this stage would not be refused", file=sys.stderr, flush=True)
            _claimed(stage_dir, role, launch_id)
            yield
            return
        _claimed(stage_dir, role, launch_id)
        yield
    finally:
        handle.close()  # releases the lock


def _lock(handle, stage_dir: Path, role: str, launch_id: str) -> None:
    """Take the lock, and write this holder's note as it is taken: now, or once a launch that
    holds it for a moment lets go (within LAUNCH_HOLD_WAIT_S); StageBusy where a supervisor holds it,
    StageSuperseded where meanwhile the folder's config became a later launch's. Real time
    (`monotonic`, `_pause`): the wait is on other processes, whatever clock a test gives the
    supervisor's loop."""
    deadline, polls = None, 0
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read(200).strip(" \n\0")
        else:
            handle.seek(0)  # the note over the last one, then cut to its length: never empty meanwhile
            handle.write(f"{role} pid {os.getpid()} on {socket.gethostname()}\n")
            handle.truncate()
            handle.flush()
            return
        _claimed(stage_dir, role, launch_id)
        polls += 1
        # A holder writes its note just after it takes the lock: none yet is a holder of a moment ago.
        brief = holder.startswith(LAUNCH_ROLE) or (not holder and polls < NOTE_POLLS)
        deadline = deadline or monotonic() + LAUNCH_HOLD_WAIT_S
        if not brief or monotonic() >= deadline:
            raise StageBusy(_busy(holder or "another process", stage_dir, role), holder or "another process")
        _pause(LOCK_POLL_S)


def _busy(holder: str, stage_dir: Path, role: str) -> str:
    if holder.startswith(LAUNCH_ROLE):
        return (f"{holder} has held the stage folder {stage_dir} for over {LAUNCH_HOLD_WAIT_S:.0f} s: this {role} "
                "started nothing (one at a time per stage folder)")
    return (f"{holder} already supervises the attempts in {stage_dir}: this {role} started nothing "
            "(one at a time per stage folder)")


def _claimed(stage_dir: Path, role: str, launch_id: str) -> None:
    if launch_id and launch_of(stage_dir) != launch_id:
        raise StageSuperseded(f"a later launch of this stage rewrote its inputs in {stage_dir} after this one wrote "
                              f"them: this {role} started nothing (the later launch's supervisor runs the stage)")


def supervised(stage, worker: WorkerConfig, config: SupervisorConfig) -> SupervisionReport | None:
    """Run `stage` (a Supervisor, or the replica stage) as its command does: SIGTERM and SIGINT ask
    it to stop, rank 0's metrics are relayed to Pipes from remote ranks. None where another
    supervisor holds the stage folder, said in one sentence on stderr (the stage asset's log under
    Pipes), no traceback."""
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, stage.request_stop)
    with open_relay(config.launch.backend, Path(worker.metrics_path)) as relay:
        stage.relay = relay
        try:
            return stage.run()
        except (StageBusy, StageSuperseded) as refused:
            print(refused, file=sys.stderr, flush=True)
            return None


def main(argv: list[str] | None = None) -> int:
    """`python -m ito_assets.runtime.supervision.supervisor --worker W.json --supervisor S.json` (what Pipes runs)."""
    arguments = refused_arguments("ito_assets.runtime.supervision.supervisor", argv)
    if arguments is None:
        return 1
    worker, config = arguments
    report = supervised(Supervisor(worker=worker, config=config), worker, config)
    if report is None:
        return 1
    print_outcome({"stage": report.stage, "outcome": report.outcome.value, "num_attempts": report.num_attempts,
                   **({"error_code": report.error_code} if report.error_code else {})})
    return 0 if report.outcome is Outcome.SUCCEEDED else 1


def print_outcome(summary: dict) -> None:
    """The stage's outcome on one JSON line, for a person who ran the supervisor by hand. Under
    Pipes the stage reads REPORT_NAME and records it in its metadata: the line would only reach
    the terminal of whoever runs the job, among its progress lines."""
    if PIPES_CONTEXT_ENV_VAR not in os.environ:
        print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
