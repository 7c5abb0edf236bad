"""What the plan decides for a stage (model, global batch, its layout) and what this machine
decides (ranks, seed, an optional smaller batch), with every change to the plan's layout named."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import Manifest
from ito_assets.runtime.stage import curriculum as stages
from ito_assets.runtime.stage.config import WorkerConfig
from ito_assets.runtime.stage.fitting import fit_layout, per_group
from ito_assets.training.hardware import gpu_spec, network_spec
from ito_assets.training.layout import Layout, Precision
from ito_assets.training.planner import Hardware
from ito_assets.training.run_plan import plan_run

ROOT = Path(__file__).resolve().parents[2]


def _plan(gpus_per_node: int):
    manifest = Manifest.model_validate_json((ROOT / "data/fixtures/manifests/fixture-small.json").read_bytes())
    hardware = Hardware(gpu=gpu_spec("H100-SXM"), network=network_spec("infiniband"), num_nodes=1,
                        gpus_per_node=gpus_per_node, price_cents_per_gpu_hour=250)
    return manifest, plan_run(manifest, hardware, pair_shapes=None)


def test_the_stage_takes_the_plans_batch_and_layout():
    manifest, run_plan = _plan(8)
    plan = stages.stage_plan(run_plan, "pretraining")
    assert plan.layout.dp_shard == 8
    on_the_booking = stages.sizing_from_plan(plan, vocab_size=2048, world_size=8, seed=1)
    assert on_the_booking.layout == plan.layout and on_the_booking.layout_fallbacks == ()
    sizing = stages.sizing_from_plan(plan, vocab_size=2048, world_size=2, seed=1)
    assert (sizing.model, sizing.batch_size) == ("tiny", plan.request.global_batch_sequences)
    assert (sizing.layout.dp_shard, sizing.layout.precision, sizing.layout.compile) == (2, plan.layout.precision, True)
    assert [f.field for f in sizing.layout_fallbacks] == ["dp_shard"]
    # At the plan's batch the stage trains exactly the plan's number of steps.
    assert stages.num_steps(manifest.training_target.stages[0], sizing.batch_size) == plan.num_steps


@pytest.mark.parametrize("planned,world,groups,fitted", [
    (Layout(dp_replicate=8), 2, 1, Layout(dp_replicate=2)),  # replication stays DDP
    (Layout(dp_shard=8), 1, 1, Layout()),  # one rank
    (Layout(dp_replicate=2, dp_shard=4), 8, 1, Layout(dp_replicate=2, dp_shard=4)),  # HSDP on the booking
    (Layout(dp_replicate=2, dp_shard=4), 4, 1, Layout(dp_replicate=2, dp_shard=2)),  # shards of 2 still
    (Layout(dp_replicate=2, dp_shard=4), 2, 1, Layout(dp_shard=2)),  # shards of 1 would not shard
    (Layout(dp_replicate=2, dp_shard=4), 8, 2, Layout(dp_replicate=2, dp_shard=4)),  # torchft groups replicate
    (Layout(tp=2, dp_shard=4), 2, 1, Layout(tp=2)),  # tp divides the ranks: kept
    (Layout(tp=4, dp_shard=2), 2, 1, Layout(dp_shard=2)),  # tp does not: dropped, with its reason
])
def test_the_layout_is_fitted_to_the_ranks_that_exist(planned, world, groups, fitted):
    got, fallbacks = fit_layout(planned, world_size=world, replica_groups=groups, batch_size=64)
    assert got == fitted and got.world_size == world
    assert {f.field for f in fallbacks} == {n for n in ("tp", "dp_replicate", "dp_shard")
                                            if getattr(planned, n) != getattr(fitted, n)}
    assert all(f"{world} rank(s) here" in f.reason for f in fallbacks)
    assert per_group(got, groups).world_size == world // groups


@pytest.mark.parametrize("micro,per_rank,ran", [(4, 8, 4), (4, 4, 4), (4, 2, 2), (8, 12, 4), (1, 5, 1)])
def test_the_micro_batch_divides_each_ranks_rows(micro, per_rank, ran):
    layout, fallbacks = fit_layout(Layout(dp_shard=2, micro_batch_size=micro), world_size=2, replica_groups=1,
                                   batch_size=2 * per_rank)
    assert layout.micro_batch_size == ran
    assert [f.to_dict() for f in fallbacks] == ([] if ran == micro else [
        {"field": "micro_batch_size", "planned": micro, "ran": ran,
         "reason": f"each rank's share of the batch is {per_rank} sequence(s)"}])


def test_compile_off_on_this_host_is_a_named_fallback():
    reason = "turned off in the training runtime resource"
    layout, fallbacks = fit_layout(Layout(), world_size=1, replica_groups=1, batch_size=8, eager_reason=reason)
    assert not layout.compile
    assert [f.to_dict() for f in fallbacks] == [{"field": "compile", "planned": True, "ran": False,
                                                "reason": "turned off in the training runtime resource"}]


@pytest.mark.parametrize("planned", list(Precision))
def test_fp32_on_this_host_replaces_only_a_bf16_plan_and_names_why(planned):
    reason = "a CPU without native bf16"
    layout, fallbacks = fit_layout(Layout(precision=planned, compile=False), world_size=1, replica_groups=1,
                                   batch_size=8, fp32_reason=reason)
    if planned is Precision.BF16:
        assert layout.precision is Precision.FP32
        assert [f.to_dict() for f in fallbacks] == [{"field": "precision", "planned": "bf16", "ran": "fp32",
                                                    "reason": reason}]
    else:  # fp8 is the worker's to fall back from (to bf16, on a device it knows); fp32 stays
        assert layout.precision is planned and fallbacks == ()
    unchanged, none = fit_layout(Layout(precision=planned), world_size=1, replica_groups=1, batch_size=8)
    assert unchanged.precision is planned and none == ()


@pytest.mark.parametrize("has_cuda,cpu_bf16,native,trains_fp32", [
    (True, None, False, False), (True, False, False, False),  # a GPU host: the worker decides for its GPU
    (False, None, False, True), (False, None, True, False),  # a CPU host: by what it has natively
    (False, True, False, False), (False, False, True, True),  # the resource's word over the probe
])
def test_the_runtime_resource_says_when_a_cpu_host_trains_fp32(has_cuda, cpu_bf16, native, trains_fp32):
    from ito_assets.defs.training.resources import TrainingRuntimeResource

    reason = TrainingRuntimeResource(cpu_bf16=cpu_bf16).fp32_reason(has_cuda=has_cuda, native_cpu_bf16=native)
    assert (reason is not None) is trains_fp32
    if trains_fp32:
        assert "cpu_bf16" in reason


def test_a_plan_this_runtime_cannot_train_is_refused():
    for planned in (Layout(pp=2), Layout(cp=2)):
        with pytest.raises(ItoError) as caught:
            fit_layout(planned, world_size=2, replica_groups=1, batch_size=8)
        assert caught.value.code is ErrorCode.CAPABILITY_MISSING
    _, run_plan = _plan(1)
    with pytest.raises(ItoError) as missing:
        stages.stage_plan(replace(run_plan, stages=run_plan.stages[:1]), "long_context")
    assert missing.value.code is ErrorCode.PLAN_REFUSED


@pytest.mark.parametrize("sequence_length", [511, 512, 513, 1024])
def test_a_stage_longer_than_the_models_window_is_planned_and_trained_at_its_length(tmp_path, sequence_length):
    """tiny's window is 512 positions; a long-context stage past it is planned at its own length,
    and the worker's model (micro here, 256, built in milliseconds) gets rotary tables for the
    stage's length and takes the shorter stage's weights: the tables are not weights."""
    import torch

    from ito_assets.training.model import build_model
    from ito_assets.training.model_config import config_by_name
    from runtime_helpers import worker_config

    document = json.loads((ROOT / "data/fixtures/manifests/fixture-small.json").read_text())
    document["training_target"]["stages"][-1]["sequence_length"] = sequence_length
    manifest = Manifest.model_validate_json(json.dumps(document))
    hardware = Hardware(gpu=gpu_spec("H100-SXM"), network=network_spec("infiniband"), num_nodes=1, gpus_per_node=8,
                        price_cents_per_gpu_hour=250)
    assert stages.stage_plan(plan_run(manifest, hardware, pair_shapes=None), "long_context").request.sequence_length == sequence_length

    base = config_by_name("micro")
    length = base.max_seq_len - 512 + sequence_length  # micro's window, less, at or past it as tiny's above
    config = worker_config(tmp_path, (tmp_path / "t.npy", tmp_path / "h.npy"), sequence_length=length)
    assert config.model_config().max_seq_len == max(base.max_seq_len, length)
    model = build_model(config.model_config(), seed=0)
    model.load_state_dict(build_model(base, seed=1).state_dict())  # the stage before's weights
    tokens = torch.zeros((1, length + 1), dtype=torch.long)
    assert torch.isfinite(model.loss(tokens[:, :-1], tokens[:, 1:]))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros((1, model.config.max_seq_len + 1), dtype=torch.long))


def test_the_runtime_may_override_the_batch_but_not_split_it_unevenly():
    _, run_plan = _plan(8)
    plan = stages.stage_plan(run_plan, "pretraining")
    assert stages.sizing_from_plan(plan, vocab_size=2048, world_size=2, seed=0, batch_size=8).batch_size == 8
    with pytest.raises(ValueError, match="does not split over 2 data-parallel ranks"):
        stages.sizing_from_plan(plan, vocab_size=2048, world_size=2, seed=0, batch_size=7)


def test_the_worker_config_carries_layout_and_battery(tmp_path):
    manifest, run_plan = _plan(8)
    sizing = stages.sizing_from_plan(stages.stage_plan(run_plan, "pretraining"), vocab_size=2048, world_size=2, seed=0)
    config = stages.worker_config(
        run_key="run-1", stage=manifest.training_target.stages[0], policy=manifest.checkpoint_policy,
        layout=stages.RunLayout.for_run(tmp_path, "run-1"), sizing=sizing, tokens_path=tmp_path / "train.npy",
        heldout_path=tmp_path / "heldout.npy", init_from=None, tokenizer_path=str(tmp_path / "tokenizer.json"),
        eval_suite_path=str(tmp_path / "suite.jsonl"), eval_suite_sha256="sha256:" + "0" * 64)
    again = WorkerConfig.from_json(config.to_json())
    assert again == config and again.layout == sizing.layout and again.layout_fallbacks == sizing.layout_fallbacks
    body = json.loads(config.to_json())
    assert body["layout"]["dp_shard"] == 2 and body["layout_fallbacks"][0]["field"] == "dp_shard"
    with pytest.raises(ValueError, match="set together"):
        replace(config, eval_suite_sha256=None)
    with pytest.raises(ValueError):
        WorkerConfig.from_json(config.to_json().replace('"precision": "bf16"', '"precision": "fp16"'))


def test_the_launcher_takes_the_plans_node_and_gpu_counts_unless_set():
    from ito_assets.defs.training.launcher import TrainingLauncherResource

    hardware = Hardware(gpu=gpu_spec("H100-SXM"), network=network_spec("infiniband"), num_nodes=4,
                        gpus_per_node=8, price_cents_per_gpu_hour=250)
    assert TrainingLauncherResource().counts(hardware, has_cuda=True) == (4, 8)
    assert TrainingLauncherResource().counts(hardware, has_cuda=False) == (4, 1)  # one CPU rank per node
    assert TrainingLauncherResource(nnodes=2, nproc_per_node=1).counts(hardware, has_cuda=True) == (2, 1)
