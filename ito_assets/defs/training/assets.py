"""The curriculum as assets: token shards and one checkpoint asset per stage.

Each stage asset sizes its stage from the plan (global batch, the layout fitted to this host's
ranks, torchft replica groups where the plan replicates) and calls the runtime's stage entry points
(`ito_assets.runtime.stage.run`): `prepare`, the supervisor's command run through Dagster Pipes,
then `conclude` (the eval gate, the verdict, the ledger); it only adds metadata. Gates are enforced
here, before the first step: the ledger's authorization of the run (`run_authorization`), and the
eval gates: a run whose gate failed never trains again (EVAL_GATE_FAILED), whatever is retried.
"""

import dataclasses
from pathlib import Path

import dagster as dg

from ito_assets.data import lineage
from ito_assets.defs.failures import failure, verified_or_fail
from ito_assets.defs import owners
from ito_assets.defs.manifest.partitions import TRAINED_ONE_OF_TWO, manifests_partitions
from ito_assets.defs.resources import ItoSettingsResource, LedgerResource, WAREHOUSE_POOL
from ito_assets.defs.telemetry.assets import publish_after_stage
from ito_assets.defs.training.launcher import TrainingLauncherResource
from ito_assets.defs.training.resources import TrainingRuntimeResource
from ito_assets.defs.workload.live import LiveRun, mark_training_started, require_live_authorization
from ito_assets.defs.training.stage_outcome import outcome_metadata
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import EvalSuite, parse_suite, read_suite_bytes
from ito_assets.manifest.schema import STAGE_ORDER, Manifest
from ito_assets.manifest.verify import eval_suite_mismatches
from ito_assets.runtime.stage import corpus
from ito_assets.runtime.stage import curriculum as stages
from ito_assets.runtime.record.storage import RunLayout, child, ensure_dir, write_atomic
from ito_assets.runtime.stage import run as stage_run
from ito_assets.runtime.stage.eval_gate import VerdictStore
from ito_assets.training.decision_gate import standing_gate
from ito_assets.training.hardware import gpu_spec
from ito_assets.training.planner import Hardware, PlanRequest
from ito_assets.training.run_plan import PlanOutcome
from ito_assets.training.tokenizer import TokenizerConfig

GROUP = "training"


@dg.asset(
    group_name=GROUP,
    owners=[owners.TRAINING],
    kinds={"numpy"},
    partitions_def=manifests_partitions,
    pool=WAREHOUSE_POOL,  # it records the shards' consumption in the warehouse
    ins={"clean_shards": dg.AssetIn("clean_shards"), "training_plan": dg.AssetIn("training_plan"),
         "data_decision": dg.AssetIn("data_decision"), "run_authorization": dg.AssetIn("run_authorization")},
    description="Byte-level BPE trained on `clean_shards`, and the token shards every stage reads "
    "(training split and the held-out split the stage gates evaluate on). Refuses a run the ledger "
    "no longer authorizes, a data decision that did not pass, clean shards whose digests or "
    "accounting do not hold, and a plan that was refused, exceeds the budget or, before any stage "
    "launched, no longer fits what is left of the booked window." + TRAINED_ONE_OF_TWO,
)
def training_tokens(
    context: dg.AssetExecutionContext, ito: ItoSettingsResource, ledger: LedgerResource, clean_shards,
    training_plan: PlanOutcome, data_decision, run_authorization: dict,
) -> corpus.TokenSet:
    live = require_live_authorization(context, ledger, run_authorization, "training")
    run_id, checkpoint_dir = live.run_id, live.checkpoint_dir
    _require_data(clean_shards, data_decision)
    _require_latest_decision(context)
    booked = _booked_plan(context, live, training_plan, ito.settings().data_root)
    _require_plan(booked)
    _require_worth_it(data_decision, booked, live.manifest.manifest)
    live.require_time_for(booked)
    # Lineage for auditors: this ledger run consumed these clean shards.
    try:
        lineage.record_consumption(ito.settings().warehouse_path, [s.sha256 for s in clean_shards.shards.shards],
                                   run_id, "training_tokens", clean_shards.manifest_digest)
    except ItoError as error:  # the warehouse busy, corrupt or on a full disk: its code, not a traceback
        raise failure(error) from None
    folder = RunLayout.for_run(checkpoint_dir, run_id).run_dir / "tokens"  # runs of one manifest never share it
    # The BPE aims at the vocabulary of the model the plan priced; a corpus too small for that many
    # merges gives fewer, and the stages build the model with what it gave (never more than priced).
    target = TokenizerConfig(vocab_size=booked.run_plan.model.vocab_size)
    tokens = corpus.prepare_from_shards(clean_shards.shards, folder, config=target)  # a batch at a time
    context.add_output_metadata({
        "vocab_size": tokens.vocab_size, "vocab_target": target.vocab_size, "num_train_tokens": tokens.num_train_tokens,
        "num_heldout_tokens": tokens.num_heldout_tokens, "tokenizer_sha256": tokens.tokenizer_sha256,
        "train_sha256": tokens.train_sha256, "heldout_sha256": tokens.heldout_sha256,
    })
    return tokens


