"""The post-training recipe as assets, in the manifest's order: sft_checkpoint -> dpo_checkpoint
-> rlvr_checkpoint. The first starts from the pretraining chain's result: the final checkpoint of
`long_context_checkpoint` (torch.distributed.checkpoint) with the run's byte-level BPE from
`training_tokens`; each later one from the stage before. Each trains, evaluates the held-out
battery, publishes its figures to the ledger (`ito metrics`, `ito checkpoints`), and hands on its
checkpoint, metrics and gate verdict. Each stage's steps run on the stage worker under the
supervisor, as the pretraining stages' do (one rank, through Pipes; RLVR's generator beside it).
A stage the recipe leaves out carries forward what it was given. The gate is enforced here, before the first step: after a failed gate the next stage
refuses to train (EVAL_GATE_FAILED), whatever is retried.
"""

import dataclasses
import json

import dagster as dg

from ito_assets import charts
from ito_assets.defs.metadata_values import chart, json_value, table
from ito_assets.defs.failures import failure, verified_or_fail
from ito_assets.defs import owners
from ito_assets.defs.manifest.partitions import TRAINED_ONE_OF_TWO, manifests_partitions
from ito_assets.defs.posttraining.resources import PostTrainingResource
from ito_assets.defs.training.launcher import TrainingLauncherResource
from ito_assets.defs.training.resources import TrainingRuntimeResource
from ito_assets.defs.resources import ItoSettingsResource, LedgerResource
from ito_assets.defs.telemetry.assets import publish_after_stage
from ito_assets.runtime.stage.run import StageCheckpoint
from ito_assets.runtime.stage.curriculum import positions
from ito_assets.defs.workload.live import LiveRun, mark_training_started, require_live_authorization
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.discovery import ManifestVerdict
from ito_assets.manifest.schema import STAGE_ORDER, Manifest
from ito_assets.posttraining.base import PolicySpec, pretrained
from ito_assets.posttraining.bpe import TokenizerRef
from ito_assets.posttraining.eval_gate import require_passed
from ito_assets.posttraining.plan import data_parallel_ranks
from ito_assets.posttraining.publish import publish_outcome
from ito_assets.posttraining.stage import Start, StageOutcome
from ito_assets.runtime.stage.corpus import TokenSet
from ito_assets.runtime.stage.eval_gate import VerdictStore
from ito_assets.runtime.record.storage import RunLayout

GROUP = "posttraining"


def _recipe_step(manifest: Manifest, kind: str):
    return next((s for s in manifest.post_training if s.kind == kind), None)


CURVES = {"loss_curve": "loss", "accuracy_curve": "accuracy", "reward_curve": "reward", "kl_curve": "KL"}


def _curve_metadata(kind: str, metrics: dict) -> dict:
    """The stage's curves by optimizer step in one chart, and each curve's last value as a number (so
    the Plots view follows it across partitions); no chart when the stage recorded no curve."""
    curves = {label: metrics[name] for name, label in CURVES.items() if name in metrics}
    if not curves:
        return {}
    final = {f"final_{name.removesuffix('_curve')}": round(float(metrics[name][-1]), 4)
             for name in CURVES if metrics.get(name)}
    return {"curves_chart": chart(f"{kind} curves", charts.curves_chart(f"{kind}: by optimizer step", curves)), **final}


GATE_COLUMNS = [("rule", "string"), ("reward_before", "number"), ("reward_after", "number"), ("delta", "number"),
                ("standard_error", "number"), ("min_gain", "number"), ("passed", "bool"), ("reason", "string")]
STALENESS_COLUMNS = [("staleness (versions)", "int"), ("groups used", "int"), ("groups dropped", "int")]


def staleness_table(report: dict) -> dg.TableMetadataValue:
    """A row per staleness seen: the groups used and dropped (`staleness.StalenessReport.as_dict`)."""
    seen = sorted({*report["admitted_by_staleness"], *report["dropped_by_staleness"]}, key=int)
    return table(STALENESS_COLUMNS, [{"staleness (versions)": int(k), "groups used": report["admitted_by_staleness"].get(k, 0),
                                      "groups dropped": report["dropped_by_staleness"].get(k, 0)} for k in seen])


