"""The worker: one rank of one stage attempt, launched by `torch.distributed.run`.

    python -m torch.distributed.run --nproc-per-node 2 -m ito_assets.runtime.worker.main --config CONFIG

It resumes from the newest whole checkpoint of the stage (replica group 0's, for every group;
else the previous stage's final checkpoint, else fresh), trains to the stage's step count with heartbeats and asynchronous
checkpoints, flushes a checkpoint when asked to stop (SIGTERM/SIGINT), proposes a restart when the
loss or gradient norm spikes (and keeps training: only the desk restarts), and at the end saves the
final checkpoint, runs the stage's eval battery, and writes `result.json`. The ranks share the
model as the plan's layout says (`WorkerConfig.layout`, applied by `execution.prepare`). The loss
is next-token cross-entropy on windows or rows; DPO's on pair rows (`WorkerConfig.preference`,
`preference.Preference`, with the reference's log-probabilities read beside each batch's rows); or
GRPO's on groups a generator process samples beside the rank (`WorkerConfig.reinforcement`,
`reinforcement.Reinforcement`, the loader `ito_assets.posttraining.rollout_source`).
Under torchft replica groups (`WorkerConfig.replica_groups` > 1, `replica_sync`) the ranks are one
group of several that average gradients every step and heal each other; only group 0 saves
checkpoints, evaluates and proposes; every group's rank 0 writes a result with a digest of its
final weights. Rank 0 of group 0 reports through Dagster Pipes when launched under Pipes, else
(and in the other groups) to a JSONL metrics file. The layout it ran (`execution.Execution`) and
every field that fell back, with its reason, go into `result.json` and every checkpoint's marker.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from torch.distributed.tensor import DTensor

from ito_assets.runtime.worker import distributed, execution
from ito_assets.runtime.record import events
from ito_assets.runtime.checkpoint import holds
from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.checkpoint import registry
from ito_assets.runtime.supervision import proposals
from ito_assets.runtime.checkpoint import resume
from ito_assets.runtime.stage import battery as stage_eval
from ito_assets.runtime.worker import train_state
from ito_assets.runtime.worker.batches import BatchPlan, Loader, ResumableBatches
from ito_assets.runtime.checkpoint.saver import CheckpointConfig, Checkpointer, CheckpointRecord
from ito_assets.runtime.stage.config import RESULT_NAME, WorkerConfig
from ito_assets.runtime.stage.fitting import fit_layout
from ito_assets.runtime.record.events import Event, EventKind
from ito_assets.runtime.supervision import heartbeat
from ito_assets.runtime.supervision.heartbeat import HeartbeatWriter
from ito_assets.runtime.worker.preference import Preference, compute_reference, read_reference
from ito_assets.runtime.worker.reinforcement import Reinforcement
from ito_assets.runtime.worker.replica_sync import ReplicaSync, await_peers
from ito_assets.runtime.worker.reporting import Reporter, measured_figures, open_reporter
from ito_assets.runtime.supervision.spikes import Spike, SpikeDetector
from ito_assets.runtime.worker.step import StepResult, train_step
from ito_assets.runtime.record.storage import write_atomic
from ito_assets import progress
from ito_assets.errors import ErrorCode, ItoError, disk_full
from ito_assets.evals.suite import load_suite
from ito_assets.training.model import build_model
from ito_assets.training.tokenizer import load_tokenizer
from ito_assets.training.trainer import TrainConfig, build_optimizer

# sysexits.h EX_TEMPFAIL: stopped on request after flushing a checkpoint; resumable.
EXIT_STOPPED = 75
# sysexits.h EX_IOERR: the last checkpoint, or a line of the worker's own records, could not be written
# (STORAGE_FULL, CHECKPOINT_STORAGE_INVALID).
EXIT_STORAGE = 74
STORAGE_CODES = (ErrorCode.STORAGE_FULL, ErrorCode.CHECKPOINT_STORAGE_INVALID)
# sysexits.h EX_DATAERR: a rank refused its inputs with a code no restart changes.
EXIT_REFUSED = 65
REFUSAL_CODES = tuple(ErrorCode(code) for code in heartbeat.REFUSAL_CODES)
# Report every 10 steps through Pipes (torchtitan's default `log_freq`); every step goes to the events.
LOG_EVERY_STEPS = 10
# How often ranks paused on a non-finite step look for the desk's decision; heartbeats go out as often.
AWAIT_DESK_POLL_S = 1.0


class StageWorker:
    def __init__(self, config: WorkerConfig, group: distributed.Distributed, reporter: Reporter):
        self.config, self.group, self.reporter = config, group, reporter
        self.rank = group.rank
        self.stage_dir = Path(config.stage_dir)
        # Fitted again to the ranks really started (a no-op when the plan's host is this one).
        layout, refitted = fit_layout(config.layout, world_size=group.world_size * config.replica_groups,
                                      replica_groups=config.replica_groups, batch_size=config.batch_size)
        self.data_world_size = layout.dp  # ranks that take different rows: every rank but tensor-parallel peers
        self.train_config = TrainConfig(num_steps=config.num_steps, batch_size=config.batch_size // self.data_world_size,
                                        sequence_length=config.sequence_length, seed=config.seed,
                                        learning_rate=config.learning_rate, **config.optimizer)
        self.model = build_model(config.model_config(), seed=config.seed, device=group.device)
        self.preference = None if config.preference is None else Preference(self.model, config.preference)
        self.reinforcement = None if config.reinforcement is None else Reinforcement(self.model, config.reinforcement)
        if self.reinforcement is not None and group.world_size > 1:  # the config allows one; this is what started
            raise ValueError("reinforcement trains on one rank: its generator serves one trainer")
        objective = self.preference if self.preference is not None else self.reinforcement
        # Before building the optimizer: FSDP2 replaces the parameters with sharded ones.
        self.execution = execution.prepare(self.model, layout, (*config.layout_fallbacks, *refitted),
                                           device=group.device, world_size=group.world_size,
                                           replica_groups=config.replica_groups, objective=objective)
        self.reference_logprobs: torch.Tensor | None = None  # DPO's, per row: read with the rows in `run`
        self.optimizer = build_optimizer(self.model, self.train_config)
        self.checkpointer = Checkpointer(CheckpointConfig(directory=self.stage_dir, interval_steps=config.interval_steps,
                                                          keep_last=config.keep_last,
                                                          trained_with=self.trained_with(), owner=self.owner()),
                                         process_group=group.checkpoint_group, rank=self.rank)
        self.heartbeat = HeartbeatWriter(Path(config.heartbeat_dir), rank=self.rank, attempt=config.attempt)
        self.stop = distributed.StopFlag(group.device)
        self.spikes = SpikeDetector(config.spikes)
        self.next_positions: dict[int, int] = {}  # step -> data position of the batch after it
        self.step_seconds: list[float] = []  # this attempt's, for `measured_figures`
        self.saved_step = -1
        self.reached = -1  # the last step this attempt trained: the step of a storage failure's heartbeat
        self.writes_checkpoints = config.replica_id == 0  # one checkpoint lineage per stage: group 0's
        self.replicas = (ReplicaSync(config, group.device, self.model, self.optimizer, self.train_config)
                         if config.replica_groups > 1 else None)

    # --- the loop -------------------------------------------------------------------------------

    def run(self) -> int:
        try:
            return self.run_stage()
        except ItoError as error:
            if error.code in REFUSAL_CODES:  # the supervisor ends the stage with it, not a restart
                with contextlib.suppress(OSError):
                    self.heartbeat.beat(self.reached, heartbeat.REFUSED, force=True, detail=error.code.value)
            raise

    def run_stage(self) -> int:
        self.heartbeat.beat(-1, "starting", force=True)
        step, position = self.resume()
        batches = self.open_batches(position, to_train=step < self.config.num_steps)
        if self.replicas is not None:
            self.heartbeat.beat(-1, heartbeat.JOINING, force=True)
            waiting = await_peers(self.config.peer_heartbeat_dirs, self.config.replica_timeout_s, ranks=self.group.world_size,
                                  on_wait=lambda: self.heartbeat.beat(-1, heartbeat.JOINING),
                                  stopped=lambda: self.stop.requested)
            if waiting:
                self.log(f"{len(waiting)} other replica group(s) not loaded after {self.config.replica_timeout_s:g} s: "
                         "training on; they join behind and heal")
            self.replicas.start(step, position)
        # The attempt's devices: the telemetry's count where its supervisor never wrote the allocation.
        self.event(EventKind.STARTUP, seconds=max(0.0, time.time() - self.config.launched_at),
                   num_devices=self.group.world_size)
        try:
            return self.train(step, batches)
        finally:
            if self.replicas is not None:
                self.replicas.shutdown()
            if self.reinforcement is not None:
                batches.close()

    def open_batches(self, position: int, *, to_train: bool = True) -> Loader:
        """The stage's loader at `position`: its shard's windows or rows (with DPO's reference
        log-probabilities beside them, unless no step is left `to_train`), or GRPO's groups from a
        generator started at this version."""
        if self.config.reinforcement is not None:
            from ito_assets.posttraining.rollout_source import RolloutSource, read_tasks  # the generator's stack

            source = RolloutSource(self.config.reinforcement, model=self.model, reference=self.reference_model(),
                                   tasks=read_tasks(Path(self.config.tokens_path)), seed=self.config.seed,
                                   version=position)
            self.log(f"generator process {source.generator.pid} started at policy version {position}")
            return source
        batches = ResumableBatches(np.load(self.config.tokens_path, mmap_mode="r"), self._plan(), position=position)
        if self.config.preference is not None and to_train:
            self.reference_logprobs = self.preference_reference(batches.tokens)
        return batches

    def preference_reference(self, rows: np.ndarray) -> torch.Tensor:
        """DPO's reference log-probabilities: the file's where it exists (given with the rows, or
        written by an earlier attempt of this launch), else computed from the stage's start on
        the ranks' devices and written for a restart to read."""
        path = Path(self.config.preference.reference_path)
        if self.every_rank_sees(path):
            return read_reference(path, len(rows))
        started = time.perf_counter()
        reference = self.reference_model()
        found = compute_reference(reference, rows, rank=self.rank, world_size=self.group.world_size,
                                  on_pass=lambda: self.heartbeat.beat(-1, "starting"))
        del reference
        if self.rank == 0 and self.writes_checkpoints:
            with self.writing("the reference log-probabilities"):
                write_atomic(path, lambda handle: np.save(handle, found.numpy()))
        self.log(f"reference log-probabilities of {len(rows)} pairs computed in {time.perf_counter() - started:.1f} s")
        return found

    def every_rank_sees(self, path: Path) -> bool:
        """Whether `path` exists for every rank of the group: one answer for all, so that they take
        the same branch (a rank that computes meets its peers in the same collectives)."""
        seen = torch.tensor([1 if path.exists() else 0], device=self.group.device)
        if self.group.world_size > 1:
            torch.distributed.all_reduce(seen, op=torch.distributed.ReduceOp.MIN)
        return bool(seen.item())

    def reference_model(self) -> torch.nn.Module:
        """The frozen policy KL is measured against: the stage's start (`init_from`), else the seed's."""
        reference = build_model(self.model.config, seed=self.config.seed, device=self.group.device)
        if self.config.init_from:
            reason = train_state.load_weights(reference, Path(self.config.init_from), owner=self.init_owner(),
                                              rank=self.rank, group=self.group.checkpoint_group)
            if reason is not None:
                raise RuntimeError(f"the stage's starting checkpoint cannot be used as the reference: {reason}")
        return reference.requires_grad_(False)

    def train(self, step: int, batches: Loader) -> int:
        while step < self.config.num_steps:
            if self.stop.agreed() or step == self.config.stop_after_step:
                return self.flush(step, batches.position)
            result = self.train_one(step + 1, batches)
            step = self.reached = result.step
            if not result.committed:
                continue
            self.observe(result, batches)
            if not result.applied and self.await_desk(step):
                return self.flush(step, batches.position)
            if self.writes_checkpoints and self.checkpointer.due(step):
                self.save(step, batches.position)
            self.collect(self.finalized(self.checkpointer.poll))
        self.finish(step, batches.position)
        return 0

    def train_one(self, step: int, batches: Loader) -> StepResult:
        started = time.perf_counter()
        position, x, y = batches.next_batch()
        x, y = x.to(self.group.device), y.to(self.group.device)
        beside = None
        if self.reference_logprobs is not None:
            beside = self.reference_logprobs[torch.from_numpy(batches.rows_at(position))].to(self.group.device)
        elif self.reinforcement is not None:
            beside = batches.beside.to(self.group.device)
        optimizer = self.optimizer if self.replicas is None else self.replicas.optimizer_step
        reduce = None if self.replicas is None else self.replicas.reduce_gradients
        staging = []  # a save's staging wait is the checkpoint's blocking time, not the step's
        loss, grad_norm, lr, applied = train_step(self.execution, self.model, optimizer, x, y, step, self.train_config,
                                         before_update=lambda: staging.append(self.checkpointer.wait_staged()),
                                         reduce_gradients=reduce,
                                         count_targets=batches.has_rows and self.preference is None, beside=beside)
        if self.reinforcement is not None:  # one rank, no replica groups: this step is committed
            batches.trained(step)  # the generator's next weights
        metrics = self.objective_metrics(batches)
        committed = True
        if self.replicas is not None:
            reached, committed, position = self.replicas.settle(step, position, batches)
            if reached > step:
                self.log(f"healed from a peer replica group: step {step - 1} -> {reached}")
            step = reached
        result = StepResult(step=step, position=position, loss=loss, grad_norm=grad_norm, learning_rate=lr,
                            seconds=max(0.0, time.perf_counter() - started - sum(staging)), committed=committed,
                            applied=applied, metrics=metrics)
        if not committed:
            self.heartbeat.beat(step, "training")
            return result
        self.next_positions[step - 1] = position
        # A spike proposal rewinds at most this far (its checkpoint is within two intervals of the
        # rewind target); older positions are estimated, so the map stays bounded.
        self.next_positions.pop(step - 1 - self.config.spike_rewind_steps - 2 * self.config.interval_steps, None)
        self.heartbeat.beat(step, "training")
        return result

    def objective_metrics(self, batches: Loader) -> dict[str, float]:
        """The step's figures beyond its loss: DPO's accuracy and margin; GRPO's reward, KL, clip
        fraction and staleness counts. A collective on several ranks: every rank calls it every step."""
        if self.preference is not None:
            return self.preference.take_metrics(self.group.device)
        if self.reinforcement is not None:
            return {**batches.take_metrics(), **self.reinforcement.take_metrics(self.group.device)}
        return {}

    def trained_with(self) -> dict:
        """What trains the weights beyond the model's name: the layout run, its fallbacks, the positions."""
        shape = self.model.config
        return {"layout": self.execution.describe(),
                "positions": {"rope_theta": shape.rope_theta, "position_scale": shape.rope_position_scale},
                "data_order": self.data_order()}

    def data_order(self) -> dict:
        """What a data position means: global batches of `batch_size` windows of `sequence_length`,
        in `seed`'s order. A checkpoint written under another is not resumed (its position would
        read other windows, some twice)."""
        return {"batch_size": self.config.batch_size, "sequence_length": self.config.sequence_length,
                "seed": self.config.seed}

    # --- resume, save, finish -------------------------------------------------------------------

    def owner(self) -> dict:
        """Whose checkpoints this stage folder's are: into every marker, and required of the one resumed."""
        return {"run_key": self.config.run_key, "stage": self.config.stage}

    def init_owner(self) -> dict:
        """Who must have written `init_from`: this run, and the stage whose folder holds it. A
        worker's checkpoints lie in `<run>/<stage>/step-N` (`RunLayout.stage_dir`), and a chain that
        leaves a stage out hands on an earlier stage's, so the folder, not the list of stages, names
        the stage. A marker without an owner (written before owners were, or a start folder that
        no worker wrote: `train_state.save_weights`) is still taken, as on resume."""
        return {"run_key": self.config.run_key, "stage": Path(self.config.init_from).parent.name}

    def resume(self) -> tuple[int, int]:
        state = train_state.template(self.model, self.optimizer, rank=self.rank)
        # A replica group > 0 takes group 0's newest checkpoint: from its own first weights it
        # could reach group 0's step before group 0 rejoins, and torchft heals only a group behind.
        point = resume.load_latest(Path(self.config.resume_dir or self.stage_dir), state, rank=self.rank,
                                   group=self.group.checkpoint_group, owner=self.owner(),
                                   optional=train_state.OPTIONAL_PARTS,
                                   trained_with=markers.resume_terms(self.trained_with()))
        for skipped in point.skipped:
            self.log(f"skipped checkpoint step {skipped.step}: {skipped.reason}")
        step, position = 0, 0
        if point.step is not None:
            step, position, generators = train_state.apply(self.model, self.optimizer, state, rank=self.rank)
            if not resume.all_ok(generators, self.group.checkpoint_group):  # a collective: every rank asks
                self.log("some ranks' random generators are not in the checkpoint (fewer ranks wrote it): "
                         "theirs go on from this attempt's start")
            marker = markers.read_marker(Path(point.path))
            if marker is not None and marker.spike_history:  # absent in checkpoints from before it was kept
                self.spikes.restore(marker.spike_history)
            if marker is not None:
                self.list_resumed(Path(point.path), marker)
        elif self.config.init_from:
            self._init_from(Path(self.config.init_from))
        else:
            # The template's get_state_dict initialized AdamW's state with a zero-learning-rate
            # step; a fresh start begins from an untouched optimizer, as the trainer does.
            self.optimizer.state.clear()
        self.saved_step = step if point.step is not None else -1
        self.next_positions[step] = position
        self.event(EventKind.RESUME, step=step if point.step is not None else -1,
                   detail=f"from {point.path}" if point.path else "fresh")
        self.log(f"attempt {self.config.attempt}: starting at step {step} (position {position})")
        return step, position

    def list_resumed(self, folder: Path, marker: markers.Marker) -> None:
        """The resumed checkpoint in the registry (rank 0 of group 0, whose folder it is): an attempt
        killed between its marker (written on the save's thread) and the record (appended at the
        next poll) left it whole but unlisted, and `ito checkpoints` would never show it; this
        attempt does not save its step again."""
        if self.rank != 0 or not self.writes_checkpoints:
            return
        with self.writing("the checkpoint registry"):
            listed = registry.list_from_marker(self.stage_dir, folder, marker)
        if listed is not None:
            self.log(f"checkpoint step {listed.step} was whole but not in the registry "
                     "(its attempt ended before recording it): listed now")

    def _init_from(self, path: Path) -> None:
        if self.config.init_optimizer:
            state = train_state.template(self.model, self.optimizer, rank=self.rank, weights_only=True)
        else:
            state = {"model": train_state.weights(self.model)}
        reason = resume.load_checkpoint(path, state, rank=self.rank, group=self.group.checkpoint_group,
                                        owner=self.init_owner())
        if reason is not None:
            raise RuntimeError(f"the previous stage's final checkpoint cannot be used: {reason}")
        if self.config.init_optimizer:
            train_state.apply(self.model, self.optimizer, state, rank=self.rank)
        else:
            train_state.set_weights(self.model, state["model"])
            self.optimizer.state.clear()  # the template's zero-rate step: a fresh AdamW, as a fresh start's

    def save(self, step: int, position: int) -> None:
        """Start the save of `step`, heartbeating while the previous save still writes (slow
        storage is not a hang)."""
        self.heartbeat.beat(step, "checkpointing", force=True)
        state = train_state.capture(self.model, self.optimizer, step=step, position=position, rank=self.rank)
        tick = lambda: self.heartbeat.beat(step, "checkpointing")
        self.checkpointer.save(step, state, spike_history=self.spikes.state(), on_tick=tick)
        self.saved_step = step

    def collect(self, records: list[CheckpointRecord]) -> None:
        for failure in self.checkpointer.take_failures():
            self.log(f"the checkpoint of step {failure.step} failed ({failure.code.value}: {failure.reason}); its partial "
                     f"files were removed, the newest whole checkpoint stays, training goes on")
        for record in records:
            self.event(EventKind.CHECKPOINT, step=record.step, seconds=record.blocking_seconds,
                       total_seconds=record.total_seconds, num_bytes=record.num_bytes)
            self.metrics(record.step, {"checkpoint_bytes": record.num_bytes,
                                       "checkpoint_blocking_seconds": record.blocking_seconds,
                                       "checkpoint_total_seconds": record.total_seconds})

    def finalized(self, take: Callable[[], list[CheckpointRecord]]) -> list[CheckpointRecord]:
        """The saves `take` (the checkpointer's poll, wait or close) finalized: rank 0 appends each to the registry."""
        with self.writing("the checkpoint registry"):
            return take()

    def drain(self, step: int) -> None:
        """Wait for the save in flight (heartbeating meanwhile), record it, release the stager.
        The last save must hold: if it failed for its storage, the attempt ends with the storage's
        code, which every rank's heartbeat tells the supervisor (torchrun's own exit code does not)."""
        tick = lambda: self.heartbeat.beat(step, "checkpointing")
        self.collect(self.finalized(lambda: self.checkpointer.wait(on_tick=tick)))
        self.checkpointer.agree()
        last = next((f for f in self.checkpointer.failures if f.step == step), None)
        self.collect(self.finalized(self.checkpointer.close))
        if last is not None:
            with contextlib.suppress(OSError):  # the heartbeats may share the broken storage
                self.heartbeat.beat(step, heartbeat.STORAGE_FAILED, force=True, detail=last.code.value)
            raise ItoError(last.code, f"the checkpoint of step {step} could not be written ({last.reason})")

    def flush(self, step: int, position: int) -> int:
        """Stop requested: make sure the step reached is in a whole checkpoint, then exit."""
        if self.writes_checkpoints and self.saved_step != step:
            self.save(step, position)
        self.drain(step)
        self.heartbeat.beat(step, "stopped", force=True)
        self.log(f"stopped at step {step} after flushing a checkpoint")
        return EXIT_STOPPED

    def finish(self, step: int, position: int) -> None:
        if self.writes_checkpoints and self.saved_step != step:
            self.save(step, position)
        self.drain(step)
        self.heartbeat.beat(step, "evaluating", force=True)
        body: dict = {"stage": self.config.stage, "num_steps": step, **self.trained_with(),
                      "measured": measured_figures(self.step_seconds, self.group.device)}
        if self.replicas is not None:
            body |= {"replica_id": self.config.replica_id, "parameters_sha256": self.parameters_digest()}
        body |= self.evaluate() if self.writes_checkpoints else {}
        if self.rank == 0:
            if self.writes_checkpoints:
                final = markers.checkpoint_dir(self.stage_dir, step)
                if (marker := markers.read_marker(final)) is None:
                    raise RuntimeError(f"the final checkpoint of step {step} has no marker: it was not saved whole")
                body |= {"final_checkpoint": str(final), "metadata_sha256": marker.metadata_sha256}
            with self.writing("the stage's result"):
                write_atomic(self.stage_dir / RESULT_NAME, json.dumps(body, sort_keys=True).encode())
        self.heartbeat.beat(step, "finished", force=True)

    def parameters_digest(self) -> str | None:
        """sha256 of the full weights (rank 0; None elsewhere): equal in every replica group that
        trained in step, whatever healed it. A collective under FSDP2: every rank calls it."""
        weights = train_state.full_weights(self.model)
        if self.rank != 0:
            return None
        digest = hashlib.sha256()
        for name in sorted(weights):
            digest.update(name.encode())
            digest.update(weights[name].detach().cpu().contiguous().numpy().tobytes())
        return "sha256:" + digest.hexdigest()

    def evaluate(self) -> dict:
        """The eval battery of the trained model and, for a first stage, of the untrained one."""
        if not self.config.heldout_path:
            return {}
        trained = self.unsharded_model()  # a collective under FSDP2: every rank takes part
        if self.rank != 0:
            return {}
        started = time.perf_counter()
        battery = self.battery()
        beat = lambda: self.heartbeat.beat(self.config.num_steps, "evaluating")
        # The units go with the metrics: the gate bootstraps its noise band over them (runtime.stage.noise).
        body = _scored("eval", stage_eval.battery_units(trained, battery, on_batch=beat))
        if self.config.init_from is None:
            untrained = build_model(self.model.config, seed=self.config.seed, device=self.group.device)
            body |= _scored("initial_eval", stage_eval.battery_units(untrained, battery, on_batch=beat))
        self.event(EventKind.EVALUATION, seconds=time.perf_counter() - started)
        self.metrics(self.config.num_steps, {f"eval_{k}": v for k, v in body["eval"].items()})
        return body

    def unsharded_model(self) -> torch.nn.Module | None:
        """The trained model as one plain module on rank 0 (None on the others). FSDP2's shards and
        tensor-parallel slices are gathered into a fresh copy, so that rank 0 evaluates alone."""
        if not any(isinstance(p, DTensor) for p in self.model.parameters()):  # neither FSDP2 nor tensor parallel
            return self.model if self.rank == 0 else None
        weights = train_state.full_weights(self.model)
        if self.rank != 0:
            return None
        copy = build_model(self.model.config, seed=self.config.seed, device=self.group.device)
        copy.load_state_dict(weights)
        return copy

    def battery(self) -> stage_eval.Battery:
        heldout = np.load(self.config.heldout_path, mmap_mode="r")
        sizes = {"sequence_length": self.config.eval_sequence_length, "num_windows": self.config.eval_windows}
        if self.config.eval_suite_path is None:
            return stage_eval.Battery(heldout=heldout, **sizes)
        suite = load_suite(Path(self.config.eval_suite_path))
        if suite.digest != self.config.eval_suite_sha256:
            raise ItoError(ErrorCode.EVAL_SUITE_MISMATCH,
                           "the eval suite changed since the stage was planned; its battery would not compare")
        return stage_eval.Battery(heldout=heldout, tokenizer=load_tokenizer(Path(self.config.tokenizer_path)),
                                  items=suite.items, **sizes)

    # --- observation: events, metrics, spikes ---------------------------------------------------

    def observe(self, result: StepResult, batches: Loader) -> None:
        self.event(EventKind.STEP, step=result.step, seconds=result.seconds, loss=result.loss,
                   metrics=result.metrics or None, detail="" if result.applied else events.NOT_APPLIED)
        self.step_seconds.append(result.seconds)
        self.report_progress(result.step)
        if result.step % LOG_EVERY_STEPS == 0 or result.step == self.config.num_steps:
            tokens_per_second = batches.tokens_at(result.position) / result.seconds
            self.metrics(result.step, {"loss": result.loss, "grad_norm": result.grad_norm,
                                       "learning_rate": result.learning_rate,
                                       "tokens_per_second": tokens_per_second, **result.metrics})
        spike = self.spikes.observe(result.step, result.loss, result.grad_norm)
        if spike is not None and self.rank == 0 and self.writes_checkpoints:
            self.propose(spike, result.position)

    def await_desk(self, step: int) -> bool:
        """A step whose loss or gradient was not finite was not applied, and its spike proposal
        (made at once: the detector flags any non-finite value) awaits the desk: train no further
        until it is decided. Approved, the supervisor restarts the stage from the proposal's
        checkpoint (this attempt is stopped); rejected, training goes on. Returns whether a stop
        was requested meanwhile. Every rank polls and agrees, so none trains alone."""
        if self.replicas is not None:  # one group cannot hold the others' quorum: the step is only dropped
            self.log(f"step {step}: loss or gradient not finite; the update was dropped")
            return False
        self.log(f"step {step}: loss or gradient not finite; the update was dropped and training waits for the desk")
        store = proposals.ProposalStore(self.stage_dir)
        while True:
            self.heartbeat.beat(step, "awaiting_desk", force=True)
            flags = torch.tensor([int(self.stop.requested), int(bool(store.pending()))], device=self.group.device)
            if torch.distributed.is_initialized() and self.group.world_size > 1:
                torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
            if flags[0]:
                return True
            if not flags[1]:
                self.log(f"step {step}: the desk decided; training goes on")
                return False
            time.sleep(AWAIT_DESK_POLL_S)

    def propose(self, spike: Spike, spike_position: int) -> None:
        store = proposals.ProposalStore(self.stage_dir)
        if store.pending():
            self.log(f"{spike.metric} spike at step {spike.step}; a proposal is already pending")
            return
        # As pruning counts them: a folder whose marker lies (another step, a shard missing or cut
        # short), another's, or a link would be a restart point that cannot be resumed.
        whole = [markers.step_of(p) for p in markers.candidates(self.stage_dir) if markers.intact(p, self.owner())]
        restart, skip_first, skip_end = proposals.plan_restart(
            spike.step, spike_position, whole_steps=whole, next_positions=self.next_positions,
            rewind_steps=self.config.spike_rewind_steps)
        proposal = proposals.propose(spike, run_key=self.config.run_key, stage=self.config.stage,
                                     restart_from_step=restart, skip_first=skip_first, skip_end=skip_end)
        if restart > 0:
            holds.hold(self.stage_dir, restart, proposal.proposal_id)
        store.add(proposal)
        self.log(f"{spike.metric} spike at step {spike.step} ({spike.value:.4g}, mean {spike.mean:.4g}): "
                 f"proposal {proposal.proposal_id} awaits the desk (restart from step {restart})")

    def report_progress(self, step: int) -> None:
        """A line in the stage's log at every tenth of its steps: where it is, how fast, how long to go."""
        total = self.config.num_steps
        if self.rank != 0 or not progress.crossed(step - 1, step, total):
            return
        recent = self.step_seconds[-LOG_EVERY_STEPS:]
        per_step = sum(recent) / len(recent)
        self.log(progress.line(step, total, "steps", 1 / per_step if per_step > 0 else None))

    def event(self, kind: EventKind, **fields) -> None:
        if self.rank == 0:
            with self.writing("the stage's events"):
                events.append(self.stage_dir, Event(kind=kind, at=time.time(), attempt=self.config.attempt, **fields),
                              by_worker=True)

    def metrics(self, step: int, values: dict) -> None:
        with self.writing("the metrics file"):
            self.reporter.metrics(step, values)

    def log(self, message: str) -> None:
        with self.writing("the metrics file"):
            self.reporter.log(f"[{self.config.stage}] {message}")

    @contextlib.contextmanager
    def writing(self, what: str) -> Iterator[None]:
        """Rank 0's own appends (events, the checkpoint registry, metrics and log lines) on a full
        disk or past a file-size limit: the attempt ends as a failed last checkpoint ends it, with
        the storage's code in its heartbeat (torchrun's exit code does not carry it) and `main`'s
        EXIT_STORAGE, not a traceback; a restart cannot write there either."""
        try:
            yield
        except OSError as error:
            code = ErrorCode.STORAGE_FULL if disk_full(error) else ErrorCode.CHECKPOINT_STORAGE_INVALID
            with contextlib.suppress(OSError):  # the heartbeats may share the broken storage
                self.heartbeat.beat(self.reached, heartbeat.STORAGE_FAILED, force=True, detail=code.value)
            reason = error.strerror or type(error).__name__
            raise ItoError(code, f"{what} could not be written ({reason})") from error

    def _plan(self) -> BatchPlan:
        return BatchPlan(batch_size=self.config.batch_size, sequence_length=self.config.sequence_length,
                         seed=self.config.seed, rank=data_rank(self.config, self.rank, self.group.world_size,
                                                               self.execution.layout.tp),
                         world_size=self.data_world_size, skip_ranges=self.config.skip_ranges,
                         length_multiple=self.execution.layout.tp)


