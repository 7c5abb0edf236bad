"""The economics of a data decision: what the decision job costs, what the full run it gates
costs, and whether the gain is worth that cost.

The decision job is priced as if run on the booked hardware: its total tokens (every arm and seed)
planned with the same planner and the booking's price. The full run is the manifest's plan of its
curriculum stages at the planner's compute cost (the pretraining data this decision is about;
post-training is left out, its pair files not read in preparation): the decision is taken before
any booking, so it judges what the run's own steps cost; a confirmation later charges the whole
booked block, which is at least that.

Worth it binds (a GO that is not is NOT_WORTH_IT, `decision_gate`): the relative improvement must
reach `min_relative_improvement`, and the full run's cost per percentage point of improvement must
not exceed the manifest's `decision_economics.max_cost_cents_per_improvement_point`. What the
decision job itself cost is a note, never a reason: it is spent by the time the verdict is known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from ito_assets.training.decision import DecisionResult
from ito_assets.training.decision_config import DecisionConfig
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
    # Relative improvement of the primary metric (bits per byte) a GO must show, on top of clearing
    # the noise band: 0 by default (any improvement beyond noise); raise it to demand more.
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
    cost_cents_per_improvement_point: float | None  # None: no improvement to pay for
    max_cost_cents_per_improvement_point: int | None  # the manifest's threshold, None when it sets none
    within_budget_cap: bool
    within_max_incremental: bool
    worth_it: bool
    reasons: tuple[str, ...]  # why the gain is not worth the cost; empty when it is
    notes: tuple[str, ...]  # what a desk should know that decides nothing

    def to_dict(self) -> dict:
        return {**vars(self), "reasons": list(self.reasons), "notes": list(self.notes)}


def decision_job_cost_cents(config: DecisionConfig, num_runs: int, hardware: Hardware) -> tuple[int, int]:
    """(tokens, cents) of the decision job's proxy training on `hardware`, by the planner."""
    model = config_by_name(config.model_name, vocab_size=config.tokenizer.vocab_size)
    tokens = num_runs * config.num_tokens_per_run
    request = PlanRequest(
        model=model, sequence_length=config.sequence_length, num_training_tokens=tokens, hardware=hardware,
        global_batch_sequences=default_global_batch_sequences(model, config.sequence_length, hardware.world_size),
    )
    return tokens, plan(request).cost_cents


def cost_per_point(full_run_cost_cents: int, relative_improvement: float) -> float | None:
    """Cents of the full run per percentage point of relative improvement; None without improvement."""
    return full_run_cost_cents / (relative_improvement * 100) if relative_improvement > 0 else None


def _above(full_run_cost_cents: int, relative_improvement: float, max_cents_per_point: int) -> bool:
    """cost / (improvement x 100) > the limit, decided exactly: in floats the quotient rounds, and
    one ulp either side of the limit was decided the wrong way (5,109 of 1.4 million cases)."""
    if not math.isfinite(relative_improvement):
        return False  # an infinite improvement costs nothing per point
    return Fraction(full_run_cost_cents) > max_cents_per_point * Fraction(relative_improvement) * 100


def not_worth_it(relative_improvement: float, full_run_cost_cents: int, config: EconomicsConfig,
                 max_cents_per_point: int | None) -> tuple[str, ...]:
    """Why the gain does not pay for the full run; empty when it does. At the threshold is worth it."""
    reasons = []
    # Written so that an improvement that is not a number (NaN) fails the minimum rather than passes it.
    if not relative_improvement >= config.min_relative_improvement:
        reasons.append(f"relative improvement {relative_improvement:.2%} is below {config.min_relative_improvement:.2%}")
    if max_cents_per_point is not None:
        per_point = cost_per_point(full_run_cost_cents, relative_improvement)
        if per_point is None:
            reasons.append("no improvement to pay for the full run")
        elif _above(full_run_cost_cents, relative_improvement, max_cents_per_point):
            shown, limit = f"{per_point / 100:,.2f}", f"{max_cents_per_point / 100:,.2f}"
            reasons.append(f"the full run costs {shown} USD per point of improvement, above the manifest's "
                           f"{limit}{' by less than a cent' if shown == limit else ''}")
    return tuple(reasons)


def _notes(fraction: float, run_plan: RunPlan, config: EconomicsConfig) -> tuple[str, ...]:
    notes = []
    if fraction > config.max_decision_cost_fraction:
        notes.append(f"the decision job cost {fraction:.2%} of the full run, above the {config.max_decision_cost_fraction:.0%} "
                     "a pre-check should (DataDecide)")
    if not run_plan.budget.within_cap:
        notes.append("the full run's projected cost exceeds the budget cap (the plan's gate refuses it)")
    if not run_plan.budget.within_max_incremental:
        notes.append("the full run's projected cost exceeds the maximum incremental cost (the plan's gate refuses it)")
    return tuple(notes)


def decision_economics(result: DecisionResult, run_plan: RunPlan, config: EconomicsConfig,
                       max_cents_per_point: int | None = None) -> Economics:
    tokens, decision_cents = decision_job_cost_cents(result.config, len(result.runs), run_plan.hardware)
    full = run_plan.curriculum_cost_cents
    fraction = decision_cents / full if full > 0 else float("inf")
    improvement = result.difference / result.baseline.mean if result.baseline.mean > 0 else 0.0
    reasons = not_worth_it(improvement, full, config, max_cents_per_point)
    return Economics(
        decision_num_tokens=tokens, decision_cost_cents=decision_cents, full_run_cost_cents=full,
        decision_cost_fraction=fraction, relative_improvement=improvement,
        cost_cents_per_improvement_point=cost_per_point(full, improvement),
        max_cost_cents_per_improvement_point=max_cents_per_point,
        within_budget_cap=run_plan.budget.within_cap, within_max_incremental=run_plan.budget.within_max_incremental,
        worth_it=not reasons, reasons=reasons, notes=_notes(fraction, run_plan, config),
    )