def start_metadata(outcome: StageOutcome) -> dict:
    """The checkpoint the stage loaded and the chain's first weights, each with its digest: a
    stage's `policy.init_checkpoint` is the chain's start, never what this stage loaded."""
    metadata = {}
    for name, ref in (("started_from", outcome.started_from), ("chain_start", outcome.chain_start)):
        if ref is not None:  # the Dagster stages always start from a checkpoint
            metadata[name] = dg.MetadataValue.path(ref.path)
            metadata[f"{name}_sha256"] = ref.sha256
    return metadata


def outcome_metadata(outcome: StageOutcome, step) -> dict:
    metrics = outcome.metrics
    metadata = {
        "recipe_step": json_value(step.model_dump()),
        "policy": json_value(outcome.policy.as_dict()),
        "checkpoint": dg.MetadataValue.path(outcome.checkpoint.path),
        "checkpoint_sha256": outcome.checkpoint.sha256,
        **start_metadata(outcome),
        "num_optimizer_steps": outcome.checkpoint.policy_version,
        "gate_passed": outcome.gate.passed,
        "gate": table(GATE_COLUMNS, [outcome.gate.as_dict()]),
        # rewards are means over the manifest's post_training_eval.num_prompts (200 by default) x 8
        # samples: 4 decimals is below their standard error
        "heldout_reward_before": round(outcome.eval_before.mean_reward, 4),
        "heldout_reward_after": round(outcome.eval_after.mean_reward, 4),
        "heldout_greedy_accuracy": round(outcome.eval_after.greedy_accuracy, 4),
        "kl_to_reference": round(metrics["kl_to_reference"], 4),
        "train_s": round(metrics["train_seconds"], 1),
    }
    if "evaluation_calibration" in metrics:  # absent from outcomes stored before it was recorded
        figures = metrics["evaluation_calibration"]
        metadata.update({"evaluation_planned_s": figures["planned_s"], "evaluation_cpu_s": figures["measured_cpu_s"],
                         "evaluation_cpu_over_planned": figures["ratio"]})
    if "generation_calibration" in metrics:  # RLVR's, once recorded
        figures = metrics["generation_calibration"]
        metadata.update({"groups_planned": figures["planned_groups"], "groups_drawn": figures["drawn_groups"],
                         "groups_drawn_over_planned": figures["ratio"]})
    metadata.update(_curve_metadata(outcome.stage, metrics))
    if "staleness" in metrics:
        metadata["staleness_histogram"] = staleness_table(metrics["staleness"])
        metadata["num_dropped_stale"] = metrics["staleness"]["num_dropped_stale"]
        metadata["num_dropped_all_equal"] = metrics["num_dropped_all_equal"]
        metadata["num_weight_syncs"] = metrics["num_weight_syncs"]
    return metadata


@dataclasses.dataclass(frozen=True)
class _Worker:
    """Where a post-training stage's steps run: on the stage worker, under the supervisor, on the
    ranks the training launcher gives a stage of the run's booking (`data_parallel_ranks` says how
    many of them a stage takes), its command run through Pipes as the pretraining stages' are."""

    training_runtime: TrainingRuntimeResource
    training_launcher: TrainingLauncherResource
    pipes: dg.PipesSubprocessClient

    def ranks(self, context, live: LiveRun, kind: str, batch_size: int) -> tuple[int, int]:
        """(nodes, ranks per node) for this stage, logged with the reason where it takes fewer."""
        import torch  # the stage needs it anyway; not at code-location load

        outcome = live.booked_plan(None)  # its hardware only
        try:
            nnodes, nproc = ((1, 1) if outcome.run_plan is None else
                             self.training_launcher.counts(outcome.run_plan.hardware, has_cuda=torch.cuda.is_available()))
        except ValueError as error:
            raise dg.Failure(description=f"training_launcher: {error}") from None
        nnodes, nproc, fewer = data_parallel_ranks(kind, batch_size, nnodes, nproc)
        if fewer:
            context.log.info(f"the {kind} stage trains on {nnodes * nproc} rank(s): {fewer}")
        return nnodes, nproc

    def launch(self, context, run_id: str, ranks: tuple[int, int]):
        from ito_assets.posttraining.on_worker import WorkerLaunch  # needs torch

        nnodes, nproc = ranks
        try:  # the launcher's settings are checked before the supervisor starts
            supervisor = dataclasses.replace(self.training_runtime.supervisor(nnodes=nnodes, nproc_per_node=nproc),
                                             launch=self.training_launcher.launch_config(nproc))
        except ValueError as error:
            raise dg.Failure(description=f"training_launcher: {error}") from None
        return WorkerLaunch(run=lambda command: self.pipes.run(context=context, command=list(command)),
                            run_key=run_id, supervisor=supervisor)


