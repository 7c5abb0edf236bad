"""The post-training domain in Dagster: the graph (the first stage starts from the pretraining
chain's checkpoint and tokenizer), the blocking gates, a failed gate that stops the chain (and
keeps stopping it), pair files bound by digest, and a whole chain with its metrics as metadata
and in the ledger (what `ito metrics` serves).

The pretraining chain is stood in for by assets with its keys (`long_context_checkpoint`,
`training_tokens`) that hand on a real DCP checkpoint and BPE tokenizer, written the runtime's
way (pretrained_checkpoint.py): the training domain's own tests run the supervisor."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import dagster as dg
import pytest

from definitions import build_definitions
from ito_assets.digests import file_sha256
from ito_assets.defs import posttraining, telemetry, training
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.posttraining.resources import PostTrainingResource
from ito_assets.defs.training.launcher import TrainingLauncherResource
from ito_assets.defs.training.resources import TrainingRuntimeResource
from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.record import events
from ito_assets.runtime.record.events import EventKind
from ito_assets.runtime.record.storage import RunLayout
from ito_assets.runtime.stage.run import StageCheckpoint
from ito_assets.control.run_tags import RUN_ID as RUN_ID_TAG
from ito_assets.control import history
from ito_assets.control import telemetry as ledger_telemetry
from ito_assets.control.ledger import open_ledger
from ito_assets.posttraining.fixtures import instruction_pairs, preference_pairs, write_jsonl
from ito_assets.defs.posttraining import checks
from ito_assets.manifest.schema import PostTrainingEval, RlvrStep
from ito_assets.posttraining.base import seeded
from ito_assets.posttraining.checkpoint import CheckpointRecord
from ito_assets.posttraining.eval_gate import BATTERY, judge_rewards
from ito_assets.posttraining.evaluation import RewardEval
from ito_assets.posttraining.pipeline import DPO_FILE, SFT_FILE, battery
from ito_assets.posttraining.plan import evaluation_seconds
from ito_assets.posttraining.stage import StageOutcome
from ito_assets.training.model_config import config_by_name
from posttraining.pretrained_checkpoint import Pretrained, make_pretrained

# Pipes' writer count (the stages' worker) is a preview API in this Dagster; pytest resets the filters per test.
pytestmark = pytest.mark.filterwarnings("ignore::dagster.PreviewWarning")

STAGES = ("sft_checkpoint", "dpo_checkpoint", "rlvr_checkpoint")
# The manifest's eval battery (`post_training_eval.num_prompts`): small enough for seconds on CPU;
# the SFT rate is one the tiny model learns the format at.
SMALL = 12
# The recipe's sizes, added to every step these tests write unless it sets its own.
SIZES = {"sft": {"batch_size": 16}, "dpo": {"batch_size": 16}, "rlvr": {"num_steps": 4, "groups_per_step": 2}}
# The chain that must pass its gates is judged on 48 held-out prompts, not 12: after SFT (3e-3, one
# epoch, from `base`) the avg@8 reward is only ~0.06-0.17, and on 12 prompts the SFT gate's margin
# (delta - 1.96 SE) measured -0.008 to +0.027 (pass or fail on how pretraining's floats were
# summed); on 48, +0.089 to +0.107 (pretraining seeds 0-1, one or two threads), SE ~0.022 instead
# of ~0.035-0.046. The other tests' gates do not depend on a margin (nothing learned: delta 0).
CHAIN = 48
_PAIR_FILES = {"sft": SFT_FILE, "dpo": DPO_FILE}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Pretrained:
    """One pretraining result for the module: the tokenizer takes a second, 30 steps of the tiny
    model a few more (measured: enough for SFT to teach the answer format; 60 or 100 steps did not
    raise the reward after SFT, ~0.08-0.10 on the first 12 held-out prompts). Pretrained on one
    thread (make_pretrained), so the weights do not depend on what earlier tests left."""
    return make_pretrained(tmp_path_factory.mktemp("pretrained"), num_steps=30)


def _pretraining_stand_ins(base: Pretrained) -> list:
    @dg.asset(name="training_tokens", group_name="training", partitions_def=manifests_partitions)
    def tokens_stand_in():
        return base.tokens

    @dg.asset(name="long_context_checkpoint", group_name="training", partitions_def=manifests_partitions,
              ins={"run_authorization": dg.AssetIn("run_authorization")})
    def final_stand_in(run_authorization: dict):
        # In the run's own folder, where the chain's last stage leaves it (SFT refuses one elsewhere).
        layout = RunLayout.for_run(Path(run_authorization["checkpoint_dir"]), run_authorization["run_id"])
        checkpoint = layout.stage_dir("long_context") / Path(base.checkpoint).name
        if not checkpoint.exists():
            shutil.copytree(base.checkpoint, checkpoint)
        return StageCheckpoint(stage="long_context", run_dir=str(layout.run_dir), stage_dir=str(checkpoint.parent),
                               final_checkpoint=str(checkpoint), num_steps=30,
                               metadata_sha256=markers.read_marker(checkpoint).metadata_sha256, eval={},
                               gate={"passed": True}, num_attempts=1)

    def untrained(stage: str):  # the manifest's other stages, as telemetry reads them when absent
        @dg.asset(name=f"{stage}_checkpoint", group_name="training", partitions_def=manifests_partitions)
        def _absent():
            return None
        return _absent

    return [tokens_stand_in, final_stand_in, untrained("pretraining"), untrained("mid_training")]


def _defs(installation, base: Pretrained, runtime: PostTrainingResource = PostTrainingResource()) -> dg.Definitions:
    lineage = ("manifest", "data", "decision", "workload")  # training stood in, post-training's resource below
    # The stages' worker is launched as the training stages' are: their runtime, launcher and Pipes client.
    worker = {"training_runtime": TrainingRuntimeResource(poll_interval_s=0.2), "training_launcher": TrainingLauncherResource(),
              "pipes_subprocess_client": training.pipes_client()}
    return dg.Definitions.merge(build_definitions(installation.settings, domains=lineage), posttraining.defs(runtime),
                                telemetry.defs(), dg.Definitions(assets=_pretraining_stand_ins(base), resources=worker))


def _write_fixtures(installation, num_prompts: int) -> dict[str, dict]:
    """The pair files, and their data references as a recipe step binds them."""
    train, _ = battery()
    folder = installation.data_root / "fixtures" / "posttraining"
    write_jsonl(folder / SFT_FILE, instruction_pairs(train[:num_prompts], copies=1, seed=0, error_rate=0.2))
    write_jsonl(folder / DPO_FILE, preference_pairs(train[:64], copies=1, seed=0))
    return {kind: {"uri": f"dataroot://fixtures/posttraining/{name}", "format": "jsonl", "license": "CC0-1.0",
                   "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest()}
            for kind, name in _PAIR_FILES.items()}


def _bind(recipe: list[dict], references: dict[str, dict]) -> list[dict]:
    return [{**step, "data": references[step["kind"]]} if step["kind"] in references and "data" not in step else step
            for step in recipe]


def _sized(recipe: list[dict]) -> list[dict]:
    return [{**SIZES[step["kind"]], **step} for step in recipe]


def _ledger_run(installation, manifest_path: str) -> str:
    """A run created through the gates for this very manifest: post-training asks the ledger."""
    from control.gate_world import Clock, make_policy, make_world, verified
    from ito_assets.control.create_run import TrainRequest, create_run
    from ito_assets.control.ledger import open_ledger

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


def _materialize(installation, instance, defs, recipe: list[dict], selection, *, num_prompts: int = 800,
                 bind: bool = True, num_eval_prompts: int = SMALL):
    references = _write_fixtures(installation, num_prompts)
    recipe = _sized(_bind(recipe, references) if bind else recipe)
    run_id = _ledger_run(installation, installation.manifest("post", post_training=recipe,
                                                             post_training_eval={"num_prompts": num_eval_prompts}))
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
    graph = build_definitions(installation.settings).resolve_asset_graph()  # the real training domain
    for name in STAGES:
        assert graph.get(dg.AssetKey(name)).group_name == "posttraining"
    assert dg.AssetKey("sft_checkpoint") in graph.get(dg.AssetKey("dpo_checkpoint")).parent_keys
    assert dg.AssetKey("dpo_checkpoint") in graph.get(dg.AssetKey("rlvr_checkpoint")).parent_keys
    # The first stage starts from the pretraining chain's result: its checkpoint and its tokenizer.
    sft_parents = graph.get(dg.AssetKey("sft_checkpoint")).parent_keys
    assert {dg.AssetKey("long_context_checkpoint"), dg.AssetKey("training_tokens")} <= sft_parents
    checks = {k.name: graph.get_check_spec(k) for k in graph.asset_check_keys if k.asset_key.path[0] in STAGES}
    gates = {"sft_eval_gate", "dpo_eval_gate", "rlvr_eval_gate"}
    warnings = {"sft_evaluation_calibration", "dpo_evaluation_calibration", "rlvr_evaluation_calibration",
                "rlvr_generation_calibration"}
    assert set(checks) == gates | warnings
    assert all(checks[name].blocking for name in gates) and not any(checks[name].blocking for name in warnings)


def _evaluations(result) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def _materialized(result) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


@pytest.mark.slow
def test_failed_gate_stops_the_chain_and_keeps_stopping_it(installation, instance, base):
    defs = _defs(installation, base)
    # A learning rate too small to teach anything in one epoch: SFT cannot raise the reward.
    recipe = [{"kind": "sft", "learning_rate": 1e-9}, {"kind": "dpo"}, {"kind": "rlvr"}]
    everything = dg.AssetSelection.groups("manifest", "workload", "training", "posttraining")
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
def test_chain_materializes_with_metrics(installation, instance, base):
    defs = _defs(installation, base)
    recipe = [{"kind": "sft", "learning_rate": 3e-3}, {"kind": "dpo", "learning_rate": 1e-4},
              {"kind": "rlvr", "learning_rate": 1e-3, "group_size": 4, "max_staleness": 1}]
    groups = ("manifest", "workload", "training", "posttraining", "telemetry")
    result = _materialize(installation, instance, defs, recipe, dg.AssetSelection.groups(*groups),
                          num_eval_prompts=CHAIN)
    assert _evaluations(result)["sft_eval_gate"] is True
    assert _evaluations(result)["dpo_eval_gate"] is True
    assert set(STAGES) <= _materialized(result)
    for name in STAGES:  # the manifest's battery, as confirmed: its post_training_eval, not a resource's
        outcome = result.output_for_node(name)
        assert outcome.eval_before.num_tasks == outcome.eval_after.num_tasks == CHAIN, name
    (rlvr,) = [e for e in result.get_asset_materialization_events() if e.asset_key.path == ["rlvr_checkpoint"]]
    metadata = rlvr.step_materialization_data.materialization.metadata
    assert {"curves_chart", "final_reward", "staleness_histogram", "kl_to_reference", "gate"} <= set(metadata)
    used = [r.data for r in metadata["staleness_histogram"].value.records if r.data["groups used"]]
    assert used and max(r["staleness (versions)"] for r in used) <= 1
    gate = metadata["gate"].value.records[0].data
    assert gate["rule"] in ("improvement", "no_regression") and isinstance(gate["passed"], bool)
    assert "rlvr_eval_gate" in _evaluations(result)
    # Each stage's evaluations timed against the plan's price for them, the manifest's model's: the
    # first stage's evaluated before its training too (the verdicts: test_the_evaluation_warning_*).
    for name in STAGES:
        figures = result.output_for_node(name).metrics["evaluation_calibration"]
        assert figures["measured_cpu_s"] > 0 and figures["measured_wall_s"] > 0
        assert figures["ratio"] == pytest.approx(figures["measured_cpu_s"] / figures["planned_s"], rel=1e-2)
        planned = evaluation_seconds(config_by_name(result.output_for_node(name).policy.model_name),
                                     PostTrainingEval(num_prompts=CHAIN), first=name == "sft_checkpoint")
        assert figures["planned_s"] == round(planned, 3), name
        verdict = _evaluations(result)[f"{name.removesuffix('_checkpoint')}_evaluation_calibration"]
        assert verdict is (not figures["underpriced"])
    assert metadata["evaluation_planned_s"].value == result.output_for_node("rlvr_checkpoint").metrics[
        "evaluation_calibration"]["planned_s"]
    # RLVR's groups, drawn on the worker, against the priced ones: every group drawn passed the
    # staleness filter once (the in-process count: test_recipe_sizes.py).
    figures = result.output_for_node("rlvr_checkpoint").metrics["generation_calibration"]
    staleness = result.output_for_node("rlvr_checkpoint").metrics["staleness"]
    step = RlvrStep.model_validate(_sized([recipe[2]])[0])  # the draw bound: 10 a group, the default
    assert figures["planned_groups"] == step.num_steps * step.groups_per_step * 10
    assert 0 < figures["drawn_groups"] == staleness["num_admitted"] + staleness["num_dropped_stale"] <= figures["planned_groups"]
    assert metadata["groups_drawn"].value == figures["drawn_groups"] and metadata["groups_planned"].value == figures["planned_groups"]
    assert _evaluations(result)["rlvr_generation_calibration"] is (not figures["overdrawn"])


def test_the_evaluation_warning_flags_only_an_underpriced_stage_of_its_own_kind():
    figures = {"planned_s": 2.0, "measured_cpu_s": 2.6, "measured_wall_s": 3.1, "ratio": 1.3, "underpriced": True}
    reward = RewardEval(mean_reward=0.5, per_task=(0.5, 0.5), per_task_variance=(0.3, 0.3), greedy_accuracy=0.5,
                        num_tasks=2, num_samples=8)

    def outcome(metrics: dict) -> StageOutcome:
        return StageOutcome(stage="dpo", policy=seeded(), eval_before=reward, eval_after=reward, metrics=metrics,
                            checkpoint=CheckpointRecord(stage="dpo", path="/x/dpo/policy.pt", sha256="0" * 64,
                                                        num_bytes=1, policy_version=1),
                            gate=judge_rewards("dpo", reward, reward, BATTERY["dpo"]))

    flagged = checks.evaluation_calibration_result("dpo", outcome({"evaluation_calibration": figures}))
    assert not flagged.passed and flagged.severity is dg.AssetCheckSeverity.WARN
    assert "2.6 CPU seconds of evaluation against 2 s planned (ratio 1.3; 3.1 s of wall time)" in flagged.description
    within = {**figures, "ratio": 0.4, "underpriced": False}
    assert checks.evaluation_calibration_result("dpo", outcome({"evaluation_calibration": within})).passed
    # Another stage's outcome (the recipe has no such step), or one stored before its evaluations were timed.
    assert checks.evaluation_calibration_result("sft", outcome({"evaluation_calibration": figures})).passed
    assert checks.evaluation_calibration_result("dpo", outcome({"kl_to_reference": 0.1})).passed


def test_the_generation_warning_flags_only_an_overdrawn_rlvr_stage():
    figures = {"planned_groups": 320, "drawn_groups": 321, "ratio": 1.0031, "overdrawn": True}
    reward = RewardEval(mean_reward=0.5, per_task=(0.5, 0.5), per_task_variance=(0.3, 0.3), greedy_accuracy=0.5,
                        num_tasks=2, num_samples=8)

    def outcome(stage: str, metrics: dict) -> StageOutcome:
        return StageOutcome(stage=stage, policy=seeded(), eval_before=reward, eval_after=reward, metrics=metrics,
                            checkpoint=CheckpointRecord(stage=stage, path=f"/x/{stage}/policy.pt", sha256="0" * 64,
                                                        num_bytes=1, policy_version=1),
                            gate=judge_rewards(stage, reward, reward, BATTERY[stage]))

    flagged = checks.generation_calibration_result(outcome("rlvr", {"generation_calibration": figures}))
    assert not flagged.passed and flagged.severity is dg.AssetCheckSeverity.WARN
    assert flagged.description == "321 groups drawn against 320 priced (ratio 1.0031; each priced at its longest completions)"
    within = {**figures, "drawn_groups": 320, "ratio": 1.0, "overdrawn": False}
    assert checks.generation_calibration_result(outcome("rlvr", {"generation_calibration": within})).passed
    # Another stage's outcome (the recipe has no RLVR step), or one stored before its groups were counted.
    assert checks.generation_calibration_result(outcome("dpo", {"generation_calibration": figures})).passed
    assert checks.generation_calibration_result(outcome("rlvr", {"kl_to_reference": 0.1})).passed


def _assert_trained_on_the_worker(outcome) -> None:
    """The stage's steps ran on the stage worker under the supervisor: its report, the worker's own
    event file, and as many worker steps as the stage's checkpoint and loss curve count."""
    folder = Path(outcome.stage_dir)
    report = json.loads((folder / "supervision.json").read_text())
    assert report["outcome"] == "succeeded" and report["num_attempts"] == 1
    curve = outcome.metrics["reward_curve" if outcome.stage == "rlvr" else "loss_curve"]
    assert report["result"]["num_steps"] == outcome.checkpoint.policy_version == len(curve)
    assert (folder / "events-attempt-0.jsonl").is_file()
    assert {e.attempt for e in events.read(folder) if e.kind is EventKind.STEP} == {0}


