"""Each post-training stage's checks. Blocking: its eval gate (the verdict its asset recorded); a
failed gate stops the rest of the run here, and the next stage's asset refuses it again on retry.
Warnings: its evaluations' time against the plan's (`plan.evaluation_calibration`), and RLVR's
groups drawn against the ones priced (`plan.generation_calibration`)."""

import dagster as dg

from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.posttraining.assets import dpo_checkpoint, rlvr_checkpoint, sft_checkpoint
from ito_assets.errors import ErrorCode
from ito_assets.posttraining.eval_gate import BATTERY
from ito_assets.posttraining.stage import StageOutcome
from ito_assets.runtime.stage.calibration import FLAG_FRACTION


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


def _evaluation_calibration_check(kind: str, asset):
    @dg.asset_check(
        name=f"{kind}_evaluation_calibration",
        asset=asset,
        partitions_def=manifests_partitions,
        description=f"A warning, never blocking: the {kind} stage's evaluations took more than "
        f"{FLAG_FRACTION:.0%} more CPU time than the plan priced on one core of its nominal host, so the window and "
        "cost the confirmation bound were short and the price model needs correcting.",
    )
    def calibration(**checkpoint) -> dg.AssetCheckResult:
        (outcome,) = checkpoint.values()
        return evaluation_calibration_result(kind, outcome)

    return calibration


def evaluation_calibration_result(kind: str, outcome) -> dg.AssetCheckResult:
    """The warning's verdict on what the stage's asset handed on (an outcome of another stage, or
    one stored before its evaluations were timed, has nothing to judge)."""
    figures = _recorded(outcome, kind, "evaluation_calibration")
    if not figures:
        return dg.AssetCheckResult(passed=True, description=f"no {kind} evaluation was timed (or no such step)")
    return _warning(figures, figures["underpriced"], ("planned_s", "measured_cpu_s", "measured_wall_s", "ratio"),
                    f"{figures['measured_cpu_s']:.4g} CPU seconds of evaluation against {figures['planned_s']:.4g} s "
                    f"planned (ratio {figures['ratio']}; {figures['measured_wall_s']:.4g} s of wall time)")


def _recorded(outcome, kind: str, name: str) -> dict | None:
    """The stage's figures `name`, where the outcome is that stage's and recorded them."""
    ran = isinstance(outcome, StageOutcome) and outcome.stage == kind
    return outcome.metrics.get(name) if ran else None


def _warning(figures: dict, flagged: bool, names: tuple[str, ...], description: str) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=not flagged, severity=dg.AssetCheckSeverity.WARN, description=description,
                               metadata={name: figures[name] for name in names})


@dg.asset_check(
    name="rlvr_generation_calibration",
    asset=rlvr_checkpoint,
    partitions_def=manifests_partitions,
    description="A warning, never blocking: the RLVR stage drew more groups than the plan priced (its draw bound: "
    "steps x groups per step x max_draws_per_group, which an attempt never passes; a restarted attempt draws its "
    "steps again), so its generation may have run past the window and cost the confirmation bound.",
)
def rlvr_generation_calibration(**checkpoint) -> dg.AssetCheckResult:
    (outcome,) = checkpoint.values()
    return generation_calibration_result(outcome)


def generation_calibration_result(outcome) -> dg.AssetCheckResult:
    """The warning's verdict on what RLVR's asset handed on (another stage's outcome, or one stored
    before its groups were counted, has nothing to judge)."""
    figures = _recorded(outcome, "rlvr", "generation_calibration")
    if not figures:
        return dg.AssetCheckResult(passed=True, description="no RLVR groups were counted (or no such step)")
    return _warning(figures, figures["overdrawn"], ("planned_groups", "drawn_groups", "ratio"),
                    f"{figures['drawn_groups']:,} groups drawn against {figures['planned_groups']:,} priced "
                    f"(ratio {figures['ratio']}; each priced at its longest completions)")


_STAGES = (("sft", sft_checkpoint), ("dpo", dpo_checkpoint), ("rlvr", rlvr_checkpoint))
POSTTRAINING_CHECKS = ([_gate_check(kind, asset) for kind, asset in _STAGES]
                       + [_evaluation_calibration_check(kind, asset) for kind, asset in _STAGES]
                       + [rlvr_generation_calibration])