def data_rank(config: WorkerConfig, rank: int, group_world_size: int, tp: int = 1) -> int:
    """This rank's share of every global batch: replica groups split it first, then their
    data-parallel ranks; the tp ranks of one tensor-parallel group (neighbours, the mesh's
    innermost dimension) take the same rows."""
    return config.replica_id * (group_world_size // tp) + rank // tp


def _scored(name: str, units: dict) -> dict:
    """`name`: each metric's pooled value; `name`_units: the units it pooled."""
    return {name: {k: u.pooled for k, u in units.items()}, f"{name}_units": {k: u.to_dict() for k, u in units.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ito_assets.runtime.worker.main")
    parser.add_argument("--config", required=True, help="the worker config as JSON, or the path of a JSON file")
    config = WorkerConfig.from_argument(parser.parse_args(argv).config)
    if config.deterministic:
        # Deterministic kernels make a resume bit-exact on GPUs; cuBLAS needs this workspace setting for it.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    group = distributed.init(config.collective_timeout_s)
    try:
        # One Pipes writer per stage: replica group 0's rank 0; the other groups' go to their files.
        with open_reporter(group.rank, Path(config.metrics_path), pipes=config.replica_id == 0) as reporter:
            return StageWorker(config, group, reporter).run()
    except ItoError as error:
        if error.code not in STORAGE_CODES + REFUSAL_CODES:
            raise
        print(error, file=sys.stderr, flush=True)  # "CODE: message" in the attempt's log, not a traceback
        return EXIT_STORAGE if error.code in STORAGE_CODES else EXIT_REFUSED
    finally:
        distributed.shutdown()


if __name__ == "__main__":
    sys.exit(main())