def _assert_each_stage_is_in_the_runs_telemetry(result, *, gate_passed: bool = True) -> None:
    """Each stage's event log holds one event per optimizer step (RLVR: per trainer step), and the
    run's telemetry counts the three stages' windows as post-training, every bucket >= 0; after a
    failed RLVR gate the telemetry is not materialized."""
    for name in STAGES:
        outcome = result.output_for_node(name)
        steps = [e for e in events.read(Path(outcome.stage_dir)) if e.kind is EventKind.STEP]
        curve = outcome.metrics["reward_curve" if outcome.stage == "rlvr" else "loss_curve"]
        assert len(steps) == len(curve), name
    if not gate_passed:
        assert "training_telemetry" not in _materialized(result)
        return
    rows = {row["stage"]: row for row in result.output_for_node("training_telemetry")}
    assert {"sft", "dpo", "rlvr", "run"} <= set(rows)
    for name in STAGES:
        outcome = result.output_for_node(name)
        steps = [e for e in events.read(Path(outcome.stage_dir)) if e.kind is EventKind.STEP]
        curve = outcome.metrics["reward_curve" if outcome.stage == "rlvr" else "loss_curve"]
        assert len(steps) == len(curve), name
        if outcome.stage != "rlvr":  # RLVR's curve is the reward; its events carry the loss
            assert [e.loss for e in steps] == pytest.approx(curve), name
        row = rows[outcome.stage]
        assert row["num_steps"] == len(curve) and row["posttraining_seconds"] == row["allocated_seconds"] > 0
        assert 0 < row["productive_seconds"] < row["allocated_seconds"] and row["badput_other_seconds"] >= 0
    run = rows["run"]
    assert run["posttraining_seconds"] == pytest.approx(sum(rows[k]["allocated_seconds"] for k in ("sft", "dpo", "rlvr")))
    buckets = [v for k, v in run.items() if k.startswith("badput_")] + [run["productive_seconds"]]
    assert min(buckets) >= 0 and sum(buckets) == pytest.approx(run["allocated_seconds"])


