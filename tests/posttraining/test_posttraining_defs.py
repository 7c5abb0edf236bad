"""The post-training domain in Dagster: the graph, the blocking gates, a failed gate that stops
the chain (and keeps stopping it), and a whole chain with its metrics as metadata."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import dagster as dg
import pytest

from definitions import build_definitions
from ito_assets.defs import posttraining
from ito_assets.defs.posttraining.resources import PostTrainingResource
from ito_assets.defs.workload.assets import RUN_ID_TAG
from ito_assets.posttraining.fixtures import instruction_pairs, preference_pairs, write_jsonl
from ito_assets.posttraining.pipeline import DPO_FILE, SFT_FILE, PostTrainingRuntime, battery

warnings.filterwarnings("ignore", category=dg.PreviewWarning)

STAGES = ("sft_checkpoint", "dpo_checkpoint", "rlvr_checkpoint")
# Small enough for seconds on CPU; the SFT rate is one the `micro` model learns the format at.
SMALL = PostTrainingResource(num_eval_prompts=12, batch_size=16, rlvr_num_steps=4, rlvr_groups_per_step=2)


def _defs(installation, runtime: PostTrainingResource = SMALL) -> dg.Definitions:
    lineage = ("manifest", "data", "decision", "workload", "training")  # post-training's own resource below
    return dg.Definitions.merge(build_definitions(installation.settings, domains=lineage), posttraining.defs(runtime))


def _write_fixtures(installation, num_prompts: int) -> None:
    train, _ = battery(PostTrainingRuntime())
    folder = installation.data_root / "fixtures" / "posttraining"
    write_jsonl(folder / SFT_FILE, instruction_pairs(train[:num_prompts], copies=1, seed=0, error_rate=0.2))
    write_jsonl(folder / DPO_FILE, preference_pairs(train[:64], copies=1, seed=0))


def _ledger_run(installation, manifest_path: str) -> str:
    """A run created through the gates for this very manifest: post-training asks the ledger."""
    from gates.gate_world import Clock, make_policy, make_world, verified
    from ito_assets.gates.create_run import TrainRequest, create_run
    from ito_assets.gates.ledger import open_ledger

    now = int(time.time())
    installation.settings.state_dir.mkdir(parents=True, exist_ok=True)
    ledger = open_ledger(installation.settings.ledger_url, clock=Clock(now))
    world = make_world(ledger, make_policy(installation.root), Clock(now))
    booking = world.booking(starts_at=now - 3600, ends_at=now + 3600)
    manifest = verified(Path(manifest_path).read_bytes())
    request = TrainRequest(booking_id=booking, verified=manifest, idempotency_key="posttraining-0001",
                           confirmation_ref=world.confirm_train(booking, manifest=manifest))
    run_id = create_run(ledger, world.policy, world.account, request).run.run_id
    ledger.dispose()
    return run_id


def _materialize(installation, instance, defs, recipe: list[dict], selection, *, num_prompts: int = 800):
    _write_fixtures(installation, num_prompts)
    run_id = _ledger_run(installation, installation.manifest("post", post_training=recipe))
    key = _register(installation, instance)
    job = dg.define_asset_job("adhoc", selection=selection).resolve(asset_graph=defs.resolve_asset_graph())
    return job.execute_in_process(instance=instance, partition_key=key, raise_on_error=False,
                                  resources=defs.resources, tags={RUN_ID_TAG: run_id})


def _register(installation, instance) -> str:
    from ito_assets.manifest.discovery import discover

    (found,), _ = discover(installation.manifests_dir, max_bytes=installation.settings.max_manifest_bytes)
    instance.add_dynamic_partitions("manifests", [found.key])
    return found.key


def test_graph_chain_in_recipe_order(installation):
    graph = _defs(installation).resolve_asset_graph()
    for name in STAGES:
        assert graph.get(dg.AssetKey(name)).group_name == "posttraining"
    assert dg.AssetKey("sft_checkpoint") in graph.get(dg.AssetKey("dpo_checkpoint")).parent_keys
    assert dg.AssetKey("dpo_checkpoint") in graph.get(dg.AssetKey("rlvr_checkpoint")).parent_keys
    checks = {k.name: graph.get_check_spec(k) for k in graph.asset_check_keys if k.asset_key.path[0] in STAGES}
    assert set(checks) == {"sft_eval_gate", "dpo_eval_gate", "rlvr_eval_gate"}
    assert all(spec.blocking for spec in checks.values())


def _evaluations(result) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def _materialized(result) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


@pytest.mark.slow
def test_failed_gate_stops_the_chain_and_keeps_stopping_it(installation, instance):
    defs = _defs(installation)
    # A learning rate too small to teach anything in one epoch: SFT cannot raise the reward.
    recipe = [{"kind": "sft", "learning_rate": 1e-9}, {"kind": "dpo"}, {"kind": "rlvr"}]
    everything = dg.AssetSelection.groups("manifest", "workload", "posttraining")
    result = _materialize(installation, instance, defs, recipe, everything, num_prompts=64)
    assert _evaluations(result)["sft_eval_gate"] is False
    assert "sft_checkpoint" in _materialized(result)
    assert not {"dpo_checkpoint", "rlvr_checkpoint"} & _materialized(result)
    # Retrying the next stage alone: refused where the side effect would happen.
    job = dg.define_asset_job("retry", selection=["dpo_checkpoint"]).resolve(asset_graph=defs.resolve_asset_graph())
    key = instance.get_dynamic_partitions("manifests")[0]
    retry = job.execute_in_process(instance=instance, partition_key=key, raise_on_error=False, resources=defs.resources)
    assert not retry.success
    failure = next(e for e in retry.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_failure_data.user_failure_data.metadata["error_code"].value == "EVAL_GATE_FAILED"


@pytest.mark.slow
def test_chain_materializes_with_metrics(installation, instance):
    defs = _defs(installation)
    recipe = [{"kind": "sft", "learning_rate": 3e-3}, {"kind": "dpo", "learning_rate": 1e-4},
              {"kind": "rlvr", "learning_rate": 1e-3, "group_size": 4, "max_staleness": 1}]
    result = _materialize(installation, instance, defs, recipe, dg.AssetSelection.groups("manifest", "workload", "posttraining"))
    assert _evaluations(result)["sft_eval_gate"] is True
    assert _evaluations(result)["dpo_eval_gate"] is True
    assert set(STAGES) <= _materialized(result)
    (rlvr,) = [e for e in result.get_asset_materialization_events() if e.asset_key.path == ["rlvr_checkpoint"]]
    metadata = rlvr.step_materialization_data.materialization.metadata
    assert {"reward_curve", "staleness_histogram", "kl_to_reference", "gate"} <= set(metadata)
    assert max(int(k) for k in metadata["staleness_histogram"].value["admitted_by_staleness"]) <= 1
    assert "rlvr_eval_gate" in _evaluations(result)


@pytest.mark.slow
def test_a_stage_left_out_of_the_recipe_carries_forward(installation, instance):
    defs = _defs(installation)
    recipe = [{"kind": "dpo", "learning_rate": 1e-6}]  # no SFT, no RLVR
    result = _materialize(installation, instance, defs, recipe, dg.AssetSelection.groups("manifest", "workload", "posttraining"),
                          num_prompts=64)
    evaluations = _evaluations(result)
    assert evaluations["sft_eval_gate"] is True and evaluations["rlvr_eval_gate"] is True  # "no such step"
    assert evaluations["dpo_eval_gate"] is True  # a tiny DPO step does not regress
    events = {e.asset_key.path[0]: e.step_materialization_data.materialization.metadata
              for e in result.get_asset_materialization_events() if e.asset_key.path[0] in STAGES}
    assert events["sft_checkpoint"]["in_recipe"].value is False
    assert events["dpo_checkpoint"]["in_recipe"].value is True
    assert events["rlvr_checkpoint"]["in_recipe"].value is False


def test_a_stage_materialized_alone_asks_the_ledger_and_is_refused(installation, instance):
    defs = _defs(installation)
    recipe = [{"kind": "sft", "learning_rate": 3e-3}]
    first = _materialize(installation, instance, defs, recipe, dg.AssetSelection.groups("manifest", "workload"),
                         num_prompts=16)
    assert first.success  # the authorization is on record, for that run
    job = dg.define_asset_job("alone", selection=["sft_checkpoint"]).resolve(asset_graph=defs.resolve_asset_graph())
    key = instance.get_dynamic_partitions("manifests")[0]
    alone = job.execute_in_process(instance=instance, partition_key=key, raise_on_error=False, resources=defs.resources)
    assert not alone.success and "sft_checkpoint" not in _materialized(alone)
    failure = next(e for e in alone.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_failure_data.user_failure_data.metadata["error_code"].value == "CONFIRMATION_INVALID"
