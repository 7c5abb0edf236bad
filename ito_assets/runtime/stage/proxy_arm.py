"""One arm of the data decision, trained through the stage worker as a curriculum stage is.

The supervisor launches the worker, one rank alone (heartbeats, restarts, asynchronous
checkpoints); the worker applies the layout (precision, compile, micro-batches) and writes the
runtime events. The trained weights come back from its final checkpoint, where the decision
scores them on the eval suite (`ito_assets.training.decision`). The worker runs no eval battery
of its own (`heldout_path` None).

Each arm trains in a fresh folder of its own (`<work dir>/arms/<arm>-seed<seed>/`): an earlier
decision's folder may hold another configuration's checkpoints, which a resume would pick up.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.stage.config import WorkerConfig
from ito_assets.runtime.stage.fitting import Fallback
from ito_assets.runtime.supervision.supervisor import Outcome, Supervisor, SupervisorConfig
from ito_assets.runtime.worker import train_state
from ito_assets.training.layout import Layout
from ito_assets.training.model import DecoderLM, build_model
from ito_assets.training.model_config import ModelConfig, flops_per_token
from ito_assets.training.trainer import TrainConfig, TrainResult


@dataclass(frozen=True, kw_only=True)
class ArmLaunch:
    """How every arm runs on this host: the layout fitted to its ranks, what the fitting changed
    (with its reasons) and the supervisor's bounds."""

    layout: Layout
    fallbacks: tuple[Fallback, ...] = ()
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)

    def train(self, *, arm_dir: Path, tokens_path: Path, model_config: ModelConfig,
              config: TrainConfig) -> tuple[DecoderLM, TrainResult]:
        """Train one arm to `config.num_steps`; returns its trained model and its loss history."""
        if arm_dir.exists():
            shutil.rmtree(arm_dir)
        worker = WorkerConfig(
            run_key="decision", stage=arm_dir.name, model=model_config.name, vocab_size=model_config.vocab_size,
            tokens_path=str(tokens_path.resolve()), heldout_path=None, stage_dir=str(arm_dir.resolve()),
            heartbeat_dir=str((arm_dir / "heartbeats").resolve()), metrics_path=str((arm_dir / "metrics.jsonl").resolve()),
            num_steps=config.num_steps, batch_size=config.batch_size, sequence_length=config.sequence_length,
            interval_steps=config.num_steps, keep_last=1, seed=config.seed, learning_rate=config.learning_rate,
            layout=self.layout, layout_fallbacks=self.fallbacks)
        report = Supervisor(worker=worker, config=self.supervisor).run()
        if report.outcome is not Outcome.SUCCEEDED:
            raise ItoError(ErrorCode(report.error_code) if report.error_code else ErrorCode.DECISION_ARM_FAILED,
                           f"the decision arm {arm_dir.name} did not finish: {report.outcome.value} after "
                           f"{report.num_attempts} attempt(s)")
        model = _trained_model(Path(report.result["final_checkpoint"]), model_config, config.seed)
        return model, _history(arm_dir, model_config, config)


def _trained_model(checkpoint: Path, model_config: ModelConfig, seed: int) -> DecoderLM:
    model = build_model(model_config, seed=seed)
    reason = train_state.load_weights(model, checkpoint)
    if reason is not None:
        raise ItoError(ErrorCode.DECISION_ARM_FAILED, f"the arm's final checkpoint cannot be used: {reason}")
    return model


def _history(arm_dir: Path, model_config: ModelConfig, config: TrainConfig) -> TrainResult:
    """The arm's losses by step from its event log; a step done again after a restart counts once,
    as its last run. Wall time is the training steps' (start-up and the final save are not)."""
    kept = {e.step: e for e in events.read(arm_dir) if e.kind is EventKind.STEP}  # time order: the last run wins
    if sorted(kept) != list(range(1, config.num_steps + 1)):
        raise ItoError(ErrorCode.DECISION_ARM_FAILED, f"the arm {arm_dir.name} logged steps {sorted(kept)[:5]}...")
    steps = [kept[s] for s in sorted(kept)]
    wall = sum(e.seconds for e in steps)
    num_tokens = config.num_steps * config.tokens_per_step
    return TrainResult(losses=tuple(float(e.loss) for e in steps), num_steps=config.num_steps, num_tokens=num_tokens,
                       wall_seconds=wall, tokens_per_second=num_tokens / wall if wall > 0 else float("inf"),
                       model_flops=flops_per_token(model_config, config.sequence_length) * num_tokens)
