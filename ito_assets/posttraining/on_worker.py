"""SFT and DPO on the stage worker, under the supervisor, as the pretraining stages train: the pairs
become rows (`sft.sft_rows`, `dpo.dpo_rows`), the worker trains them from the stage's starting
weights with the post-training optimizer (`optim.WORKER_RECIPE`: a constant rate, a fresh AdamW),
in the batches the in-process loop draws, with heartbeats, checkpoints and restarts; the final
checkpoint's weights then come back into the policy the stage evaluates and gates.

SFT starts from the stage's first weights (the pretraining chain's checkpoint, or the seed's);
DPO and RLVR from the policy they are given, written as a checkpoint the worker loads, which is
also their frozen reference. DPO trains against the reference's log-probabilities, which the
worker computes at its start on its devices, each rank a share of the pairs
(`dpo.reference_logprobs`), and keeps for a restart of the same launch; RLVR on groups its
generator process samples beside the worker (`rollout_source`), with the start as the reference
its KL is measured against.

The worker's events (each step, its checkpoints, the supervisor's allocation and interruptions)
go into the stage folder beside the stage's own (its evaluations and the policy's save), so desk
telemetry reads one log. A rerun of the stage in the same folder resumes from the newest whole
checkpoint there.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.base import PolicySpec, load_pretrained
from ito_assets.posttraining.dpo import DpoConfig, DpoResult, dpo_batches
from ito_assets.posttraining.fixtures import InstructionPair, PreferencePair
from ito_assets.posttraining.optim import WORKER_RECIPE
from ito_assets.posttraining.policy import CausalLM
from ito_assets.posttraining.rlvr import RlvrConfig, RlvrResult, RlvrStepStats
from ito_assets.posttraining.rollout_source import write_tasks
from ito_assets.posttraining.sft import SftConfig, SftResult, sft_batches
from ito_assets.posttraining.staleness import StalenessReport
from ito_assets.posttraining.tasks import Task
from ito_assets.posttraining.vocab import TextCodec
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import Event, EventKind
from ito_assets.runtime.record.storage import write_atomic
from ito_assets.runtime.stage import run as stage_run
from ito_assets.runtime.stage.config import CONFIG_NAME, PreferenceObjective, ReinforcementObjective, WorkerConfig
from ito_assets.runtime.supervision.spikes import SpikeConfig
from ito_assets.runtime.supervision.supervisor import (LAUNCH_ROLE, REPORT_NAME, Outcome, StageBusy, StageSuperseded,
                                                        SupervisorConfig, supervising)
from ito_assets.runtime.worker import train_state
from ito_assets.runtime.worker.batches import IGNORE, ResumableBatches
from ito_assets.training.layout import Layout

ROWS_NAME = "rows.npy"
REFERENCE_NAME = "reference_logprobs.npy"  # DPO's: (N, 2), the rows' order
START_NAME = "start"  # DPO's and RLVR's starting weights, as a checkpoint folder the worker loads
TASKS_NAME = "tasks.jsonl"  # RLVR's prompts


def layout(batch_size: int, num_ranks: int = 1) -> Layout:
    """fp32, eager, the batch split evenly over `num_ranks` data-parallel ranks, each rank's share
    one micro-batch, as the in-process loop steps (sixteen micro-batches of one row: 75 ms a step
    against 9 ms for the micro model on CPU). Several ranks shard the weights, gradients and
    optimizer state (FSDP2), so a policy too large for one device trains too; the stage's
    evaluation runs in the asset's process."""
    if batch_size % num_ranks:
        raise ValueError(f"a batch of {batch_size} does not split evenly over {num_ranks} ranks")
    return Layout(dp_shard=num_ranks, precision="fp32", compile=False, micro_batch_size=batch_size // num_ranks)


@dataclass(frozen=True, kw_only=True)
class WorkerLaunch:
    """How a stage reaches the worker: `run` executes the supervisor's command line and returns
    when it has ended (the Dagster asset runs it through Pipes; a test, as a subprocess)."""

    run: Callable[[Sequence[str]], object]
    run_key: str  # the run's id: the worker's proposals and heartbeats name it
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
    interval_steps: int = 100  # checkpoint every this many steps (and at the end)
    keep_last: int = 2


@dataclass(frozen=True, kw_only=True)
class _Stage:
    """What differs between the stages a worker trains: the rest is `_config`'s."""

    name: str
    spec: PolicySpec
    learning_rate: float
    batch_size: int
    seed: int
    num_steps: int
    init_from: str | None
    preference: PreferenceObjective | None = None
    reinforcement: ReinforcementObjective | None = None
    micro_batch_size: int | None = None  # None: the whole batch
    spikes: SpikeConfig = field(default_factory=SpikeConfig)


def _config(stage: _Stage, rows: ResumableBatches | None, *, stage_dir: Path, launch: WorkerLaunch,
            data_path: Path | None = None, sequence_length: int | None = None) -> WorkerConfig:
    """The worker's config; `rows` are written beside it, else the stage reads `data_path` (RLVR's tasks)."""
    if rows is not None:
        data_path, sequence_length = stage_dir / ROWS_NAME, rows.plan.sequence_length
        write_atomic(data_path, lambda handle: np.save(handle, rows.tokens))
    return WorkerConfig(
        run_key=launch.run_key, stage=stage.name, model=stage.spec.model_name, vocab_size=stage.spec.vocab_size,
        tokens_path=str(data_path), heldout_path=None, stage_dir=str(stage_dir),
        heartbeat_dir=str(stage_dir / "heartbeats"), metrics_path=str(stage_dir / "metrics.jsonl"),
        num_steps=stage.num_steps, batch_size=stage.batch_size, sequence_length=sequence_length,
        interval_steps=min(launch.interval_steps, stage.num_steps), keep_last=launch.keep_last, seed=stage.seed,
        learning_rate=stage.learning_rate, optimizer=dict(WORKER_RECIPE),
        layout=_layout(stage, launch.supervisor.world_size), init_from=stage.init_from, init_optimizer=False,
        preference=stage.preference, reinforcement=stage.reinforcement, spikes=stage.spikes,
        rope_theta=stage.spec.rope_theta, position_scale=stage.spec.position_scale)


def _layout(stage: _Stage, num_ranks: int) -> Layout:
    if stage.micro_batch_size is None:
        return layout(stage.batch_size, num_ranks)
    if num_ranks != 1:  # RLVR's micro-batch is a group, and its generator serves one trainer
        raise ValueError(f"the {stage.name.upper()} stage trains on one rank, not {num_ranks}")
    return Layout(precision="fp32", compile=False, micro_batch_size=stage.micro_batch_size)


def sft_on_worker(policy: CausalLM, spec: PolicySpec, codec: TextCodec, pairs: Sequence[InstructionPair],
                    config: SftConfig, *, stage_dir: Path, launch: WorkerLaunch) -> SftResult:
    """SFT: train `pairs` on the worker from the stage's first weights and load its final weights into `policy`."""
    if spec.init_checkpoint is None and spec.seed != config.seed:
        # The worker draws a fresh start's weights and the batches' order from one seed.
        raise ValueError("a stage that starts from the seed's weights trains on the worker only when the policy's "
                         "seed is the stage's")
    batches, num_steps = sft_batches(codec, pairs, config)
    stage = _Stage(name="sft", spec=spec, learning_rate=config.learning_rate, batch_size=config.batch_size,
                   seed=config.seed, num_steps=num_steps, init_from=spec.init_checkpoint)
    with _writing_inputs(stage_dir):
        prepared = _prepare(_config(stage, batches, stage_dir=stage_dir, launch=launch), launch)
    finished = _run(policy, prepared, launch)
    steps = finished.steps
    return SftResult(losses=tuple(steps[s].loss for s in sorted(steps)), num_steps=num_steps,
                     num_response_tokens=_targets(batches, num_steps), wall_seconds=finished.seconds)


def dpo_on_worker(policy: CausalLM, spec: PolicySpec, codec: TextCodec, pairs: Sequence[PreferencePair],
                  config: DpoConfig, *, stage_dir: Path, launch: WorkerLaunch) -> DpoResult:
    """DPO: train `pairs` on the worker from `policy`'s weights, which are also the frozen
    reference, and load the worker's final weights into `policy`."""
    batches, num_steps = dpo_batches(codec, pairs, config)
    reference_path = stage_dir / REFERENCE_NAME
    objective = PreferenceObjective(reference_path=str(reference_path), beta=config.beta,
                                    label_smoothing=config.label_smoothing, rpo_alpha=config.rpo_alpha)
    with _writing_inputs(stage_dir):
        # An earlier launch's values belong to its start and pairs: this launch's first attempt computes its own.
        reference_path.unlink(missing_ok=True)
        start = train_state.save_weights(policy, stage_dir / START_NAME)
        stage = _Stage(name="dpo", spec=spec, learning_rate=config.learning_rate, batch_size=config.batch_size,
                       seed=config.seed, num_steps=num_steps, init_from=str(start), preference=objective)
        prepared = _prepare(_config(stage, batches, stage_dir=stage_dir, launch=launch), launch)
    finished = _run(policy, prepared, launch)
    steps = [e for _, e in sorted(finished.steps.items())]
    return DpoResult(losses=tuple(e.loss for e in steps), accuracies=tuple(e.metrics["accuracy"] for e in steps),
                     mean_margin=steps[-1].metrics["margin"], num_steps=num_steps, wall_seconds=finished.seconds)


def rlvr_on_worker(policy: CausalLM, spec: PolicySpec, tasks: Sequence[Task], config: RlvrConfig, *,
                   stage_dir: Path, launch: WorkerLaunch, prompt_length: int) -> RlvrResult:
    """RLVR: GRPO on groups of `tasks` from `policy`'s weights (also the KL's reference), on the
    worker with its generator process; loads the final weights into `policy`. `prompt_length`:
    the longest prompt's tokens with bos, so that the worker's model holds prompt and completion."""
    if config.updates_per_step != 1:
        raise ValueError("on the worker one batch is one optimizer step: updates_per_step must be 1")
    tasks_path = stage_dir / TASKS_NAME
    with _writing_inputs(stage_dir):
        write_tasks(list(tasks), tasks_path)
        start = train_state.save_weights(policy, stage_dir / START_NAME)
        prepared = _prepare(_rlvr_worker(spec, config, stage_dir=stage_dir, launch=launch, start=start,
                                         tasks_path=tasks_path, prompt_length=prompt_length), launch)
    finished = _run(policy, prepared, launch)
    steps = [e for _, e in sorted(finished.steps.items())]
    return RlvrResult(steps=tuple(_rlvr_step(e) for e in steps), staleness=_staleness(steps, config.max_staleness),
                      num_weight_syncs=int(sum(e.metrics.get("weight_syncs", 0) for e in steps)),
                      num_steps_without_signal=int(sum(e.metrics.get("steps_without_signal", 0) for e in steps)),
                      num_groups_drawn=_groups_drawn(finished.recorded),
                      wall_seconds=finished.seconds)


def _rlvr_worker(spec: PolicySpec, config: RlvrConfig, *, stage_dir: Path, launch: WorkerLaunch, start: Path,
                 tasks_path: Path, prompt_length: int) -> WorkerConfig:
    """RLVR's worker config: GRPO's objective, a group a micro-batch, the tasks file as its data."""
    tokenizer = spec.tokenizer
    objective = ReinforcementObjective(
        group_size=config.group_size, groups_per_step=config.groups_per_step, max_new_tokens=config.max_new_tokens,
        overlong_cache=config.overlong_cache, clip_eps_low=config.clip_eps_low, clip_eps_high=config.clip_eps_high,
        max_staleness=config.max_staleness, importance_weight_cap=config.importance_weight_cap,
        max_draws_per_group=config.max_draws_per_group, sync_every=config.sync_every,
        tokenizer_path=None if tokenizer is None else tokenizer.path,
        tokenizer_sha256=None if tokenizer is None else tokenizer.sha256)
    # A micro-batch per group: a short batch (the draw bound hit) still splits evenly.
    stage = _Stage(name="rlvr", spec=spec, learning_rate=config.learning_rate,
                   batch_size=config.groups_per_step * config.group_size, seed=config.seed, num_steps=config.num_steps,
                   init_from=str(start), reinforcement=objective, micro_batch_size=config.group_size,
                   spikes=SpikeConfig(judge_loss=False))  # a surrogate's loss: only a non-finite one is flagged
    return _config(stage, None, stage_dir=stage_dir, launch=launch, data_path=tasks_path,
                   sequence_length=prompt_length + config.max_new_tokens)


def _rlvr_step(event: Event) -> RlvrStepStats:
    m = event.metrics
    return RlvrStepStats(step=event.step, policy_version=event.step, mean_score=m["reward"], loss=event.loss,
                         kl_to_reference=m["kl_to_reference"], clip_fraction=m["clip_fraction"],
                         num_groups_used=int(m["groups_used"]), num_dropped_all_equal=int(m.get("dropped_all_equal", 0)),
                         num_dropped_stale=int(sum(v for k, v in m.items() if k.startswith("dropped_staleness_"))))


def _groups_drawn(recorded: Sequence[Event]) -> int:
    """Every group the attempts' finished steps drew, a redone step's included: each passed the
    staleness filter once, admitted or dropped."""
    return int(sum(value for e in recorded for key, value in e.metrics.items()
                   if key.startswith(("admitted_staleness_", "dropped_staleness_"))))


def _staleness(steps: list[Event], max_staleness: int) -> StalenessReport:
    """The staleness of every group the final steps drew, used and dropped, from their events."""
    counts = {"admitted": {}, "dropped": {}}
    for event in steps:
        for key, value in event.metrics.items():
            kind, _, lag = key.partition("_staleness_")
            if kind in counts:
                counts[kind][int(lag)] = counts[kind].get(int(lag), 0) + int(value)
    return StalenessReport(max_staleness=max_staleness, admitted=counts["admitted"], dropped=counts["dropped"])


@contextlib.contextmanager
def _writing_inputs(stage_dir: Path):
    """Hold the stage folder's lock while this launch writes its inputs there (rows, start weights,
    DPO's reference table, RLVR's tasks, the worker's config): a stage that another supervisor still
    runs keeps its own, and this launch is refused (STAGE_BUSY) before it touches them. The
    earlier config goes first: an earlier launch's supervisor that takes the lock after this one
    (even after this launch died half-way) finds no config of its own and starts nothing."""
    stage_dir.mkdir(parents=True, exist_ok=True)
    with _holding(stage_dir):
        (stage_dir / CONFIG_NAME).unlink(missing_ok=True)
        yield


@contextlib.contextmanager
def _holding(stage_dir: Path, launch_id: str = "", doing: str = "wrote and started nothing there"):
    """The stage folder's lock, as a launch holds it (`supervising`; another launch's brief hold
    is waited for), its refusals as STAGE_BUSY. `doing`: what this launch did, for the message."""
    try:
        with supervising(stage_dir, role=LAUNCH_ROLE, launch_id=launch_id):
            yield
    except StageBusy as busy:
        raise ItoError(ErrorCode.STAGE_BUSY, f"{busy.holder} holds the stage folder {stage_dir}: this launch {doing} "
                       "(one at a time per stage folder); run it again once that one ended") from None
    except StageSuperseded:
        raise ItoError(ErrorCode.STAGE_BUSY, f"a later launch of the stage rewrote its inputs in {stage_dir} after this "
                       "one wrote them: this launch hands nothing on (the later one's does)") from None


def refuse_if_running(stage_dir: Path) -> None:
    """STAGE_BUSY where a supervisor runs the stage in `stage_dir` (another launch's brief hold is
    waited for): checked before a launch records or evaluates anything there (the stage's own
    timeline would take its events)."""
    stage_dir.mkdir(parents=True, exist_ok=True)
    with _holding(stage_dir):
        pass


def _prepare(worker: WorkerConfig, launch: WorkerLaunch) -> stage_run.PreparedStage:
    """The supervisor's command, its config written; an earlier launch's report removed, so that
    the one read after this launch is its own."""
    (Path(worker.stage_dir) / REPORT_NAME).unlink(missing_ok=True)
    return stage_run.prepare(worker, launch.supervisor)


@dataclass(frozen=True)
class _Finished:
    """The stage's step events, every attempt's, a redone step's included."""

    recorded: tuple[Event, ...]

    @property
    def steps(self) -> dict[int, Event]:
        """Each step as the last attempt that trained it recorded it (an earlier attempt's step
        redone after a restart is superseded)."""
        return {e.step: e for e in self.recorded if e.step is not None}

    @property
    def seconds(self) -> float:
        """Every attempt's step time, a redone step's included: what training took."""
        return sum(e.seconds for e in self.recorded)


def _run(policy: CausalLM, prepared: stage_run.PreparedStage, launch: WorkerLaunch) -> _Finished:
    """Launch the supervisor, wait for it, and load the final checkpoint's weights into `policy`.
    A supervisor that ended the stage failed exits 1 (Pipes raises on it): its report's code is
    the error's, else the launch's own error stands. The result is read under the folder's lock
    and only while its config is still this launch's: a later launch may have written its inputs
    before this one's supervisor started (which then started nothing) or since it ended."""
    failed: Exception | None = None
    try:
        launch.run(prepared.command)
    except Exception as error:  # noqa: BLE001 - decided below, once the report is read
        failed = error
    try:
        with _holding(prepared.stage_dir, prepared.launch_id, doing="launched its supervisor and read no result"):
            return _result(policy, prepared, failed)
    except ItoError as refused:
        if failed is not None and refused is not failed and refused.code is ErrorCode.STAGE_BUSY:
            raise refused from failed  # the launch's own failure stays on the record
        raise


def _result(policy: CausalLM, prepared: stage_run.PreparedStage, failed: Exception | None) -> _Finished:
    path = prepared.stage_dir / REPORT_NAME
    report = json.loads(path.read_text()) if path.exists() else None
    if failed is not None and (report is None or report["outcome"] == Outcome.SUCCEEDED.value):
        raise failed  # no report, or the stage succeeded and the launch failed for another reason
    if report is None:
        raise ItoError(ErrorCode.INTERNAL_ERROR, f"the {prepared.stage.upper()} stage's supervisor ended without a "
                       "report (its log says why)")
    if report["outcome"] != Outcome.SUCCEEDED.value:
        code = report.get("error_code")
        attempts = report["num_attempts"]
        raise ItoError(ErrorCode(code) if code else ErrorCode.INTERNAL_ERROR, f"the {prepared.stage.upper()} stage's "
                       f"worker ended {report['outcome']} after {attempts} attempt{'' if attempts == 1 else 's'}")
    load_pretrained(policy, Path(report["result"]["final_checkpoint"]))
    return _Finished(recorded=tuple(e for e in events.read(prepared.stage_dir) if e.kind is EventKind.STEP))


def _targets(batches: ResumableBatches, num_steps: int) -> int:
    """Targets the run's batches hold: the stage's response tokens, as the in-process loop counts them."""
    again = ResumableBatches(batches.tokens, batches.plan)
    return sum(int((again.next_batch()[2] != IGNORE).sum()) for _ in range(num_steps))