def _assert_each_stage_started_from_the_one_before(result, base: Pretrained) -> None:
    """SFT starts from the pretraining chain's checkpoint, DPO from SFT's, RLVR from DPO's: in each
    asset's metadata and its metrics.json, with the digest the stage before recorded."""
    pretrained = (base.checkpoint, markers.read_marker(Path(base.checkpoint)).metadata_sha256)
    assert pretrained[1] == file_sha256(Path(base.checkpoint) / markers.METADATA_NAME)
    previous = pretrained
    for name in STAGES:
        (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key.path == [name]]
        metadata = event.step_materialization_data.materialization.metadata
        started = (metadata["started_from"].value, metadata["started_from_sha256"].value)
        assert started == previous, name
        assert (metadata["chain_start"].value, metadata["chain_start_sha256"].value) == pretrained, name
        record = json.loads((Path(metadata["checkpoint"].value).parent / "metrics.json").read_text())
        assert record["started_from"] == {"path": previous[0], "sha256": previous[1]}, name
        assert record["chain_start"] == {"path": pretrained[0], "sha256": pretrained[1]}, name
        previous = (metadata["checkpoint"].value, metadata["checkpoint_sha256"].value)
        assert previous[1] == file_sha256(previous[0])


def _ledger_metrics(installation, run_id: str) -> dict[str, list[float]]:
    """What `ito metrics` serves for the run (the route pages through this very reader)."""
    ledger = open_ledger(installation.settings.ledger_url)
    try:
        found: dict[str, list[float]] = {}
        for metric in ledger_telemetry.metrics(ledger, run_id, limit=ledger_telemetry.MAX_PAGE):
            found.setdefault(metric.name, []).append(metric.value)
        return found
    finally:
        ledger.dispose()


