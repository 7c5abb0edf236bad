"""The post-training recipe as assets, in the manifest's order: sft_checkpoint -> dpo_checkpoint
-> rlvr_checkpoint. Each trains from the one before (the first from the base policy), evaluates
the held-out battery, and hands on its checkpoint, metrics and gate verdict. A stage the recipe
leaves out carries the previous outcome forward. The gate is enforced here, before the first step:
after a failed gate the next stage refuses to train (EVAL_GATE_FAILED), whatever is retried.
"""

import json

import dagster as dg

from ito_assets.defs.failures import verified_or_fail
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.posttraining.resources import PostTrainingResource
from ito_assets.defs.resources import ItoSettingsResource, LedgerResource
from ito_assets.defs.workload.live import require_live_authorization
from ito_assets.errors import ItoError
from ito_assets.manifest.schema import STAGE_ORDER
from ito_assets.posttraining.gates import require_passed
from ito_assets.runtime.gates import VerdictStore
from ito_assets.runtime.stages import RunLayout
from ito_assets.manifest.discovery import ManifestVerdict
from ito_assets.posttraining.pipeline import StageOutcome, run_stage

GROUP = "posttraining"


def _recipe_step(verdict: ManifestVerdict, kind: str):
    manifest = verified_or_fail(verdict, "post-training").manifest
    return next((s for s in manifest.post_training if s.kind == kind), None)


def _series(values: list[float], num_rows: int = 12) -> str:
    """A markdown table of a curve, thinned to about `num_rows` rows (first and last kept)."""
    picked = sorted(set(range(0, len(values), max(1, len(values) // num_rows))) | {len(values) - 1})
    rows = "\n".join(f"| {i} | {values[i]:.4f} |" for i in picked if values)
    return f"| step | value |\n|---|---|\n{rows}"


def outcome_metadata(outcome: StageOutcome, step) -> dict:
    metrics = outcome.metrics
    metadata = {
        "recipe_step": dg.MetadataValue.json(step.model_dump()),
        "checkpoint": dg.MetadataValue.path(outcome.checkpoint.path),
        "checkpoint_sha256": outcome.checkpoint.sha256,
        "num_optimizer_steps": outcome.checkpoint.policy_version,
        "gate_passed": outcome.gate.passed,
        "gate": dg.MetadataValue.json(outcome.gate.as_dict()),
        "heldout_reward_before": outcome.eval_before.mean_reward,
        "heldout_reward_after": outcome.eval_after.mean_reward,
        "heldout_greedy_accuracy": outcome.eval_after.greedy_accuracy,
        "kl_to_reference": metrics["kl_to_reference"],
        "train_seconds": metrics["train_seconds"],
    }
    for name in ("loss_curve", "accuracy_curve", "reward_curve", "kl_curve"):
        if name in metrics:
            metadata[name] = dg.MetadataValue.md(_series(metrics[name]))
    if "staleness" in metrics:
        metadata["staleness_histogram"] = dg.MetadataValue.json(metrics["staleness"])
        metadata["num_dropped_stale"] = metrics["staleness"]["num_dropped_stale"]
        metadata["num_dropped_all_equal"] = metrics["num_dropped_all_equal"]
        metadata["num_weight_syncs"] = metrics["num_weight_syncs"]
    return metadata


def _stage(context, ito: ItoSettingsResource, posttraining: PostTrainingResource, ledger: LedgerResource,
           verdict: ManifestVerdict, authorization: dict, previous: StageOutcome | None, kind: str):
    step = _recipe_step(verdict, kind)
    if step is None:
        context.log.info(f"the recipe has no {kind} step: the previous outcome carries forward")
        yield dg.Output(previous, metadata={"in_recipe": False})
        return
    settings = ito.settings()
    try:
        if previous is not None:  # a failed gate stays failed, whatever is retried
            require_passed(previous.gate)
        # The gates are enforced here, where compute is spent, not only by the checks of this run:
        # the ledger still authorizes this very run, and no training stage's eval gate failed.
        run_id, checkpoint_dir = require_live_authorization(context, ledger, authorization, "post-training",
                                                            manifest_digest=verdict.digest)
        run_dir = RunLayout.for_run(checkpoint_dir, run_id).run_dir
        VerdictStore(run_dir).ensure_not_failed(STAGE_ORDER)
        outcome = run_stage(step, previous=previous, fixtures_dir=settings.data_root / "fixtures" / "posttraining",
                            out_dir=run_dir / "posttraining", runtime=posttraining.runtime())
    except ItoError as error:
        raise dg.Failure(description=error.message, metadata={"error_code": error.code.value}) from None
    context.log.info(json.dumps({"stage": kind, "gate": outcome.gate.as_dict()}))
    yield dg.Output(outcome, metadata={"in_recipe": True, **outcome_metadata(outcome, step)})


_INS = {"training_manifest": dg.AssetIn("training_manifest"), "run_authorization": dg.AssetIn("run_authorization")}


# The last pretraining-stage checkpoint (issue 6; carried forward when the manifest has no long-context
# stage): post-training starts only after its blocking gate passed. Ordering only, for now: the base
# policy is initialised from the seed (see PostTrainingRuntime) until its weights are loaded.
PRETRAINING_CHECKPOINT = dg.AssetKey("long_context_checkpoint")


def _spec(kind: str, upstream: str | None) -> dict:
    ins = dict(_INS, **({"previous": dg.AssetIn(upstream)} if upstream else {}))
    start = f"`{upstream}`" if upstream else "the base policy (after the pretraining stages' gates)"
    return dict(
        name=f"{kind}_checkpoint", group_name=GROUP, kinds={"pytorch"}, partitions_def=manifests_partitions, ins=ins,
        deps=[] if upstream else [PRETRAINING_CHECKPOINT],
        description=f"The post-training {kind} stage trained from {start} with the manifest's {kind} recipe step; "
        "its checkpoint, held-out verifiable reward, KL to its reference, and eval-gate verdict.",
    )


@dg.asset(**_spec("sft", None))
def sft_checkpoint(context: dg.AssetExecutionContext, ito: ItoSettingsResource, posttraining: PostTrainingResource,
                   ledger: LedgerResource, training_manifest: ManifestVerdict, run_authorization: dict):
    yield from _stage(context, ito, posttraining, ledger, training_manifest, run_authorization, None, "sft")


@dg.asset(**_spec("dpo", "sft_checkpoint"))
def dpo_checkpoint(context: dg.AssetExecutionContext, ito: ItoSettingsResource, posttraining: PostTrainingResource,
                   ledger: LedgerResource, training_manifest: ManifestVerdict, run_authorization: dict, previous):
    yield from _stage(context, ito, posttraining, ledger, training_manifest, run_authorization, previous, "dpo")


@dg.asset(**_spec("rlvr", "dpo_checkpoint"))
def rlvr_checkpoint(context: dg.AssetExecutionContext, ito: ItoSettingsResource, posttraining: PostTrainingResource,
                    ledger: LedgerResource, training_manifest: ManifestVerdict, run_authorization: dict, previous):
    yield from _stage(context, ito, posttraining, ledger, training_manifest, run_authorization, previous, "rlvr")


POSTTRAINING_ASSETS = [sft_checkpoint, dpo_checkpoint, rlvr_checkpoint]
