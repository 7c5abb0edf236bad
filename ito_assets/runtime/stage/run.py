"""One stage of a run, as the Dagster asset calls it: `prepare`, run the returned command (the asset
runs it through Pipes), then `conclude`.

`prepare` writes the worker config where the supervisor reads it and names the supervisor's
command line (the replica-group supervisor when the plan replicates). `conclude` reads the
supervisor's report once, judges the eval gate against the previous stage, records the verdict,
sets the measured step time beside the predicted one (`calibration`), publishes the stage's
checkpoints and figures to the ledger and returns what the stage hands downstream. The Dagster shell only adds metadata.
"""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping

from ito_assets.control.ledger import Ledger
from ito_assets.runtime.record.publish import publish_stage
from ito_assets.runtime.record.storage import write_atomic
from ito_assets.runtime.stage.calibration import calibrate
from ito_assets.runtime.stage.config import CONFIG_NAME, WorkerConfig
from ito_assets.runtime.stage.eval_gate import EvalGatePolicy, VerdictStore, judge_stage
from ito_assets.runtime.stage.noise import Units
from ito_assets.runtime.supervision.supervisor import REPORT_NAME, SupervisorConfig
from ito_assets.training.layout import Layout
from ito_assets.training.planner import PlanRequest

SUPERVISOR_MODULE = "ito_assets.runtime.supervision.supervisor"
REPLICA_GROUPS_MODULE = "ito_assets.runtime.supervision.replicas"


@dataclass(frozen=True, kw_only=True)
class StageCheckpoint:
    """What a finished stage hands downstream: its final checkpoint, evals, gate verdict, attempts."""

    stage: str
    run_dir: str
    stage_dir: str
    final_checkpoint: str
    num_steps: int
    metadata_sha256: str
    eval: dict
    gate: dict  # EvalGateVerdict.to_dict()
    num_attempts: int
    layout: dict = field(default_factory=dict)  # what the worker ran, and each fallback's reason
    calibration: dict = field(default_factory=dict)  # `calibration.Calibration.to_dict`; empty: not timed
    eval_units: dict = field(default_factory=dict)  # each metric's units (`noise.Units.to_dict`); empty: not recorded

    @property
    def gate_passed(self) -> bool:
        return bool(self.gate["passed"])


@dataclass(frozen=True)
class PreparedStage:
    stage: str
    stage_dir: Path
    command: tuple[str, ...]
    launch_id: str = ""


def prepare(config: WorkerConfig, supervisor: SupervisorConfig, *, python: str = sys.executable) -> PreparedStage:
    """Write the config, under a fresh launch id that the command names too: the supervisor runs
    this config only, not one a later launch of the stage wrote over it before it started."""
    stage_dir = Path(config.stage_dir)
    launch_id = uuid.uuid4().hex
    write_atomic(stage_dir / CONFIG_NAME, replace(config, launch_id=launch_id).to_json().encode())
    module = REPLICA_GROUPS_MODULE if config.replica_groups > 1 else SUPERVISOR_MODULE
    command = (python, "-m", module, "--worker", str(stage_dir / CONFIG_NAME),
               "--supervisor", json.dumps(asdict(replace(supervisor, launch_id=launch_id))))
    return PreparedStage(config.stage, stage_dir, command, launch_id)


def _units(recorded: Mapping[str, dict]) -> dict[str, Units]:
    return {name: Units.from_dict(body) for name, body in recorded.items()}


def conclude(prepared: PreparedStage, *, ledger: Ledger, run_id: str, run_dir: Path, policy: EvalGatePolicy,
             previous_eval: Mapping[str, float] | None, previous_stage: str | None,
             previous_units: Mapping[str, dict] | None = None, priced: PlanRequest | None = None) -> StageCheckpoint:
    """`previous_eval`: the previous stage's battery (`previous_units`: its units, when recorded),
    or None for the first stage, which is compared with the untrained model's battery (the worker
    measures it, and its units, before the first step). `priced`:
    the planner's request for the hardware the stage ran on, which prices its predicted step time
    and memory (`calibration`)."""
    report = json.loads((prepared.stage_dir / REPORT_NAME).read_text())
    result = report["result"]
    if previous_eval is None:
        previous_eval, previous_units = result["initial_eval"], result.get("initial_eval_units")
    verdict = judge_stage(prepared.stage, _units(result["eval_units"]), previous_eval, policy,
                          previous_stage=previous_stage, previous_units=_units(previous_units) if previous_units else None)
    VerdictStore(run_dir).record(verdict)
    calibrated = (calibrate(priced, Layout.from_dict(result["layout"]["ran"]), result.get("measured", {}))
                  if priced is not None and "layout" in result else None)
    figures = {} if calibrated is None else {"predicted_step_s": calibrated.predicted_step_s,
                                             "measured_step_s": calibrated.measured_step_s,
                                             "step_time_ratio": calibrated.step_time_ratio}
    publish_stage(ledger, run_id, prepared.stage, prepared.stage_dir, result["eval"], figures)
    return StageCheckpoint(stage=prepared.stage, run_dir=str(run_dir), stage_dir=str(prepared.stage_dir),
                           final_checkpoint=result["final_checkpoint"], num_steps=result["num_steps"],
                           metadata_sha256=result["metadata_sha256"], eval=result["eval"],
                           eval_units=result["eval_units"], gate=verdict.to_dict(),
                           num_attempts=report["num_attempts"], layout=result.get("layout", {}),
                           calibration={} if calibrated is None else calibrated.to_dict())