def _require_data(clean_shards, decision) -> None:  # a CleanStage and a training.decision_gate.DataDecision
    """The data and decision gates, enforced again where compute is spent: their blocking checks
    ran in another job, and a checked asset is written even when its check fails. The verdict is
    drawn again from the decision's recorded runs (`standing_gate`): one an earlier rule gave, and
    today's would not, is stale."""
    gate = standing_gate(decision)
    if not gate.passed:
        raise dg.Failure(description=f"the data decision did not pass: {gate.reason}",
                         metadata={"error_code": gate.error_code.value})
    judged = getattr(decision.decision, "candidate_shards", None)  # absent from a decision stored before it was recorded
    if judged != tuple(s.sha256 for s in clean_shards.shards.shards):
        raise dg.Failure(description="the data decision judged other clean shards than these (they were prepared "
                         "again since, or the decision predates its record of them): materialize decision_run and "
                         "data_decision again for this manifest",
                         metadata={"error_code": ErrorCode.DATA_DECISION_STALE.value})
    if not clean_shards.conservation.holds or clean_shards.shards.verify():
        raise dg.Failure(description="the clean shards' digests or document accounting do not hold",
                         metadata={"error_code": ErrorCode.DATA_POLICY_VIOLATION.value})


def _require_latest_decision(context: dg.AssetExecutionContext) -> None:
    """DATA_DECISION_STALE where the manifest's `decision_run` was materialized after its
    `data_decision` (event storage ids grow with time): the verdict stored judged an earlier
    decision run (a GO the data may no longer give). Not Dagster's input pointer tag: it names
    the input asset's latest materialization of any partition, another manifest's as often."""
    partition = context.partition_key if context.has_partition_key else None
    judged, ran = (_latest_record(context.instance, name, partition) for name in ("data_decision", "decision_run"))
    if judged is None or ran is None:
        return  # nothing recorded to compare: a decision stored outside this instance
    if ran.storage_id > judged.storage_id:
        raise dg.Failure(description="decision_run was materialized again after data_decision judged it: materialize "
                         "data_decision again for this manifest, so that training follows the latest decision",
                         metadata={"error_code": ErrorCode.DATA_DECISION_STALE.value})


def _latest_record(instance: dg.DagsterInstance, asset: str, partition: str | None):
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition] if partition else None),
        limit=1).records
    return records[0] if records else None


def _require_worth_it(decision, booked: PlanOutcome, manifest: Manifest) -> None:  # a DataDecision
    """The decision's economics on the run's own booking: the data decision judged them on the
    configured hardware and price, before any booking existed."""
    gate = decision.for_booking(booked.run_plan, manifest)
    if not gate.passed:
        hardware = booked.run_plan.hardware
        raise dg.Failure(description=f"the data decision does not pass on the run's booking ({hardware.world_size} x "
                         f"{hardware.gpu.name} at {hardware.price_cents_per_gpu_hour} cents a GPU-hour): {gate.reason}",
                         metadata={"error_code": gate.error_code.value})


