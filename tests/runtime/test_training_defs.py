"""The training domain in Dagster: the stages materialize through Pipes and the supervisor, each
with its blocking eval gate; a failed gate stops the run and stays failed on retry. The upstream
assets (manifest, clean shards) are stand-ins with the same keys, so only the training group runs."""

from __future__ import annotations

import dataclasses
import hashlib
import contextlib
import json
import math
import time
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import duckdb
import polars as pl
import pytest

from control.gate_world import Clock, make_policy, make_world, verified
from helpers import valid_manifest, write_manifest
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.resources import ItoSettingsResource, LedgerResource
from ito_assets.defs.training import pipes_client
from ito_assets.defs.telemetry.assets import TELEMETRY_ASSETS
from ito_assets.defs.training.assets import TRAINING_ASSETS
from ito_assets.defs.training.checks import TRAINING_CHECKS
from ito_assets.defs.training.launcher import TrainingLauncherResource
from ito_assets.defs.training.resources import TrainingRuntimeResource
from ito_assets.runtime.worker.execution import native_cpu_bf16
from ito_assets.data.shards import Shard, ShardSet
from ito_assets.control.run_tags import RUN_ID as RUN_ID_TAG
from ito_assets.evals.suite import load_suite
from ito_assets.control import create_run
from ito_assets.control.ledger import runs as ledger_runs
from ito_assets.control import history
from ito_assets.control import telemetry as ledger_telemetry
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.ledger import open_ledger
from ito_assets.control import runs as ledger_runs_module
from ito_assets.manifest import discovery
from ito_assets.settings import load_settings

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::dagster.PreviewWarning")]
ROOT = Path(__file__).resolve().parents[2]


def _texts() -> list[str]:
    path = ROOT / "data" / "fixtures" / "corpora" / "pydoc_topics.jsonl"
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


def _tampered(verdict: discovery.ManifestVerdict) -> discovery.ManifestVerdict:
    """The preparation's stored record with its manifest edited after confirmation (one more
    stage) while its digest still reads as the confirmed one."""
    manifest = verdict.verified.manifest
    document = manifest.model_dump(mode="json")
    document["training_target"]["stages"].append({"name": "long_context", "num_tokens": PLAN_BATCH * 64 * 5,
                                                  "sequence_length": 64})
    document["training_target"]["num_tokens"] += PLAN_BATCH * 64 * 5
    edited = type(manifest).model_validate_json(json.dumps(document), strict=True)
    return dataclasses.replace(verdict, verified=dataclasses.replace(verdict.verified, manifest=edited))


@dataclasses.dataclass(frozen=True)
class _Go:
    """A data decision's GO about `decision.candidate_shards`, worth its cost on any booking."""

    decision: SimpleNamespace
    gate: SimpleNamespace = dataclasses.field(default_factory=lambda: SimpleNamespace(passed=True, reason="GO"))

    def for_booking(self, run_plan, manifest):
        return self.gate


def _upstream(manifest_path: str, key: str, folder: Path, run, ledger, *, after_confirmation=None):
    prepared = discovery.judge(manifest_path, key, max_bytes=1 << 20)
    if after_confirmation == "file deleted":
        Path(manifest_path).unlink()
    elif after_confirmation == "record edited":
        prepared = _tampered(prepared)

    @dg.asset(name="training_manifest", partitions_def=manifests_partitions)
    def manifest_stand_in():
        return prepared

    @dg.asset(name="clean_shards", partitions_def=manifests_partitions)
    def clean_shards_stand_in():
        path = folder / "clean-00000.parquet"
        pl.DataFrame({"text": _texts()}).write_parquet(path)
        shard = Shard(path=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest(), num_rows=len(_texts()))
        return SimpleNamespace(shards=ShardSet(folder=str(folder), shards=(shard,)),
                               conservation=SimpleNamespace(holds=True), manifest_digest=prepared.digest)

    @dg.asset(name="run_authorization", partitions_def=manifests_partitions)
    def authorization_stand_in(context):
        # As the real asset attaches its Dagster run; a retry here stands for a fresh launch of the
        # same ledger run, so the attachment is moved to it (the eval-gate verdicts must still hold).
        with ledger.write() as conn:
            conn.execute(ledger_runs.update().where(ledger_runs.c.run_id == run.run_id)
                         .values(dagster_run_id=context.run_id))
        return {"authorized": True, "run_id": run.run_id, "checkpoint_dir": run.checkpoint_dir}

    @dg.asset(name="data_decision", partitions_def=manifests_partitions, ins={"clean_shards": dg.AssetIn("clean_shards")})
    def decision_stand_in(clean_shards):  # a GO about these very shards
        return _Go(decision=SimpleNamespace(candidate_shards=tuple(s.sha256 for s in clean_shards.shards.shards)))

    @dg.asset(name="training_plan", partitions_def=manifests_partitions)
    def plan_stand_in():
        from ito_assets.defs.decision.resources import BookedHardwareResource
        from ito_assets.training.run_plan import plan_outcome

        return plan_outcome(prepared.verified.manifest, BookedHardwareResource().hardware(), pair_shapes=None)

    return [manifest_stand_in, clean_shards_stand_in, authorization_stand_in, plan_stand_in, decision_stand_in]


