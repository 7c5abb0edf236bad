"""What a stage asset hands downstream and shows in the UI: its final checkpoint, its evals, its
gate verdict and how many attempts it took. Built from the files the runtime wrote."""

import json
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from ito_assets.runtime.record import events
from ito_assets.runtime.checkpoint import registry
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.stage.eval_gate import EvalGateVerdict
from ito_assets.runtime.supervision.supervisor import REPORT_NAME
from ito_assets.runtime.record.goodput import summarize


@dataclass(frozen=True, kw_only=True)
class StageCheckpoint:
    stage: str
    run_dir: str
    stage_dir: str
    final_checkpoint: str
    num_steps: int
    metadata_sha256: str
    eval: dict
    gate: dict  # EvalGateVerdict.to_dict()
    num_attempts: int

    @property
    def gate_passed(self) -> bool:
        return bool(self.gate["passed"])


def read_outcome(stage: str, run_dir: Path, stage_dir: Path, verdict: EvalGateVerdict) -> StageCheckpoint:
    report = json.loads((stage_dir / REPORT_NAME).read_text())
    result = report["result"]
    return StageCheckpoint(stage=stage, run_dir=str(run_dir), stage_dir=str(stage_dir),
                           final_checkpoint=result["final_checkpoint"], num_steps=result["num_steps"],
                           metadata_sha256=result["metadata_sha256"], eval=result["eval"], gate=verdict.to_dict(),
                           num_attempts=report["num_attempts"])


def _loss_table(stage_dir: Path, num_rows: int = 10) -> str:
    losses = sorted((e.step, e.loss) for e in events.read(stage_dir) if e.kind is EventKind.STEP and e.loss is not None)
    latest = dict(losses)  # a step redone after a restart keeps its last loss
    steps = sorted(latest)
    picked = steps[:: max(1, len(steps) // num_rows)] + steps[-1:]
    rows = "\n".join(f"| {s} | {latest[s]:.4f} |" for s in dict.fromkeys(picked))
    return f"| step | loss |\n|---|---|\n{rows}"


def outcome_metadata(outcome: StageCheckpoint) -> dict:
    stage_dir = Path(outcome.stage_dir)
    telemetry = summarize(events.read(stage_dir))
    checkpoints = registry.read(stage_dir)
    return {
        "final_checkpoint": dg.MetadataValue.path(outcome.final_checkpoint),
        "metadata_sha256": outcome.metadata_sha256,
        "num_steps": outcome.num_steps,
        "num_attempts": outcome.num_attempts,
        **{name: value for name, value in sorted(outcome.eval.items())},  # the stage's eval battery
        "gate_passed": outcome.gate_passed,
        "gate": dg.MetadataValue.json(outcome.gate),
        "goodput": telemetry.goodput,
        "num_checkpoints": len(checkpoints),
        "checkpoint_blocking_seconds": telemetry.checkpoint_blocking_seconds,
        "checkpoint_bandwidth_bytes_per_second": telemetry.checkpoint_bandwidth_bytes_per_second,
        "loss_curve": dg.MetadataValue.md(_loss_table(stage_dir)),
    }