def _booked_plan(context: dg.AssetExecutionContext, live: LiveRun, prepared: PlanOutcome,
                 data_root: Path | None) -> PlanOutcome:
    """The plan the run executes: made for its own booking (`LiveRun.booked_plan`), noted in the
    log where the booking's hardware is not the one the prepared `training_plan` assumed."""
    try:
        booked = live.booked_plan(data_root)
    except ItoError as error:
        raise failure(error) from None
    if booked.run_plan is not None and prepared.run_plan is not None and booked.run_plan.hardware != prepared.run_plan.hardware:
        context.log.info(f"planned for the run's booking ({booked.run_plan.hardware.describe()}), not the prepared plan's "
                         f"configured hardware ({prepared.run_plan.hardware.describe()})")
    return booked


def _require_plan(outcome: PlanOutcome) -> None:
    """The plan's gates, enforced again where compute is spent (its checks ran in another job)."""
    if outcome.run_plan is None:
        raise dg.Failure(description="the training plan was refused", metadata={"error_code": ErrorCode.PLAN_REFUSED.value})
    budget = outcome.run_plan.budget
    if not (budget.within_cap and budget.within_max_incremental):
        raise dg.Failure(description="the planned cost exceeds the manifest's budget",
                         metadata={"error_code": ErrorCode.BUDGET_EXCEEDED.value})


def _eval_suite(ito: ItoSettingsResource, manifest: Manifest, layout: RunLayout) -> tuple[Path, EvalSuite]:
    """The suite of the stage's eval battery: the one the data was decontaminated against, else
    its answers may have been trained on; and its copy in the run's folder, which the worker reads
    when it evaluates, hours later: an edit of the configured file meanwhile (even one undone)
    would otherwise fail the stage after its compute was spent."""
    path = ito.settings().eval_suite_path
    data = read_suite_bytes(path)
    suite = parse_suite(path.stem, data)  # as load_suite names it: the copy keeps the file's name
    if eval_suite_mismatches(manifest, suite.suite_id, suite.digest):
        raise ItoError(ErrorCode.EVAL_SUITE_MISMATCH,
                       "the eval suite differs from the one the training data was decontaminated against")
    folder = ensure_dir(child(layout.run_dir, f"eval-suite/{suite.digest.removeprefix('sha256:')}"), layout.checkpoint_dir)
    try:
        copy = child(folder, path.name)
    except ItoError:  # a name no checkpoint folder takes (a space): the worker reads items and digest alone
        copy = folder / "suite.jsonl"
    if not copy.is_file() or read_suite_bytes(copy) != data:
        write_atomic(copy, data)
    return copy, suite


@dataclasses.dataclass(frozen=True)
class _StageResources:
    ito: ItoSettingsResource
    runtime: TrainingRuntimeResource
    launcher: TrainingLauncherResource
    pipes: dg.PipesSubprocessClient
    ledger: LedgerResource


