"""Blocking checks: each post-training stage's eval gate (the verdict its asset recorded). A
failed gate stops the rest of the run here; the next stage's asset refuses it again on retry."""

import dagster as dg

from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.posttraining.assets import dpo_checkpoint, rlvr_checkpoint, sft_checkpoint
from ito_assets.errors import ErrorCode
from ito_assets.posttraining.eval_gate import BATTERY
from ito_assets.posttraining.stage import StageOutcome


def _gate_check(kind: str, asset):
    rule = BATTERY[kind].rule.value

    @dg.asset_check(
        name=f"{kind}_eval_gate",
        asset=asset,
        blocking=True,
        partitions_def=manifests_partitions,
        description=f"Post-training battery, rule '{rule}': held-out verifiable reward after {kind} against "
        "before it, paired per prompt, beyond the 95% noise band; EVAL_GATE_FAILED stops the chain.",
    )
    def gate(**checkpoint) -> dg.AssetCheckResult:
        (outcome,) = checkpoint.values()
        if not isinstance(outcome, StageOutcome) or outcome.stage != kind:
            return dg.AssetCheckResult(passed=True, description=f"the recipe has no {kind} step")
        verdict = outcome.gate
        return dg.AssetCheckResult(
            passed=verdict.passed,
            severity=dg.AssetCheckSeverity.ERROR,
            description=("" if verdict.passed else f"{ErrorCode.EVAL_GATE_FAILED.value}: ") + verdict.reason,
            metadata={"error_code": "" if verdict.passed else ErrorCode.EVAL_GATE_FAILED.value, "rule": verdict.rule,
                      **{name: round(getattr(verdict, name), 4)
                         for name in ("reward_before", "reward_after", "delta", "standard_error")}},
        )

    return gate


POSTTRAINING_CHECKS = [_gate_check(kind, asset) for kind, asset in
                       (("sft", sft_checkpoint), ("dpo", dpo_checkpoint), ("rlvr", rlvr_checkpoint))]
