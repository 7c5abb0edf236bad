"""Blocking checks: the faces of the decision gate and the plan's gates in the UI. The gates are
enforced again where side effects happen (the server before creating a run)."""

import dagster as dg

from ito_assets.defs.decision.assets import data_decision, training_plan
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.errors import ErrorCode
from ito_assets.defs.metadata_values import json_value
from ito_assets.training.decision import DecisionResult
from ito_assets.training.decision_gate import DataDecision, baseline_record, standing_gate
from ito_assets.training.run_plan import PlanOutcome

_REFUSED = "the plan was refused, so it has no cost to compare"


def _said(flag: bool | None) -> bool | str:
    return "unknown" if flag is None else flag


@dg.asset_check(asset=data_decision, blocking=True, partitions_def=manifests_partitions,
                description="A GO worth the full run's cost, unless the manifest's reviewers accepted the outcome.")
def decision_is_go(data_decision: DataDecision) -> dg.AssetCheckResult:
    gate = standing_gate(data_decision)  # the verdict drawn again from its runs, not taken as stored
    baseline = baseline_record(data_decision.decision) if isinstance(data_decision.decision, DecisionResult) else {}
    return dg.AssetCheckResult(
        passed=gate.passed,
        metadata={"verdict": gate.verdict.value, "outcome": gate.outcome,
                  "accepted_by_manifest": gate.accepted_by_manifest,
                  "error_code": gate.error_code.value if gate.error_code else "",
                  "baseline_sha256": baseline.get("sha256", ""), "baseline_sources": json_value(baseline.get("sources", [])),
                  "baseline_bound_by_manifest": _said(baseline.get("bound_by_manifest"))},
        description=gate.reason,
    )


@dg.asset_check(asset=data_decision, partitions_def=manifests_partitions,
                description="The baseline the candidate was measured against is the one the manifest's reviewers "
                "bound (decision_baseline); a warning where the run config named it.")
def decision_baseline_bound(data_decision: DataDecision) -> dg.AssetCheckResult:
    result = data_decision.decision
    bound = result.baseline_bound if isinstance(result, DecisionResult) else None
    return dg.AssetCheckResult(
        passed=bound is True, severity=dg.AssetCheckSeverity.WARN,
        metadata={"bound_by_manifest": _said(bound)},
        description=("the manifest binds the baseline" if bound else
                     "the manifest binds no decision_baseline: the verdict compares the candidate with files the "
                     "run config named, which no reviewer bound" if bound is False else
                     "a decision recorded before baselines were bound: materialize decision_run again to know"),
    )


@dg.asset_check(asset=training_plan, blocking=True, partitions_def=manifests_partitions,
                description="The planner found a layout that is neither impossible nor wasteful.")
def plan_not_refused(training_plan: PlanOutcome) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=not training_plan.refused,
        metadata={"error_code": ErrorCode.PLAN_REFUSED.value if training_plan.refused else "",
                  "reasons": ", ".join(training_plan.refusal_reasons)},
        description=training_plan.refusal_message,
    )


@dg.asset_check(asset=training_plan, blocking=True, partitions_def=manifests_partitions,
                description="The projected cost is within the manifest's budget cap.")
def plan_within_budget_cap(training_plan: PlanOutcome) -> dg.AssetCheckResult:
    if training_plan.run_plan is None:
        return dg.AssetCheckResult(passed=False, description=_REFUSED)
    budget = training_plan.run_plan.budget
    return dg.AssetCheckResult(passed=budget.within_cap, metadata={"cost_cents": budget.cost_cents, "cap_cents": budget.cap_cents,
                               "error_code": "" if budget.within_cap else ErrorCode.BUDGET_EXCEEDED.value})


@dg.asset_check(asset=training_plan, blocking=True, partitions_def=manifests_partitions,
                description="The projected cost is within the manifest's maximum incremental cost.")
def plan_within_max_incremental(training_plan: PlanOutcome) -> dg.AssetCheckResult:
    if training_plan.run_plan is None:
        return dg.AssetCheckResult(passed=False, description=_REFUSED)
    budget = training_plan.run_plan.budget
    ok = budget.within_max_incremental
    return dg.AssetCheckResult(passed=ok, metadata={"cost_cents": budget.cost_cents, "max_incremental_cents": budget.max_incremental_cents,
                               "error_code": "" if ok else ErrorCode.BUDGET_EXCEEDED.value})


DECISION_CHECKS = [decision_is_go, decision_baseline_bound, plan_not_refused, plan_within_budget_cap, plan_within_max_incremental]