def _stage_config(res: _StageResources, manifest: Manifest, stage, plan: PlanOutcome, run_id: str,
                  layout: RunLayout, tokens, previous, nnodes: int, nproc: int, has_cuda: bool):
    import numpy as np
    from ito_assets.runtime.worker import batches, execution  # need torch: imported where a stage runs

    suite_path, suite = _eval_suite(res.ito, manifest, layout)
    stage_plan = stages.stage_plan(plan.run_plan, stage.name)
    replicas = (stages.replica_groups_for(stage_plan.layout, nnodes=nnodes, nproc_per_node=nproc)
                if res.runtime.replica_groups else 1)
    sizing = stages.sizing_from_plan(stage_plan, vocab_size=tokens.vocab_size, world_size=nnodes * nproc,
                                     seed=res.runtime.seed, batch_size=res.runtime.batch_size, replica_groups=replicas,
                                     eager_reason=res.runtime.eager_reason(has_cuda=has_cuda),
                                     fp32_reason=res.runtime.fp32_reason(has_cuda=has_cuda,
                                                                         native_cpu_bf16=execution.native_cpu_bf16()),
                                     deterministic=res.runtime.deterministic)
    # Checked here, not by each attempt of the worker: a batch the tokens cannot fill fails every one.
    windows = batches.window_count(np.load(tokens.train_path, mmap_mode="r"), stage.sequence_length)
    if windows < sizing.batch_size:
        raise ValueError(f"a global batch of {sizing.batch_size} sequences (the plan's, or batch_size) is more than "
                         f"the {stage.name} stage's tokens hold: {windows} windows of {stage.sequence_length} + 1 tokens")
    return stages.worker_config(
        run_key=run_id, stage=stage, policy=manifest.checkpoint_policy, layout=layout, sizing=sizing,
        tokens_path=Path(tokens.train_path), heldout_path=Path(tokens.heldout_path),
        init_from=previous.final_checkpoint if previous else None, tokenizer_path=tokens.tokenizer_path,
        eval_suite_path=str(suite_path), eval_suite_sha256=suite.digest,
        **stages.positions(manifest.training_target, stage.name))


def _require_this_runs(previous, layout: RunLayout) -> None:  # a StageCheckpoint or None
    """The previous stage's final checkpoint lies in this run's folder (`RunLayout.holds`)."""
    if previous is not None and not layout.holds(previous.final_checkpoint):
        raise ItoError(ErrorCode.CHECKPOINT_STORAGE_INVALID,
                       "the previous stage's checkpoint is not in this run's folder (another run of the manifest "
                       "wrote that stage's output since): materialize the previous stage again for this run")


def _run_stage(context, res: _StageResources, inputs: dict, previous, name: str):
    import torch  # to count local GPUs; torch's import is paid by a stage run, not by the code location

    verdict, tokens = inputs["training_manifest"], inputs["training_tokens"]
    prepared = verified_or_fail(verdict, "training")
    if stages.find_stage(prepared.manifest.training_target, name) is None:  # the next stage starts from the last trained one
        context.log.info(f"the manifest has no {name} stage: the previous checkpoint carries forward")
        yield dg.Output(previous, metadata={"in_manifest": False})
        return
    # What is trained is the ledger's confirmed manifest; the prepared one must have its digest.
    live = require_live_authorization(context, res.ledger, inputs["run_authorization"], "training",
                                      prepared=prepared)
    run_id, checkpoint_dir, manifest = live.run_id, live.checkpoint_dir, live.manifest.manifest
    stage = stages.find_stage(manifest.training_target, name)
    try:
        layout = RunLayout.for_run(checkpoint_dir, run_id)
        _require_this_runs(previous, layout)
        VerdictStore(layout.run_dir).ensure_not_failed(STAGE_ORDER[: STAGE_ORDER.index(name) + 1])
        # The stage's layout; the whole plan, post-training's pair files read, was checked by
        # `training_tokens` before any compute.
        plan = _booked_plan(context, live, inputs["training_plan"], None)
        _require_plan(plan)
        has_cuda = torch.cuda.is_available()
        nnodes, nproc = res.launcher.counts(plan.run_plan.hardware, has_cuda=has_cuda)
        config = _stage_config(res, manifest, stage, plan, run_id, layout, tokens, previous, nnodes, nproc, has_cuda)
        # Before the run is marked training: from then on its cost stays spent, whatever its end.
        policy = res.runtime.gate_policy(manifest.training_target.eval_gate)
    except ItoError as error:
        raise failure(error) from None
    except ValueError as error:  # a batch that does not split over this host's data-parallel ranks, a gate's band
        raise dg.Failure(description=f"training_runtime: {error}") from None
    try:  # the launcher's settings are checked before the supervisor starts
        supervisor = dataclasses.replace(res.runtime.supervisor(nnodes=nnodes, nproc_per_node=nproc),
                                         launch=res.launcher.launch_config(nproc))
    except ValueError as error:
        raise dg.Failure(description=f"training_launcher: {error}") from None
    ready = stage_run.prepare(config, supervisor)
    mark_training_started(res.ledger, run_id)
    try:
        res.pipes.run(context=context, command=list(ready.command))
        with res.ledger.open() as opened:
            outcome = stage_run.conclude(
                ready, ledger=opened, run_id=run_id, run_dir=layout.run_dir, policy=policy,
                previous_eval=previous.eval if previous else None,
                previous_units=previous.eval_units if previous else None,
                previous_stage=stages.previous_stage(manifest.training_target, name),
                priced=_host_request(config, stage, plan.run_plan.hardware, nnodes, nproc, has_cuda))
    finally:
        publish_after_stage(context, res.ledger, run_id, layout)
    yield dg.Output(outcome, metadata={**outcome_metadata(outcome, policy), "nnodes": nnodes, "nproc_per_node": nproc,
                                       "replica_groups": config.replica_groups,
                                       # what an auditor matches against the confirmation
                                       "trained_manifest_digest": live.manifest.digest})