def _stage(context, ito: ItoSettingsResource, posttraining: PostTrainingResource, ledger: LedgerResource,
           verdict: ManifestVerdict, authorization: dict, start: Start, kind: str, worker: _Worker | None = None):
    prepared = verified_or_fail(verdict, "post-training")
    if _recipe_step(prepared.manifest, kind) is None:
        context.log.info(f"the recipe has no {kind} step: what this stage was given carries forward")
        yield dg.Output(start, metadata={"in_recipe": False})
        return
    # The training needs torch: imported when a stage runs, not when the code location loads.
    from ito_assets.posttraining.pipeline import run_stage

    try:
        if isinstance(start, StageOutcome):  # a failed gate stays failed, whatever is retried
            require_passed(start.gate)
        # The gates are enforced here, where compute is spent, not only by the checks of this run:
        # the ledger still authorizes this very run, and no training stage's eval gate failed. The
        # recipe trained is the one in the ledger's confirmed bytes (the prepared one has its digest).
        live = require_live_authorization(context, ledger, authorization, "post-training",
                                          prepared=prepared)
        run_id, checkpoint_dir = live.run_id, live.checkpoint_dir
        step = _recipe_step(live.manifest.manifest, kind)
        evaluation = live.manifest.manifest.post_training_eval  # the held-out battery's sizes, as confirmed
        layout = RunLayout.for_run(checkpoint_dir, run_id)
        _require_this_runs(start, layout)
        VerdictStore(layout.run_dir).ensure_not_failed(STAGE_ORDER)
        runtime = posttraining.runtime()
        # RLVR has no batch of pairs: it trains on one rank whatever the batch (`data_parallel_ranks`).
        ranks = None if worker is None else worker.ranks(context, live, kind, getattr(step, "batch_size", 1))
        mark_training_started(ledger, run_id)
        try:
            outcome = run_stage(step, start=start, data_root=ito.settings().data_root, out_dir=layout.posttraining_dir,
                                runtime=runtime, launch=None if worker is None else worker.launch(context, run_id, ranks),
                                evaluation=evaluation)
            with ledger.open() as opened:
                num_checkpoints, num_metrics = publish_outcome(opened, run_id, outcome)
        finally:
            publish_after_stage(context, ledger, run_id, layout)
    except ItoError as error:
        raise failure(error) from None
    context.log.info(json.dumps({"stage": kind, "gate": outcome.gate.as_dict()}))
    yield dg.Output(outcome, metadata={"in_recipe": True, "num_ranks": 1 if ranks is None else ranks[0] * ranks[1],
                                       "num_metrics_published": num_metrics,
                                       "num_checkpoints_published": num_checkpoints,
                                       "trained_manifest_digest": live.manifest.digest, **outcome_metadata(outcome, step)})


def _require_this_runs(start: Start, layout: RunLayout) -> None:
    """The checkpoint this stage starts from lies in this run's folder (`RunLayout.holds`): the
    previous post-training stage's, or for the first stage the pretraining chain's final one."""
    handed = start.checkpoint.path if isinstance(start, StageOutcome) else start.init_checkpoint
    if handed is not None and not layout.holds(handed):
        raise ItoError(ErrorCode.CHECKPOINT_STORAGE_INVALID,
                       "the checkpoint this stage was handed is not in this run's folder (another run of the "
                       "manifest wrote the previous stage's output since): materialize the previous stage again "
                       "for this run")