@pytest.mark.slow
def test_a_changed_pair_file_is_refused_before_training(installation, instance, base):
    defs = _defs(installation, base)
    references = _write_fixtures(installation, 16)
    recipe = _sized(_bind([{"kind": "sft", "learning_rate": 3e-3}], references))
    run_id = _ledger_run(installation, installation.manifest("post", post_training=recipe))
    key = _register(installation, instance)
    sft_file = installation.data_root / "fixtures" / "posttraining" / SFT_FILE
    sft_file.write_text(sft_file.read_text().replace('"response": "', '"response": "9', 1))  # one answer changed
    job = dg.define_asset_job("adhoc", selection=dg.AssetSelection.groups("manifest", "workload", "training",
                                                                         "posttraining"))
    result = job.resolve(asset_graph=defs.resolve_asset_graph()).execute_in_process(
        instance=instance, partition_key=key, raise_on_error=False, resources=defs.resources, tags={RUN_ID_TAG: run_id})
    assert "sft_checkpoint" not in _materialized(result)
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_failure_data.user_failure_data.metadata["error_code"].value == "SOURCE_DIGEST_MISMATCH"
    # The run never reaches `training_telemetry`: the failed stage published what the run used so
    # far (its window: it held its device while it read and refused the pairs), for the desk's quotes.
    figures = _ledger_metrics(installation, run_id)
    assert {name for name in figures if name.startswith("run/")} == set(history.RUN_FIGURES)
    assert figures[history.ALLOCATED][-1] > 0 and figures[history.PRODUCTIVE][-1] == 0