def _host_request(config, stage, booked: Hardware, nnodes: int, nproc: int, has_cuda: bool) -> PlanRequest:
    """The planner's request for the stage as it ran: its model, batch and ranks, on the booking's
    GPU, or on the nominal CPU host."""
    host = dataclasses.replace(booked, gpu=booked.gpu if has_cuda else gpu_spec("CPU"), num_nodes=nnodes, gpus_per_node=nproc)
    return PlanRequest(model=config.model_config(), sequence_length=config.sequence_length,
                       global_batch_sequences=config.batch_size, num_training_tokens=stage.num_tokens, hardware=host)


def _stage_asset(name: str, upstream: str | None):
    ins = {"run_authorization": dg.AssetIn("run_authorization"), "training_manifest": dg.AssetIn("training_manifest"),
           "training_tokens": dg.AssetIn("training_tokens"), "training_plan": dg.AssetIn("training_plan")}
    if upstream:
        ins["previous"] = dg.AssetIn(f"{upstream}_checkpoint")
    decorate = dg.asset(
        name=f"{name}_checkpoint",
        group_name=GROUP,
        owners=[owners.TRAINING],
        kinds={"pytorch"},
        partitions_def=manifests_partitions,
        ins=ins,
        description=f"The {name} stage's final checkpoint (torch.distributed.checkpoint), trained out of process "
        f"under the supervisor from the previous stage's, with the plan's global batch and layout (degrees, "
        f"precision, activation checkpointing, micro-batch, compile; what fell back is in `layout_fallbacks`) "
        f"on the plan's nodes (`training_launcher`); the previous one carried forward when the "
        f"manifest has no {name} stage." + TRAINED_ONE_OF_TWO,
    )

    def stage(context: dg.AssetExecutionContext, ito: ItoSettingsResource, training_runtime: TrainingRuntimeResource,
              training_launcher: TrainingLauncherResource, pipes_subprocess_client: dg.PipesSubprocessClient,
              ledger: LedgerResource, **inputs):
        res = _StageResources(ito, training_runtime, training_launcher, pipes_subprocess_client, ledger)
        yield from _run_stage(context, res, inputs, inputs.get("previous"), name)

    return decorate(stage)


pretraining_checkpoint = _stage_asset("pretraining", None)
mid_training_checkpoint = _stage_asset("mid_training", "pretraining")
long_context_checkpoint = _stage_asset("long_context", "mid_training")


TRAINING_ASSETS = [training_tokens, pretraining_checkpoint, mid_training_checkpoint, long_context_checkpoint]
