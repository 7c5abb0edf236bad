"""The stage's core entry points without Dagster: `prepare` writes the worker config and names the
supervisor; `conclude` reads the report once, judges the gate, keeps the verdict and publishes."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.runtime.stage import run as stage_run
from ito_assets.runtime.stage.config import launch_of
from ito_assets.runtime.stage.eval_gate import Direction, EvalGatePolicy, GatedMetric, VerdictStore
from ito_assets.runtime.supervision.supervisor import REPORT_NAME, SupervisorConfig

POLICY = EvalGatePolicy(metrics=(GatedMetric(name="heldout_loss", direction=Direction.LOWER_IS_BETTER, noise_band=0.01),))


@dataclass(frozen=True)
class _Config:
    stage: str
    stage_dir: str
    replica_groups: int
    launch_id: str = ""

    def to_json(self) -> str:
        return json.dumps({"stage": self.stage, "stage_dir": self.stage_dir, "launch_id": self.launch_id})


def _prepared(tmp_path: Path, replica_groups: int = 1) -> stage_run.PreparedStage:
    (tmp_path / "pretraining").mkdir(exist_ok=True)  # the run layout makes it when the config is built
    config = _Config(stage="pretraining", stage_dir=str(tmp_path / "pretraining"), replica_groups=replica_groups)
    return stage_run.prepare(config, SupervisorConfig(nnodes=1, nproc_per_node=2), python="py")


def test_prepare_writes_the_config_and_names_the_supervisor(tmp_path) -> None:
    ready = _prepared(tmp_path)
    assert json.loads((ready.stage_dir / stage_run.CONFIG_NAME).read_text())["stage"] == "pretraining"
    assert ready.command[:3] == ("py", "-m", stage_run.SUPERVISOR_MODULE)
    assert ready.command[3:5] == ("--worker", str(ready.stage_dir / stage_run.CONFIG_NAME))
    assert json.loads(ready.command[6])["nproc_per_node"] == 2
    assert _prepared(tmp_path, replica_groups=2).command[2] == stage_run.REPLICA_GROUPS_MODULE
    config = _Config(stage="pretraining", stage_dir=str(ready.stage_dir), replica_groups=1)
    assert stage_run.prepare(config, SupervisorConfig(nnodes=1, nproc_per_node=2)).command[0] == sys.executable


def test_each_prepare_is_a_launch_of_its_own_that_the_config_and_the_command_name(tmp_path) -> None:
    """The supervisor compares the two once it holds the folder (tests/runtime/test_restart_budget.py)."""
    first = _prepared(tmp_path)
    assert len(first.launch_id) == 32 and json.loads(first.command[6])["launch_id"] == first.launch_id
    assert launch_of(first.stage_dir) == first.launch_id
    second = _prepared(tmp_path)
    assert second.launch_id != first.launch_id and launch_of(second.stage_dir) == second.launch_id


def _units(loss: float) -> dict:
    return {"heldout_loss": {"loss": [loss * 4] * 3, "tokens": [4] * 3}}  # three windows that agree


def _report(ready: stage_run.PreparedStage, loss: float) -> None:
    result = {"eval": {"heldout_loss": loss}, "initial_eval": {"heldout_loss": 6.0}, "final_checkpoint": "ck",
              "num_steps": 3, "metadata_sha256": "a" * 64, "eval_units": _units(loss), "initial_eval_units": _units(6.0)}
    (ready.stage_dir / REPORT_NAME).write_text(json.dumps({"result": result, "num_attempts": 2}))


def _conclude(ready, tmp_path):
    return stage_run.conclude(ready, ledger=SimpleNamespace(), run_id="run_1", run_dir=tmp_path, policy=POLICY,
                              previous_eval=None, previous_stage=None)


def test_conclude_judges_against_the_untrained_battery_and_publishes(tmp_path, monkeypatch) -> None:
    published = []
    monkeypatch.setattr(stage_run, "publish_stage", lambda *args: published.append(args))
    ready = _prepared(tmp_path)
    _report(ready, loss=5.0)  # better than the untrained 6.0 by far more than the band
    outcome = _conclude(ready, tmp_path)
    assert outcome.gate_passed and outcome.num_attempts == 2 and outcome.final_checkpoint == "ck"
    assert VerdictStore(tmp_path).read("pretraining")["passed"] is True
    assert [(p[1], p[2], p[4]) for p in published] == [("run_1", "pretraining", {"heldout_loss": 5.0})]


def test_a_failed_gate_is_kept_and_cannot_be_concluded_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(stage_run, "publish_stage", lambda *args: None)
    ready = _prepared(tmp_path)
    _report(ready, loss=6.0)  # no better than untrained: the gate fails
    assert not _conclude(ready, tmp_path).gate_passed
    with pytest.raises(ItoError) as raised:
        _conclude(ready, tmp_path)
    assert raised.value.code is ErrorCode.EVAL_GATE_FAILED