def _posttraining_stand_ins() -> list:
    """The recipe's stages as telemetry reads them when none trained (post-training has its own tests)."""
    def stand_in(kind: str):
        @dg.asset(name=f"{kind}_checkpoint", partitions_def=manifests_partitions)
        def _untrained():
            return None
        return _untrained
    return [stand_in(kind) for kind in ("sft", "dpo", "rlvr")]


# 32 sequences: the plan's global batch for `micro` at 64 tokens on the default booked hardware
# (the OLMo ladder rule, `planner.default_global_batch_sequences`), so 30 and 10 steps.
PLAN_BATCH = 32
TWO_STAGES = [{"name": "pretraining", "num_tokens": PLAN_BATCH * 64 * 30, "sequence_length": 64},
              {"name": "mid_training", "num_tokens": PLAN_BATCH * 64 * 10, "sequence_length": 64}]
SUITE = ROOT / "data" / "fixtures" / "evals" / "ito-fixture-evals-v1.jsonl"


@contextlib.contextmanager
def _ledger_run(tmp_path: Path, stages=TWO_STAGES, **terms):
    """A real run in a real ledger (created through the gates) on a booking with `terms`."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    now = int(time.time())
    ledger = open_ledger(url, clock=Clock(now))
    world = make_world(ledger, make_policy(tmp_path), Clock(now))
    world.booking_id = world.booking(starts_at=now - 3600, ends_at=now + 3600, **terms)
    content = json.dumps(_document(stages), indent=2).encode()  # the very bytes _materialize writes
    request = TrainRequest(booking_id=world.booking_id, verified=verified(content),
                           confirmation_ref=world.confirm_train(world.booking_id, manifest=verified(content)),
                           idempotency_key="train-key-0001")
    try:
        yield create_run.create_run(ledger, world.policy, world.account, request).run, url, ledger
    finally:
        ledger.dispose()


@pytest.fixture
def ledger_run(tmp_path):
    """A real run in a real ledger (created through the gates), for its id and checkpoint folder."""
    with _ledger_run(tmp_path) as run:
        yield run


def _document(stages) -> dict:
    document = valid_manifest()
    document["model"]["size"] = "micro"
    document["training_target"] = {"num_tokens": sum(s["num_tokens"] for s in stages), "stages": stages}
    document["checkpoint_policy"] = {"interval_steps": 10, "keep_last": 2, "storage_uri": "tenant://checkpoints/unit"}
    for reference in document["data"]:  # the suite the stage battery scores on
        reference["decontamination"]["eval_suite_sha256"] = load_suite(SUITE).digest
    return document


def _materialize(tmp_path: Path, instance, runtime: TrainingRuntimeResource, ledger_run, stages=TWO_STAGES,
                 *, after_confirmation=None, run_config=None):
    document = _document(stages)
    (tmp_path / "manifests").mkdir(exist_ok=True)
    manifest_path = write_manifest(tmp_path / "manifests" / "manifest.json", document)
    (found,), _ = discovery.discover(tmp_path / "manifests", max_bytes=1 << 20)
    settings = load_settings({"ITO_STATE_DIR": str(tmp_path / "state")})
    instance.add_dynamic_partitions("manifests", [found.key])
    return dg.materialize(
        [*_upstream(manifest_path, found.key, tmp_path, ledger_run[0], ledger_run[2],
                    after_confirmation=after_confirmation), *TRAINING_ASSETS,
         *TRAINING_CHECKS, *_posttraining_stand_ins(), *TELEMETRY_ASSETS],
        partition_key=found.key, instance=instance, tags={RUN_ID_TAG: ledger_run[0].run_id},
        resources={"ito": ItoSettingsResource.from_settings(settings), "training_runtime": runtime,
                   "training_launcher": TrainingLauncherResource(),
                   "pipes_subprocess_client": pipes_client(), "ledger": LedgerResource(url=ledger_run[1])},
        raise_on_error=False, run_config=run_config,
    )


def _metadata(result, asset: str) -> dict:
    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == asset]
    return {k: v.value for k, v in event.step_materialization_data.materialization.metadata.items()}


def _runtime(**changes) -> TrainingRuntimeResource:
    return TrainingRuntimeResource(**{"poll_interval_s": 0.2, "hang_timeout_s": 60.0, "grace_s": 5.0, **changes})


@pytest.mark.long  # `make test` trains the stages through Pipes with their gates in tests/test_local_run.py
def test_the_stages_train_through_pipes_with_gates_and_telemetry(tmp_path, instance, ledger_run):
    # The manifests folder is the preparation's inbox only: a trained run never reads it again.
    result = _materialize(tmp_path, instance, _runtime(), ledger_run, after_confirmation="file deleted")
    assert not (tmp_path / "manifests" / "manifest.json").exists()
    for event in result.get_asset_materialization_events():
        if event.asset_key.to_user_string() == "pretraining_checkpoint":
            trained = event.step_materialization_data.materialization.metadata["trained_manifest_digest"].value
            assert trained == ledger_run[0].manifest_digest
    assert result.success
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert {"training_tokens", "pretraining_checkpoint", "mid_training_checkpoint", "long_context_checkpoint",
            "training_telemetry"} <= materialized
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    gates = {name: e.passed for name, e in evaluations.items() if name.endswith("_eval_gate")}
    assert gates == {"pretraining_eval_gate": True, "mid_training_eval_gate": True, "long_context_eval_gate": True}
    # Predicted against measured step time: a warning in the UI, never a stop.
    calibrated = evaluations["pretraining_step_time_calibration"]
    assert calibrated.severity is dg.AssetCheckSeverity.WARN
    pretraining = result.output_for_node("pretraining_checkpoint")
    assert calibrated.passed is not pretraining.calibration["flagged"]
    assert pretraining.calibration["device"] == "CPU" and pretraining.calibration["measured_step_s"] > 0
    assert pretraining.calibration["step_time_ratio"] == pytest.approx(
        pretraining.calibration["measured_step_s"] / pretraining.calibration["predicted_step_s"], rel=1e-3)
    mid = result.output_for_node("mid_training_checkpoint")
    assert mid.stage == "mid_training" and mid.num_steps == 10 and mid.gate["compared_with"] == "pretraining"
    assert {c["metric"] for c in mid.gate["checks"]} == {"heldout_loss", "answer_loss"}  # the whole battery
    config = json.loads((Path(mid.stage_dir) / "stage.json").read_text())
    # The plan's layout (dp_shard 8 on the booking) on this host's one rank, each change named.
    assert config["batch_size"] == PLAN_BATCH and config["layout"]["dp_shard"] == 1
    assert {f["field"] for f in config["layout_fallbacks"]} >= {"dp_shard", "compile"}
    if not native_cpu_bf16():  # this CPU emulates bf16: the plan's bf16 trains as fp32, named
        assert config["layout"]["precision"] == "fp32" and "precision" in {f["field"] for f in config["layout_fallbacks"]}
    ran = json.loads((Path(mid.stage_dir) / "result.json").read_text())["layout"]
    assert ran["ran"] == config["layout"] and mid.layout == ran
    assert result.output_for_node("long_context_checkpoint") == mid  # not in the manifest: carried forward
    pipes_metrics = [e for e in instance.all_logs(result.run_id) if "[pretraining] attempt 0" in (e.user_message or "")]
    assert pipes_metrics, "rank 0 logs through Dagster Pipes"
    with duckdb.connect(str(tmp_path / "state" / "warehouse.duckdb"), read_only=True) as connection:
        stages = connection.execute("SELECT stage, num_steps FROM training_telemetry ORDER BY stage").fetchall()
    assert stages == [("mid_training", 10.0), ("pretraining", 30.0), ("run", 40.0)]
    run, _, ledger = ledger_run
    listed = ledger_telemetry.checkpoints(ledger, run.run_id)  # what `ito checkpoints` shows
    assert {(c.step, Path(c.path).parent.name) for c in listed} >= {(30, "pretraining"), (10, "mid_training")}
    assert all(Path(c.path).is_relative_to(run.checkpoint_dir) for c in listed)
    names = {m.name for m in ledger_telemetry.metrics(ledger, run.run_id, limit=500)}  # `ito metrics`
    assert {"pretraining/loss", "pretraining/heldout_loss", "pretraining/answer_loss", "pretraining/goodput",
            "mid_training/loss", "pretraining/step_time_ratio", "pretraining/predicted_step_s",
            "pretraining/measured_step_s"} <= names


def test_a_failed_gate_stops_the_run_and_stays_failed_on_retry(tmp_path, instance, ledger_run):
    impossible = _runtime(min_improvement_bands=1e6)  # no training improves by a million noise bands
    first = _materialize(tmp_path, instance, impossible, ledger_run)
    gates = {e.check_name: e.passed for e in first.get_asset_check_evaluations()}
    assert gates["pretraining_eval_gate"] is False
    materialized = {e.asset_key.to_user_string() for e in first.get_asset_materialization_events()}
    assert "pretraining_checkpoint" in materialized and "mid_training_checkpoint" not in materialized
    run, _, ledger = ledger_run
    assert ledger_runs_module.get(ledger, run.run_id).started_at is not None  # it trained: its cost stays spent
    # It stops before `training_telemetry`: the pretraining stage published what the run used, for the
    # desk's quotes, which would otherwise count only the runs that went well.
    figures = {m.name: m.value for m in ledger_telemetry.every_page(ledger_telemetry.metrics, ledger, run.run_id)
               if m.name.startswith("run/")}
    assert set(figures) == set(history.RUN_FIGURES) and figures[history.ALLOCATED] >= figures[history.PRODUCTIVE] > 0

    retry = _materialize(tmp_path, instance, _runtime(), ledger_run)  # with a policy it would now pass
    assert not retry.success
    failure = next(e for e in retry.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "pretraining_checkpoint"
    assert failure.event_specific_data.user_failure_data.metadata["error_code"].value == "EVAL_GATE_FAILED"
    assert "the pretraining eval gate failed; the run stays stopped" in failure.event_specific_data.error.message


@pytest.mark.parametrize(("field", "value", "accepted"), [
    ("heldout_loss_noise_band", 0.0, False), ("heldout_loss_noise_band", 5e-324, True),
    ("answer_loss_noise_band", -0.01, False), ("answer_loss_noise_band", math.nan, False),
    ("answer_loss_noise_band", math.inf, False),
    ("min_improvement_bands", 0.0, True), ("min_improvement_bands", -5e-324, False),
    ("max_regression_bands", math.nan, False),
    ("hang_timeout_s", math.nan, False), ("poll_interval_s", math.inf, False), ("grace_s", 0.0, False),
    ("max_restarts", -1, False), ("max_restarts", 0, True), ("batch_size", 0, False), ("batch_size", 1, True),
    ("grace_s", 86_400.0, True), ("grace_s", 86_400.5, False), ("hang_timeout_s", 1e300, False),
    ("poll_interval_s", 300.0, True), ("poll_interval_s", 300.5, False),  # the hang bound's default: 300 s
    ("seed", -1, False), ("seed", 0, True), ("seed", 2**63 - 1, True), ("seed", 2**63, False),
])
def test_the_training_runtime_refuses_a_value_its_gates_or_supervisor_would(field, value, accepted):
    if accepted:
        assert getattr(TrainingRuntimeResource(**{field: value}), field) == value
    else:
        with pytest.raises(ValueError, match="training_runtime: "):
            TrainingRuntimeResource(**{field: value})


def test_a_bad_gate_band_from_the_launchpad_fails_the_run_before_it_trains_or_is_charged(tmp_path, instance, ledger_run):
    """The launchpad's training_runtime config is the resource's: a band the gates refuse was
    accepted, and raised only after the stage had marked the run training (its cost then spent)."""
    result = _materialize(tmp_path, instance, _runtime(), ledger_run,
                          run_config={"resources": {"training_runtime": {"config": {"heldout_loss_noise_band": 0.0}}}})
    assert not result.success
    assert "training_runtime: noise_band must be positive and finite" in str(result.all_events)
    assert not result.get_asset_materialization_events()  # no step ran
    assert not (Path(ledger_run[0].checkpoint_dir) / "pretraining").exists()
    assert ledger_runs_module.get(ledger_run[2], ledger_run[0].run_id).started_at is None


def test_a_batch_the_stages_tokens_cannot_fill_fails_before_the_run_trains(tmp_path, instance, ledger_run):
    """Each attempt of the worker found it, and the supervisor restarted the same failure until its
    budget was spent, with the run already marked training."""
    result = _materialize(tmp_path, instance, _runtime(), ledger_run,
                          run_config={"resources": {"training_runtime": {"config": {"batch_size": 10**6}}}})
    assert not result.success
    assert "a global batch of 1000000 sequences (the plan's, or batch_size) is more than the pretraining stage's " \
           "tokens hold" in str(result.all_events)
    assert not (Path(ledger_run[0].checkpoint_dir) / "pretraining").exists()
    assert ledger_runs_module.get(ledger_run[2], ledger_run[0].run_id).started_at is None


def test_a_prepared_record_edited_after_confirmation_is_refused_before_training(tmp_path, instance, ledger_run):
    result = _materialize(tmp_path, instance, _runtime(), ledger_run, after_confirmation="record edited")
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "pretraining_checkpoint"
    assert failure.event_specific_data.user_failure_data.metadata["error_code"].value == "MANIFEST_DIGEST_MISMATCH"
    assert not (Path(ledger_run[0].checkpoint_dir) / "pretraining").exists()
    # No stage launched: a gate_failed end gives the run's cost back to the manifest's cap.
    assert ledger_runs_module.get(ledger_run[2], ledger_run[0].run_id).started_at is None


def test_a_run_that_waited_past_the_time_its_plan_needs_is_refused_before_any_stage(tmp_path, instance, ledger_run,
                                                                                     monkeypatch):
    """Created with its plan inside the window; when the job asks the ledger again, none of the
    window is left (a queue that waited, as a clock moved to the window's end): no stage launches
    and the run's cost goes back to the cap."""
    from ito_assets.control import authorization

    asked = authorization.reverify
    monkeypatch.setattr(authorization, "reverify", lambda ledger, run_id: dataclasses.replace(
        granted := asked(ledger, run_id), verified_at=granted.eligibility.ends_at))
    result = _materialize(tmp_path, instance, _runtime(), ledger_run)
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "training_tokens"
    assert failure.event_specific_data.user_failure_data.metadata["error_code"].value == "CAPACITY_UNAVAILABLE"
    assert ledger_runs_module.get(ledger_run[2], ledger_run[0].run_id).started_at is None


@pytest.mark.parametrize(("started_at", "left", "refused"), [(None, 1000, False), (None, 999, True), (5, 0, False)])
def test_the_time_check_at_launch_holds_the_whole_plan_only_before_a_stage_launched(started_at, left, refused):
    """At exactly the plan's length left it goes on, a second less it stops; once a stage has
    launched (a resumed run) it goes on, whatever is left, since it needs only the rest of its plan."""
    from ito_assets.control.entitlement import Eligibility
    from ito_assets.defs.workload.live import LiveRun
    from ito_assets.training.run_plan import PlanOutcome

    terms = Eligibility(account_id="a", booking_id="b", booking_revision=1, gpu_type="H100", num_gpus=8, num_nodes=1,
                        topology="t", region="r", network="ib-400g", starts_at=0, ends_at=10_000, duration_s=10_000)
    live = LiveRun("run", Path("/nonexistent"), None, terms, 100, started_at, 10_000 - left)
    outcome = PlanOutcome(run_plan=SimpleNamespace(wall_seconds=1000.0))
    if not refused:
        live.require_time_for(outcome)
        return
    with pytest.raises(dg.Failure) as stopped:
        live.require_time_for(outcome)
    assert stopped.value.metadata["error_code"].value == "CAPACITY_UNAVAILABLE"


def test_the_stages_train_the_plan_made_for_the_run_s_own_booking(tmp_path, instance):
    """A booking of two nodes of eight GPUs, where the prepared `training_plan` assumed the configured
    one node of eight: the stage sizes itself from the plan `ito plan --booking` shows for the
    booking (its planned layout recorded beside what ran on this host), never from the other."""
    from ito_assets.manifest.schema import Manifest
    from ito_assets.runtime.stage import curriculum as stage_plans
    from ito_assets.training.run_plan import booked_hardware, plan_run

    one = TWO_STAGES[:1]
    with _ledger_run(tmp_path, one, num_gpus=16, num_nodes=2, topology="2x8-nvlink") as run:
        result = _materialize(tmp_path, instance, _runtime(hang_timeout_s=120.0), run, one)  # replica groups wait 60 s at most
        assert result.success
        pretraining = result.output_for_node("pretraining_checkpoint")
        tokens = result.output_for_node("training_tokens")
    # The BPE aimed at the planned model's vocabulary (micro: 512), and the stage trained with what it gave.
    assert tokens.vocab_size <= 512 == _metadata(result, "training_tokens")["vocab_target"]
    config = json.loads((Path(pretraining.stage_dir) / "stage.json").read_text())
    assert config["vocab_size"] == tokens.vocab_size
    # What the stage was given: what ran, where nothing fell back, and each fallback's planned value.
    planned = {**config["layout"], **{f["field"]: f["planned"] for f in config["layout_fallbacks"]}}
    manifest = Manifest.model_validate_json(json.dumps(_document(one)))
    terms = dict(gpu_type="H100", topology="2x8-nvlink", network="ib-400g", num_gpus=16, num_nodes=2, price_per_gpu_hour_cents=100)
    booked = stage_plans.stage_plan(plan_run(manifest, booked_hardware(**terms), pair_shapes=None), "pretraining").layout
    configured = stage_plans.stage_plan(plan_run(manifest, booked_hardware(**{**terms, "num_gpus": 8, "num_nodes": 1}), pair_shapes=None), "pretraining").layout
    assert booked.describe() != configured.describe()  # the two bookings plan differently
    assert planned == booked.describe() and config["replica_groups"] == booked.dp_replicate


@pytest.mark.parametrize(("value", "accepted"), [(-1, False), (0, True), (1024, True), (1025, False)])
def test_the_posttraining_resource_refuses_a_thread_count_torch_would(value, accepted):
    from ito_assets.defs.posttraining.resources import PostTrainingResource

    if accepted:
        assert PostTrainingResource(num_threads=value).runtime().num_threads == value
    else:
        with pytest.raises(ValueError, match="posttraining: num_threads: must be 0"):
            PostTrainingResource(num_threads=value)


@dg.asset(name="decision_run", partitions_def=manifests_partitions)
def _decision_ran():
    return 1


@dg.asset(name="data_decision", partitions_def=manifests_partitions, ins={"decision_run": dg.AssetIn("decision_run")})
def _decision_judged(decision_run):
    return decision_run


def _judgement_current(instance, partition: str) -> None:
    from ito_assets.defs.training.assets import _require_latest_decision

    _require_latest_decision(dg.build_asset_context(instance=instance, partition_key=partition))


def test_a_decision_run_materialized_again_after_its_judgement_stops_training(instance):
    """A decision run of the manifest materialized after its `data_decision` (another verdict,
    perhaps) leaves the stored GO stale: training refuses it with DATA_DECISION_STALE."""
    ran, judged = _decision_ran, _decision_judged
    instance.add_dynamic_partitions("manifests", ["abc123def456"])
    assert dg.materialize([ran, judged], instance=instance, partition_key="abc123def456").success
    _judgement_current(instance, "abc123def456")  # judged the latest: passes
    assert dg.materialize([ran], instance=instance, partition_key="abc123def456").success
    with pytest.raises(dg.Failure) as stale:
        _judgement_current(instance, "abc123def456")
    assert stale.value.metadata["error_code"].value == "DATA_DECISION_STALE"
    assert dg.materialize([ran, judged], instance=instance, partition_key="abc123def456").success
    _judgement_current(instance, "abc123def456")


def test_another_manifests_decision_run_leaves_this_manifests_decision_current(instance):
    """Dagster's input pointer tag names the input asset's latest materialization of any
    partition: compared with this manifest's, another manifest's decision run made a current
    verdict stale, and judging it again kept it so."""
    ran, judged = _decision_ran, _decision_judged
    instance.add_dynamic_partitions("manifests", ["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    assert dg.materialize([ran, judged], instance=instance, partition_key="aaaaaaaaaaaa").success
    assert dg.materialize([ran], instance=instance, partition_key="bbbbbbbbbbbb").success  # another manifest's
    assert dg.materialize([ran, judged], instance=instance, partition_key="aaaaaaaaaaaa",
                          selection=[judged]).success  # judged again, reading its own decision run
    _judgement_current(instance, "aaaaaaaaaaaa")
