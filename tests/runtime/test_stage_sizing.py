"""What the plan decides for a stage (model, global batch, DDP or FSDP2) and what this machine
decides (ranks, seed, an optional smaller batch)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import Manifest
from ito_assets.runtime.stage import curriculum as stages
from ito_assets.runtime.stage.config import DataParallel, WorkerConfig
from ito_assets.training.hardware import gpu_spec, network_spec
from ito_assets.training.layout import Layout
from ito_assets.training.planner import Hardware
from ito_assets.training.run_plan import plan_run

ROOT = Path(__file__).resolve().parents[2]


def _plan(gpus_per_node: int):
    manifest = Manifest.model_validate_json((ROOT / "data/fixtures/manifests/fixture-small.json").read_bytes())
    hardware = Hardware(gpu=gpu_spec("H100-SXM"), network=network_spec("infiniband"), num_nodes=1,
                        gpus_per_node=gpus_per_node, price_cents_per_gpu_hour=250)
    return manifest, plan_run(manifest, hardware)


def test_the_stage_takes_the_plans_batch_and_strategy():
    manifest, run_plan = _plan(8)
    plan = stages.stage_plan(run_plan, "pretraining")
    sizing = stages.sizing_from_plan(plan, vocab_size=2048, world_size=2, seed=1)
    assert (sizing.model, sizing.batch_size, sizing.data_parallel) == ("tiny", plan.request.global_batch_sequences,
                                                                       DataParallel.FSDP2)
    assert plan.layout.dp_shard == 8
    # At the plan's batch the stage trains exactly the plan's number of steps.
    assert stages.num_steps(manifest.training_target.stages[0], sizing.batch_size) == plan.num_steps


def test_a_layout_that_only_replicates_trains_under_ddp():
    assert stages.data_parallel_for(Layout(dp_replicate=8)) is DataParallel.DDP
    assert stages.data_parallel_for(Layout()) is DataParallel.DDP
    assert stages.data_parallel_for(Layout(dp_replicate=2, dp_shard=4)) is DataParallel.FSDP2


def test_a_plan_this_runtime_cannot_train_is_refused():
    with pytest.raises(ItoError) as caught:
        stages.data_parallel_for(Layout(dp_shard=4, tp=2))
    assert caught.value.code is ErrorCode.CAPABILITY_MISSING
    _, run_plan = _plan(1)
    with pytest.raises(ItoError) as missing:
        stages.stage_plan(replace(run_plan, stages=run_plan.stages[:1]), "long_context")
    assert missing.value.code is ErrorCode.PLAN_REFUSED


def test_the_runtime_may_override_the_batch_but_not_split_it_unevenly():
    _, run_plan = _plan(8)
    plan = stages.stage_plan(run_plan, "pretraining")
    assert stages.sizing_from_plan(plan, vocab_size=2048, world_size=2, seed=0, batch_size=8).batch_size == 8
    with pytest.raises(ValueError, match="divisible by world_size"):
        stages.sizing_from_plan(plan, vocab_size=2048, world_size=2, seed=0, batch_size=7)


def test_the_worker_config_carries_strategy_and_battery(tmp_path):
    manifest, run_plan = _plan(8)
    sizing = stages.sizing_from_plan(stages.stage_plan(run_plan, "pretraining"), vocab_size=2048, world_size=2, seed=0)
    config = stages.worker_config(
        run_key="run-1", stage=manifest.training_target.stages[0], policy=manifest.checkpoint_policy,
        layout=stages.RunLayout.for_run(tmp_path, "run-1"), sizing=sizing, tokens_path=tmp_path / "train.npy",
        heldout_path=tmp_path / "heldout.npy", init_from=None, tokenizer_path=str(tmp_path / "tokenizer.json"),
        eval_suite_path=str(tmp_path / "suite.jsonl"), eval_suite_sha256="sha256:" + "0" * 64)
    again = WorkerConfig.from_json(config.to_json())
    assert again == config and again.data_parallel is DataParallel.FSDP2
    assert json.loads(config.to_json())["data_parallel"] == "fsdp2"
    with pytest.raises(ValueError, match="set together"):
        replace(config, eval_suite_sha256=None)
    with pytest.raises(ValueError):
        replace(config, data_parallel="zero3")


def test_the_launcher_takes_the_plans_node_and_gpu_counts_unless_set():
    from ito_assets.defs.training.launcher import TrainingLauncherResource

    hardware = Hardware(gpu=gpu_spec("H100-SXM"), network=network_spec("infiniband"), num_nodes=4,
                        gpus_per_node=8, price_cents_per_gpu_hour=250)
    assert TrainingLauncherResource().counts(hardware, has_cuda=True) == (4, 8)
    assert TrainingLauncherResource().counts(hardware, has_cuda=False) == (4, 1)  # one CPU rank per node
    assert TrainingLauncherResource(nnodes=2, nproc_per_node=1).counts(hardware, has_cuda=True) == (2, 1)
