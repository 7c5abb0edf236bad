"""The curriculum of one run: the manifest's stages as worker configs, in order, and where each
stage keeps its files.

The checkpoint folder is the one the server resolved from the policy's `storage_uri` inside the
tenant's area and proved writable before it created the run (`gates.validation`); the runtime
only keeps every path it creates inside it.

    <run checkpoint dir>/<run id>/                       the run folder (gate verdicts)
        <stage>/                                         checkpoints, registry, events, proposals
        <stage>/heartbeats/                              one file per rank
        <stage>/metrics.jsonl                            rank 0's metrics when not under Pipes

Step counts come from the stage's token count: ceil(num_tokens / (batch_size x sequence_length)),
so a stage trains on at least the tokens the manifest reviewed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from ito_assets.manifest.schema import CheckpointPolicy, Stage, TrainingTarget
from ito_assets.runtime.config import WorkerConfig
from ito_assets.runtime.storage import child, ensure_dir


@dataclass(frozen=True, kw_only=True)
class RunLayout:
    checkpoint_dir: Path  # the run's folder as the server approved it
    run_dir: Path

    @classmethod
    def for_run(cls, checkpoint_dir: Path, run_id: str) -> "RunLayout":
        return cls(checkpoint_dir=checkpoint_dir, run_dir=child(checkpoint_dir, run_id))

    def stage_dir(self, stage: str) -> Path:
        """One folder per run and stage: restarts of a stage share it, runs never do."""
        return ensure_dir(child(self.run_dir, stage), self.checkpoint_dir)


@dataclass(frozen=True, kw_only=True)
class StageSizing:
    model: str  # ito_assets.training.model.CONFIGS name
    vocab_size: int
    batch_size: int  # global, in sequences
    seed: int = 0
    learning_rate: float = 3e-3

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.vocab_size < 1:
            raise ValueError("batch_size and vocab_size must be positive")


def num_steps(stage: Stage, batch_size: int) -> int:
    return math.ceil(stage.num_tokens / (batch_size * stage.sequence_length))


def previous_stage(target: TrainingTarget, name: str) -> str | None:
    names = [s.name for s in target.stages]
    index = names.index(name)
    return names[index - 1] if index > 0 else None


def find_stage(target: TrainingTarget, name: str) -> Stage | None:
    return next((s for s in target.stages if s.name == name), None)


def worker_config(*, run_key: str, stage: Stage, policy: CheckpointPolicy, layout: RunLayout, sizing: StageSizing,
                  tokens_path: Path, heldout_path: Path, init_from: str | None) -> WorkerConfig:
    folder = layout.stage_dir(stage.name)
    return WorkerConfig(
        run_key=run_key, stage=stage.name, model=sizing.model, vocab_size=sizing.vocab_size,
        tokens_path=str(tokens_path), heldout_path=str(heldout_path), stage_dir=str(folder),
        heartbeat_dir=str(folder / "heartbeats"), metrics_path=str(folder / "metrics.jsonl"),
        num_steps=num_steps(stage, sizing.batch_size), batch_size=sizing.batch_size,
        sequence_length=stage.sequence_length, interval_steps=policy.interval_steps, keep_last=policy.keep_last,
        seed=sizing.seed, learning_rate=sizing.learning_rate, init_from=init_from, launched_at=time.time(),
    )
