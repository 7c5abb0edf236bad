"""The curriculum of one run: the manifest's stages as worker configs, in order, and where each
stage keeps its files.

The checkpoint folder is the one the server resolved from the policy's `storage_uri` inside the
tenant's area and proved writable before it created the run (`gates.validation`); the runtime
only keeps every path it creates inside it.

    <run checkpoint dir>/<run id>/                       the run folder (gate verdicts)
        <stage>/                                         checkpoints, registry, events, proposals
        <stage>/heartbeats/                              one file per rank
        <stage>/metrics.jsonl                            rank 0's metrics when not under Pipes

What comes from where:
    the plan (`training_plan`, per stage)   the model shape, the global batch in sequences, and
                                            the layout the worker applies: degrees (tensor
                                            parallelism, FSDP2 shards, HSDP or DDP replicas),
                                            precision, activation checkpointing, micro-batch and
                                            compile, fitted to the attempt's ranks
                                            (`fitting.fit_layout`); a layout that replicates
                                            (dp_replicate > 1) trains as torchft replica groups
                                            (`replicas.py`)
    the runtime resource (this machine)     the number of local ranks, the seed, optionally a
                                            smaller global batch for a host that cannot hold the
                                            plan's, whether replica groups are used at all,
                                            compile and deterministic kernels
Step counts come from the stage's token count: ceil(num_tokens / (batch_size x sequence_length)),
the plan's own formula, so a stage trains on at least the tokens the manifest reviewed and, at the
plan's batch, for exactly the plan's number of steps.
"""

from __future__ import annotations

import importlib.util
import math
import time
from dataclasses import dataclass
from pathlib import Path

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import CheckpointPolicy, Stage, TrainingTarget
from ito_assets.runtime.stage.config import WorkerConfig, group_shape
from ito_assets.runtime.stage.fitting import Fallback, fit_layout
from ito_assets.runtime.record.storage import RunLayout
from ito_assets.training.layout import Layout
from ito_assets.training.planner import Plan
from ito_assets.training.run_plan import RunPlan


@dataclass(frozen=True, kw_only=True)
class StageSizing:
    model: str  # ito_assets.training.model_config.CONFIGS name
    vocab_size: int
    batch_size: int  # global, in sequences
    seed: int = 0
    learning_rate: float = 3e-3
    layout: Layout  # fitted to world_size (`fitting.fit_layout`)
    layout_fallbacks: tuple[Fallback, ...] = ()
    world_size: int = 1  # ranks that will train the stage, over all replica groups
    replica_groups: int = 1  # torchft replica groups the ranks form (`replica_groups_for`)
    deterministic: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.vocab_size < 1 or self.world_size < 1 or self.replica_groups < 1:
            raise ValueError("batch_size, vocab_size, world_size and replica_groups must be positive")
        if self.layout.world_size != self.world_size:
            raise ValueError("the layout's degrees must multiply to world_size")
        if self.batch_size % self.layout.dp:
            raise ValueError("batch_size must be divisible by the data-parallel ranks: every one takes an equal share")
        if self.world_size % self.replica_groups:
            raise ValueError("world_size must be divisible by replica_groups: every group has as many ranks")


def stage_plan(run_plan: RunPlan, name: str) -> Plan:
    found = next((s.plan for s in run_plan.stages if s.stage == name), None)
    if found is None:
        raise ItoError(ErrorCode.PLAN_REFUSED, f"the training plan has no {name} stage")
    return found


def replica_groups_for(layout: Layout, *, nnodes: int, nproc_per_node: int) -> int:
    """torchft replica groups where the plan replicates (dp_replicate > 1) and the attempt's nodes,
    or the ranks of its one node, split evenly into dp_replicate groups (`config.group_shape`);
    else 1: one DDP or FSDP2 group over all ranks, as before replica groups existed."""
    groups = layout.dp_replicate
    if groups < 2 or group_shape(nnodes, nproc_per_node, groups) is None:
        return 1
    if importlib.util.find_spec("torchft") is None:
        raise ItoError(ErrorCode.CAPABILITY_MISSING,
                       f"the plan replicates (dp_replicate={groups}) and torchft is not installed: install the "
                       "`ft` extra, or turn replica groups off in the training runtime resource")
    return groups


def sizing_from_plan(plan: Plan, *, vocab_size: int, world_size: int, seed: int, batch_size: int | None = None,
                     replica_groups: int = 1, eager_reason: str | None = None, fp32_reason: str | None = None,
                     deterministic: bool = False) -> StageSizing:
    """The plan's model, global batch and layout on `world_size` ranks in `replica_groups` groups;
    `batch_size` (the runtime resource's override) replaces the plan's batch. Raises
    CAPABILITY_MISSING for a layout the worker cannot train."""
    batch = batch_size or plan.request.global_batch_sequences
    layout, fallbacks = fit_layout(plan.layout, world_size=world_size, replica_groups=replica_groups,
                                   batch_size=batch, eager_reason=eager_reason, fp32_reason=fp32_reason)
    return StageSizing(model=plan.request.model.name, vocab_size=vocab_size, seed=seed, world_size=world_size,
                       batch_size=batch, layout=layout, layout_fallbacks=fallbacks, replica_groups=replica_groups,
                       deterministic=deterministic)


def num_steps(stage: Stage, batch_size: int) -> int:
    return math.ceil(stage.num_tokens / (batch_size * stage.sequence_length))


def positions(target: TrainingTarget, name: str) -> dict[str, float | None]:
    """The stage's RoPE base and position interpolation: its own, else the nearest earlier stage's
    that sets them (a long-context stage's raised base stays for the stages after it), else None,
    the model's."""
    found: dict[str, float | None] = {"rope_theta": None, "position_scale": None}
    for stage in target.stages:
        for key in found:
            if getattr(stage, key) is not None:
                found[key] = getattr(stage, key)
        if stage.name == name:
            return found
    raise ValueError(f"the training target has no {name} stage")


def previous_stage(target: TrainingTarget, name: str) -> str | None:
    names = [s.name for s in target.stages]
    index = names.index(name)
    return names[index - 1] if index > 0 else None


def find_stage(target: TrainingTarget, name: str) -> Stage | None:
    return next((s for s in target.stages if s.name == name), None)


def worker_config(*, run_key: str, stage: Stage, policy: CheckpointPolicy, layout: RunLayout, sizing: StageSizing,
                  tokens_path: Path, heldout_path: Path, init_from: str | None,
                  rope_theta: float | None = None, position_scale: float | None = None, **battery: str) -> WorkerConfig:
    """`battery`: tokenizer_path, eval_suite_path and eval_suite_sha256 (`WorkerConfig`); the
    positions: `positions` of the stage."""
    folder = layout.stage_dir(stage.name)
    return WorkerConfig(
        run_key=run_key, stage=stage.name, model=sizing.model, vocab_size=sizing.vocab_size,
        tokens_path=str(tokens_path), heldout_path=str(heldout_path), stage_dir=str(folder),
        heartbeat_dir=str(folder / "heartbeats"), metrics_path=str(folder / "metrics.jsonl"),
        num_steps=num_steps(stage, sizing.batch_size), batch_size=sizing.batch_size,
        sequence_length=stage.sequence_length, interval_steps=policy.interval_steps, keep_last=policy.keep_last,
        seed=sizing.seed, learning_rate=sizing.learning_rate, layout=sizing.layout,
        layout_fallbacks=sizing.layout_fallbacks, deterministic=sizing.deterministic, init_from=init_from,
        replica_groups=sizing.replica_groups, launched_at=time.time(), rope_theta=rope_theta,
        position_scale=position_scale, **battery,
    )