def _base_policy(verdict: ManifestVerdict, final: StageCheckpoint | None, tokens: TokenSet,
                 posttraining: PostTrainingResource) -> PolicySpec:
    """The pretraining chain's result as the first stage's start: the model the manifest names,
    sized to the run's tokenizer, with the last trained stage's final checkpoint (carried forward
    through stages the manifest leaves out) as its weights."""
    if final is None:  # every manifest has a stage, and a stage always hands on a checkpoint
        raise failure(ItoError(ErrorCode.INTERNAL_ERROR, "the pretraining chain left no checkpoint"))
    manifest = verified_or_fail(verdict, "post-training").manifest
    # The positions the final checkpoint was trained with, the chain's last stage's: a long-context
    # stage's raised RoPE base stays for every stage after it.
    target = manifest.training_target
    trained_with = positions(target, target.stages[-1].name)
    return pretrained(model_name=manifest.model.size, vocab_size=tokens.vocab_size, checkpoint=final.final_checkpoint,
                      tokenizer=TokenizerRef(path=tokens.tokenizer_path, sha256=tokens.tokenizer_sha256),
                      seed=posttraining.seed, **trained_with)


_INS = {"training_manifest": dg.AssetIn("training_manifest"), "run_authorization": dg.AssetIn("run_authorization")}
# The pretraining chain's result: the last stage's checkpoint (carried forward when the manifest
# has no long-context stage) and the tokenizer it was trained with.
_BASE_INS = {"long_context_checkpoint": dg.AssetIn("long_context_checkpoint"),
             "training_tokens": dg.AssetIn("training_tokens")}


def _spec(kind: str, upstream: str | None) -> dict:
    ins = dict(_INS, **({"previous": dg.AssetIn(upstream)} if upstream else _BASE_INS))
    start = f"`{upstream}`" if upstream else "the final checkpoint of `long_context_checkpoint` (and `training_tokens`' tokenizer)"
    return dict(
        name=f"{kind}_checkpoint", group_name=GROUP, owners=[owners.TRAINING], kinds={"pytorch"}, partitions_def=manifests_partitions, ins=ins,
        description=f"The post-training {kind} stage trained from {start} with the manifest's {kind} recipe step; "
        "its checkpoint, held-out verifiable reward, KL to its reference, and eval-gate verdict; "
        "`started_from` names the checkpoint it actually started from, `chain_start` the chain's first "
        "weights." + TRAINED_ONE_OF_TWO,
    )


@dg.asset(**_spec("sft", None))
def sft_checkpoint(context: dg.AssetExecutionContext, ito: ItoSettingsResource, posttraining: PostTrainingResource,
                   ledger: LedgerResource, training_runtime: TrainingRuntimeResource,
                   training_launcher: TrainingLauncherResource, pipes_subprocess_client: dg.PipesSubprocessClient,
                   training_manifest: ManifestVerdict, run_authorization: dict,
                   long_context_checkpoint: StageCheckpoint | None, training_tokens: TokenSet):
    start = _base_policy(training_manifest, long_context_checkpoint, training_tokens, posttraining)
    worker = _Worker(training_runtime, training_launcher, pipes_subprocess_client)
    yield from _stage(context, ito, posttraining, ledger, training_manifest, run_authorization, start, "sft", worker)


@dg.asset(**_spec("dpo", "sft_checkpoint"))
def dpo_checkpoint(context: dg.AssetExecutionContext, ito: ItoSettingsResource, posttraining: PostTrainingResource,
                   ledger: LedgerResource, training_runtime: TrainingRuntimeResource,
                   training_launcher: TrainingLauncherResource, pipes_subprocess_client: dg.PipesSubprocessClient,
                   training_manifest: ManifestVerdict, run_authorization: dict, previous):
    worker = _Worker(training_runtime, training_launcher, pipes_subprocess_client)
    yield from _stage(context, ito, posttraining, ledger, training_manifest, run_authorization, previous, "dpo", worker)


@dg.asset(**_spec("rlvr", "dpo_checkpoint"))
def rlvr_checkpoint(context: dg.AssetExecutionContext, ito: ItoSettingsResource, posttraining: PostTrainingResource,
                    ledger: LedgerResource, training_runtime: TrainingRuntimeResource,
                    training_launcher: TrainingLauncherResource, pipes_subprocess_client: dg.PipesSubprocessClient,
                    training_manifest: ManifestVerdict, run_authorization: dict, previous):
    worker = _Worker(training_runtime, training_launcher, pipes_subprocess_client)
    yield from _stage(context, ito, posttraining, ledger, training_manifest, run_authorization, previous, "rlvr", worker)


POSTTRAINING_ASSETS = [sft_checkpoint, dpo_checkpoint, rlvr_checkpoint]
