"""The economics of a data decision: what the decision job costs, what the full run it gates
costs, and whether the projected benefit clears the thresholds.

The decision job is priced as if run on the booked hardware: its total tokens (every arm and seed)
planned with the same planner and the booking's price. The full run is the manifest's plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from ito_assets.training.decision import DecisionConfig, DecisionResult
from ito_assets.training.verdict import Verdict
from ito_assets.training.model_config import config_by_name
from ito_assets.training.planner import Hardware, PlanRequest, default_global_batch_sequences, plan
from ito_assets.training.run_plan import RunPlan


def _require(condition: bool, name: str, rule: str) -> None:
    if not condition:
        raise ValueError(f"{name} {rule}")


@dataclass(frozen=True, kw_only=True)
class EconomicsConfig:
    # DataDecide (Magnusson et al. 2025): 150M proxies at < 2% of a 1B target's compute decide
    # ~80% of pairwise comparisons correctly; a decision job dearer than that is not a pre-check.
    max_decision_cost_fraction: float = 0.02
    # Relative improvement of the primary metric (bits per byte) the full run must promise, on top
    # of clearing the noise band: 0 by default (any improvement beyond noise); raise it to demand more.
    min_relative_improvement: float = 0.0

    def __post_init__(self) -> None:
        _require(0 < self.max_decision_cost_fraction <= 1, "max_decision_cost_fraction", "must be in (0, 1]")
        _require(0 <= self.min_relative_improvement < 1, "min_relative_improvement", "must be in [0, 1)")


@dataclass(frozen=True, kw_only=True)
class Economics:
    decision_num_tokens: int
    decision_cost_cents: int
    full_run_cost_cents: int
    decision_cost_fraction: float
    relative_improvement: float
    within_budget_cap: bool
    within_max_incremental: bool
    benefit_clears_thresholds: bool
    reasons: tuple[str, ...]  # why the benefit does not clear, empty when it does

    def to_dict(self) -> dict:
        return {**vars(self), "reasons": list(self.reasons)}


def decision_job_cost_cents(config: DecisionConfig, num_runs: int, hardware: Hardware) -> tuple[int, int]:
    """(tokens, cents) of the decision job's proxy training on `hardware`, by the planner."""
    model = config_by_name(config.model_name, vocab_size=config.tokenizer.vocab_size)
    tokens = num_runs * config.num_tokens_per_run
    request = PlanRequest(
        model=model, sequence_length=config.sequence_length, num_training_tokens=tokens, hardware=hardware,
        global_batch_sequences=default_global_batch_sequences(model, config.sequence_length, hardware.world_size),
    )
    return tokens, plan(request).cost_cents


def _shortfalls(result: DecisionResult, run_plan: RunPlan, fraction: float, improvement: float, config: EconomicsConfig) -> tuple[str, ...]:
    reasons = []
    if result.verdict is not Verdict.GO:
        reasons.append(f"the decision is {result.verdict.value}, not GO")
    if improvement < config.min_relative_improvement:
        reasons.append(f"relative improvement {improvement:.2%} is below {config.min_relative_improvement:.2%}")
    if fraction > config.max_decision_cost_fraction:
        reasons.append(f"the decision job costs {fraction:.2%} of the full run, above {config.max_decision_cost_fraction:.0%}")
    if not run_plan.budget.within_cap:
        reasons.append("the full run's projected cost exceeds the budget cap")
    if not run_plan.budget.within_max_incremental:
        reasons.append("the full run's projected cost exceeds the maximum incremental cost")
    return tuple(reasons)


def decision_economics(result: DecisionResult, run_plan: RunPlan, config: EconomicsConfig) -> Economics:
    tokens, decision_cents = decision_job_cost_cents(result.config, len(result.runs), run_plan.hardware)
    full = run_plan.cost_cents
    fraction = decision_cents / full if full > 0 else float("inf")
    improvement = result.difference / result.baseline.mean if result.baseline.mean > 0 else 0.0
    reasons = _shortfalls(result, run_plan, fraction, improvement, config)
    return Economics(
        decision_num_tokens=tokens, decision_cost_cents=decision_cents, full_run_cost_cents=full,
        decision_cost_fraction=fraction, relative_improvement=improvement,
        within_budget_cap=run_plan.budget.within_cap, within_max_incremental=run_plan.budget.within_max_incremental,
        benefit_clears_thresholds=not reasons, reasons=reasons,
    )
