"""The previous stage's final checkpoint (`init_from`) must be this run's, and the stage's whose
folder holds it; a marker from before owners were recorded is still taken, as on resume. In
process: the worker's `_init_from` on a small model, no process group."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.worker import train_state
from ito_assets.runtime.worker.main import StageWorker

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
RUN = "run-a"


def _model(value: float) -> torch.nn.Module:
    model = torch.nn.Linear(4, 4, bias=False)
    torch.nn.init.constant_(model.weight, value)
    return model


def _final(root: Path, stage: str, owner: dict | None) -> Path:
    """A stage's final checkpoint in `<run>/<stage>/step-3`, its marker naming `owner`."""
    folder = markers.checkpoint_dir(root / stage, 3)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save({"model": train_state.weights(_model(3.0))}, checkpoint_id=str(folder))
    markers.write_marker(folder, 3, owner=owner)
    return folder


def _worker(init_from: Path, run_key: str = RUN):
    model = _model(0.0)
    config = SimpleNamespace(run_key=run_key, stage="mid_training", init_from=str(init_from), init_optimizer=False)
    worker = SimpleNamespace(config=config, model=model, optimizer=torch.optim.AdamW(model.parameters()), rank=0,
                             group=SimpleNamespace(checkpoint_group=None))
    worker.init_owner = lambda: StageWorker.init_owner(worker)
    return worker


def _start(init_from: Path, run_key: str = RUN) -> float:
    worker = _worker(init_from, run_key)
    StageWorker._init_from(worker, init_from)
    return float(worker.model.weight.detach()[0, 0])


@pytest.mark.parametrize("owner", [{"run_key": RUN, "stage": "pretraining"}, None])
def test_this_runs_previous_stage_or_an_owner_less_marker_is_taken(tmp_path, owner):
    assert _start(_final(tmp_path, "pretraining", owner)) == 3.0


@pytest.mark.parametrize("owner", [{"run_key": "run-b", "stage": "pretraining"},  # another run's
                                   {"run_key": RUN, "stage": "sft"}])  # another stage's, copied into this folder
def test_another_runs_or_stages_checkpoint_is_refused(tmp_path, owner):
    with pytest.raises(RuntimeError, match="the marker names another run or stage"):
        _start(_final(tmp_path, "pretraining", owner))


def test_the_reference_model_is_held_to_the_same_owner(tmp_path, monkeypatch):
    """DPO's frozen reference loads `init_from` as well (`reference_model`): the same check."""
    from ito_assets.runtime.worker import main

    monkeypatch.setattr(main, "build_model", lambda *args, **kwargs: _model(0.0))
    theirs = _worker(_final(tmp_path / "b", "pretraining", {"run_key": "run-b", "stage": "pretraining"}))
    ours = _worker(_final(tmp_path / "a", "pretraining", {"run_key": RUN, "stage": "pretraining"}))
    for worker in (theirs, ours):
        worker.config.seed, worker.model.config, worker.group.device = 0, None, "cpu"
    with pytest.raises(RuntimeError, match="the marker names another run or stage"):
        StageWorker.reference_model(theirs)
    assert float(StageWorker.reference_model(ours).weight.detach()[0, 0]) == 3.0
