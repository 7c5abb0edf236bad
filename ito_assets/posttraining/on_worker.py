"""Supervised fine-tuning on the stage worker, under the supervisor, as the pretraining stages train:
the pairs become rows (`sft.sft_rows`), the worker trains them from the stage's starting weights
with the post-training optimizer (`optim.WORKER_RECIPE`: a constant rate), in the batches the
in-process loop draws (`sft.sft_batches`), with heartbeats, checkpoints and restarts; the final
checkpoint's weights then come back into the policy the stage evaluates and gates.

The worker's events (each step, its checkpoints, the supervisor's allocation and interruptions)
go into the stage folder beside the stage's own (its evaluations and the policy's save), so desk
telemetry reads one log. A rerun of the stage in the same folder resumes from the newest whole
checkpoint there.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.base import PolicySpec, load_pretrained
from ito_assets.posttraining.fixtures import InstructionPair
from ito_assets.posttraining.optim import WORKER_RECIPE
from ito_assets.posttraining.policy import CausalLM
from ito_assets.posttraining.sft import SftConfig, SftResult, sft_batches
from ito_assets.posttraining.vocab import TextCodec
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.record.storage import write_atomic
from ito_assets.runtime.stage import run as stage_run
from ito_assets.runtime.stage.config import WorkerConfig
from ito_assets.runtime.supervision.supervisor import REPORT_NAME, Outcome, SupervisorConfig
from ito_assets.runtime.worker.batches import IGNORE, ResumableBatches
from ito_assets.training.layout import Layout

ROWS_NAME = "sft_rows.npy"


def layout(batch_size: int) -> Layout:
    """One rank in fp32, eager, the whole batch as one micro-batch, as the in-process loop steps
    (sixteen micro-batches of one row: 75 ms a step against 9 ms for the micro model on CPU). The
    post-training policies are small, and the stage's evaluation and generation run in this
    process on the same host."""
    return Layout(precision="fp32", compile=False, micro_batch_size=batch_size)


@dataclass(frozen=True, kw_only=True)
class WorkerLaunch:
    """How a stage reaches the worker: `run` executes the supervisor's command line and returns
    when it has ended (the Dagster asset runs it through Pipes; a test, as a subprocess)."""

    run: Callable[[Sequence[str]], object]
    run_key: str  # the run's id: the worker's proposals and heartbeats name it
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
    interval_steps: int = 100  # checkpoint every this many steps (and at the end)
    keep_last: int = 2


def worker_config(spec: PolicySpec, config: SftConfig, *, rows_path: Path, sequence_length: int, num_steps: int,
                  stage_dir: Path, launch: WorkerLaunch) -> WorkerConfig:
    return WorkerConfig(
        run_key=launch.run_key, stage="sft", model=spec.model_name, vocab_size=spec.vocab_size,
        tokens_path=str(rows_path), heldout_path=None, stage_dir=str(stage_dir),
        heartbeat_dir=str(stage_dir / "heartbeats"), metrics_path=str(stage_dir / "metrics.jsonl"),
        num_steps=num_steps, batch_size=config.batch_size, sequence_length=sequence_length,
        interval_steps=min(launch.interval_steps, num_steps), keep_last=launch.keep_last, seed=config.seed,
        learning_rate=config.learning_rate, optimizer=dict(WORKER_RECIPE), layout=layout(config.batch_size),
        init_from=spec.init_checkpoint, init_optimizer=False)


def train_on_worker(policy: CausalLM, spec: PolicySpec, codec: TextCodec, pairs: Sequence[InstructionPair],
                    config: SftConfig, *, stage_dir: Path, launch: WorkerLaunch) -> SftResult:
    """Train `pairs` on the worker and load its final weights into `policy`."""
    if spec.init_checkpoint is None and spec.seed != config.seed:
        # The worker draws a fresh start's weights and the batches' order from one seed.
        raise ValueError("a stage that starts from the seed's weights trains on the worker only when the policy's "
                         "seed is the stage's")
    batches, num_steps = sft_batches(codec, pairs, config)
    stage_dir.mkdir(parents=True, exist_ok=True)
    rows_path = stage_dir / ROWS_NAME
    write_atomic(rows_path, _npy_bytes(batches.tokens))
    worker = worker_config(spec, config, rows_path=rows_path, sequence_length=batches.plan.sequence_length,
                           num_steps=num_steps, stage_dir=stage_dir, launch=launch)
    prepared = stage_run.prepare(worker, launch.supervisor)
    launch.run(prepared.command)
    report = json.loads((stage_dir / REPORT_NAME).read_text())
    if report["outcome"] != Outcome.SUCCEEDED.value:
        code = report.get("error_code")
        attempts = report["num_attempts"]
        raise ItoError(ErrorCode(code) if code else ErrorCode.INTERNAL_ERROR, f"the SFT stage's worker ended "
                       f"{report['outcome']} after {attempts} attempt{'' if attempts == 1 else 's'}")
    load_pretrained(policy, Path(report["result"]["final_checkpoint"]))
    steps = _final_losses(stage_dir)
    return SftResult(losses=tuple(steps[s] for s in sorted(steps)), num_steps=num_steps,
                     num_response_tokens=_targets(batches, num_steps), wall_seconds=_step_seconds(stage_dir))


def _npy_bytes(rows: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, rows)
    return buffer.getvalue()


def _final_losses(stage_dir: Path) -> dict[int, float]:
    """Each step's loss as the last attempt that trained it recorded it (an earlier attempt's
    step redone after a restart is superseded)."""
    return {e.step: e.loss for e in events.read(stage_dir) if e.kind is EventKind.STEP and e.step is not None}


def _step_seconds(stage_dir: Path) -> float:
    """Every attempt's step time, a redone step's included: what training took."""
    return sum(e.seconds for e in events.read(stage_dir) if e.kind is EventKind.STEP)


def _targets(batches: ResumableBatches, num_steps: int) -> int:
    """Targets the run's batches hold: the stage's response tokens, as the in-process loop counts them."""
    again = ResumableBatches(batches.tokens, batches.plan)
    return sum(int((again.next_batch()[2] != IGNORE).sum()) for _ in range(num_steps))