@pytest.mark.slow
@pytest.mark.long  # `make test` leaves every stage out in tests/test_local_run.py
def test_a_stage_left_out_of_the_recipe_carries_forward(installation, instance, base):
    defs = _defs(installation, base)
    recipe = [{"kind": "dpo", "learning_rate": 1e-6}]  # no SFT, no RLVR
    result = _materialize(installation, instance, defs, recipe, dg.AssetSelection.groups("manifest", "workload", "training", "posttraining"),
                          num_prompts=64)
    evaluations = _evaluations(result)
    assert evaluations["sft_eval_gate"] is True and evaluations["rlvr_eval_gate"] is True  # "no such step"
    assert evaluations["dpo_eval_gate"] is True  # a tiny DPO step does not regress
    events = {e.asset_key.path[0]: e.step_materialization_data.materialization.metadata
              for e in result.get_asset_materialization_events() if e.asset_key.path[0] in STAGES}
    assert events["sft_checkpoint"]["in_recipe"].value is False
    assert events["dpo_checkpoint"]["in_recipe"].value is True
    assert events["rlvr_checkpoint"]["in_recipe"].value is False


def test_a_stage_materialized_alone_asks_the_ledger_and_is_refused(installation, instance, base):
    defs = _defs(installation, base)
    recipe = [{"kind": "sft", "learning_rate": 3e-3}]
    first = _materialize(installation, instance, defs, recipe, dg.AssetSelection.groups("manifest", "workload", "training"),
                         num_prompts=16)
    assert first.success  # the authorization is on record, for that run
    job = dg.define_asset_job("alone", selection=["sft_checkpoint"]).resolve(asset_graph=defs.resolve_asset_graph())
    key = instance.get_dynamic_partitions("manifests")[0]
    alone = job.execute_in_process(instance=instance, partition_key=key, raise_on_error=False, resources=defs.resources)
    assert not alone.success and "sft_checkpoint" not in _materialized(alone)
    failure = next(e for e in alone.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_failure_data.user_failure_data.metadata["error_code"].value == "CONFIRMATION_INVALID"
