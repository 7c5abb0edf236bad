"""The data-decision gate: training proceeds on a GO worth its cost, or on an outcome the
manifest's reviewers accepted in writing.

The acceptance is the manifest's optional `data_decision` (schema.DataDecisionAcceptance):
`{"accepted_verdicts": ["NO_GO" | "WITHIN_NOISE" | "INCONCLUSIVE" | "NOT_WORTH_IT", ...],
"reason": str, "reviewed_by": str}`; without it every other outcome blocks: a NO_GO with
DATA_DECISION_NO_GO, the verdicts that did not tell with DATA_DECISION_INCONCLUSIVE, and a GO whose
gain does not pay for the full run (economics.not_worth_it) with DATA_DECISION_NOT_WORTH_IT. A GO
the planner could not price on the booked hardware (the plan was refused) is not shown worth it
either: training on another booking would otherwise skip the economics the manifest set.

The verdict is never taken as stored: where it passed, it is drawn again from the decision's
recorded runs by today's rules (`decision.restated`), and a verdict they would not give (one drawn
by an earlier, looser rule) blocks with DATA_DECISION_STALE until the decision is run again; so does
a decision measured against another baseline than the one the manifest binds (`decision_baseline`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterable

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import Manifest
from ito_assets.training.decision import DecisionResult, restated
from ito_assets.training.economics import Economics, EconomicsConfig, decision_economics
from ito_assets.training.layout import PlanRefused
from ito_assets.training.planner import Hardware
from ito_assets.training.run_plan import RunPlan, plan_run
from ito_assets.training.verdict import MIN_ITEMS_PER_BENCHMARK, Verdict


# The outcome a reviewer can accept for a GO whose gain does not pay for the full run.
NOT_WORTH_IT = "NOT_WORTH_IT"


@dataclass(frozen=True, kw_only=True)
class DecisionGateVerdict:
    passed: bool
    verdict: Verdict
    accepted_by_manifest: bool
    reason: str
    worth_it: bool = True  # False: a GO whose gain does not pay for the full run
    # Why the verdict stored is not the one today's rules draw from its recorded runs; None: it is.
    stale: str | None = None

    @property
    def outcome(self) -> str:
        """The verdict, or NOT_WORTH_IT for a GO that is not: what the desk reads."""
        return NOT_WORTH_IT if self.verdict is Verdict.GO and not self.worth_it else self.verdict.value

    @property
    def error_code(self) -> ErrorCode | None:
        """The code a blocked training reports; None when the gate passed."""
        if self.passed:
            return None
        if self.stale is not None:
            return ErrorCode.DATA_DECISION_STALE
        if self.verdict is Verdict.GO:
            return ErrorCode.DATA_DECISION_NOT_WORTH_IT
        return ErrorCode.DATA_DECISION_NO_GO if self.verdict is Verdict.NO_GO else ErrorCode.DATA_DECISION_INCONCLUSIVE


def verdict_drift(result: DecisionResult) -> str | None:
    """Why `result`'s stored verdict is not the one today's rules draw from its recorded runs; None
    where it is."""
    test, _ = restated(result)
    if test.verdict is result.verdict:
        return None
    return (f"the stored verdict {result.verdict.value} is not what today's rules draw from its recorded runs "
            f"({test.verdict.value}: {test.explanation}): materialize decision_run and data_decision again")


def _stale(verdict: Verdict, why: str) -> DecisionGateVerdict:
    return DecisionGateVerdict(passed=False, verdict=verdict, accepted_by_manifest=False, reason=why, stale=why)


def standing_gate(decision) -> DecisionGateVerdict:  # a DataDecision
    """The stored gate where it blocks or where today's rules give its verdict again; else a failed
    gate with DATA_DECISION_STALE. A decision built by hand (a test's stand-in) records no runs to
    draw from and keeps its gate."""
    if not decision.gate.passed or not isinstance(decision.decision, DecisionResult):
        return decision.gate
    drift = verdict_drift(decision.decision)
    return decision.gate if drift is None else _stale(decision.decision.verdict, drift)


def accepted_verdicts(manifest: Manifest) -> frozenset[str]:
    if manifest.data_decision is None:
        return frozenset()
    return frozenset(manifest.data_decision.accepted_verdicts)


def require_items_for_a_verdict(manifest: Manifest, benchmarks: Iterable[str]) -> None:
    """Before any proxy trains: an eval suite with a benchmark under MIN_ITEMS_PER_BENCHMARK items
    (`benchmarks`: each item's) can only give INCONCLUSIVE, which blocks training unless the
    manifest's reviewers accept it; the decision's compute would buy a known refusal."""
    counts = Counter(benchmarks)
    few = sorted(name for name, count in counts.items() if count < MIN_ITEMS_PER_BENCHMARK)
    if few and Verdict.INCONCLUSIVE.value not in accepted_verdicts(manifest):
        listed = ", ".join(f"{name} ({counts[name]})" for name in few)
        raise ItoError(ErrorCode.EVAL_SUITE_INVALID,
                       f"the eval suite has too few items for a data decision: {listed}, under "
                       f"{MIN_ITEMS_PER_BENCHMARK} per benchmark; every decision would be INCONCLUSIVE, which the "
                       "manifest does not accept: add items, or have its reviewers accept INCONCLUSIVE")


def decision_gate(verdict: Verdict, manifest: Manifest, economics: Economics | None = None, *,
                  unpriced: str | None = None) -> DecisionGateVerdict:
    """`unpriced`: why the full run's economics could not be judged; a GO is then not shown worth it."""
    worth_it = economics.worth_it if economics is not None else unpriced is None
    gate = DecisionGateVerdict(passed=True, verdict=verdict, accepted_by_manifest=False, worth_it=worth_it,
                               reason="the candidate data is better beyond noise, and worth the full run's cost")
    if gate.outcome == Verdict.GO.value:
        return gate
    if gate.outcome in accepted_verdicts(manifest):
        return replace(gate, accepted_by_manifest=True, reason=f"{gate.outcome}, accepted by the manifest's reviewers")
    reasons = economics.reasons if economics is not None else (unpriced,)
    why = f" ({'; '.join(reasons)})" if gate.outcome == NOT_WORTH_IT else ""
    return replace(gate, passed=False,
                   reason=f"{gate.outcome}{why}: the manifest's reviewers did not accept this outcome")


@dataclass(frozen=True, kw_only=True)
class DataDecision:
    """What the `data_decision` asset records: the verdict, the gate, and the economics (None
    with `plan_refusal` set when the full run could not be planned on the booked hardware)."""

    decision: DecisionResult
    gate: DecisionGateVerdict
    economics: Economics | None
    plan_refusal: str | None
    # The desk's settings the economics were judged with, to judge them again on the run's own
    # booking (`for_booking`); None in a decision stored before it was recorded.
    economics_config: EconomicsConfig | None = None

    def for_booking(self, run_plan: RunPlan, manifest: Manifest) -> DecisionGateVerdict:
        """The gate on the plan of the run's own booking, its hardware and price, where the
        economics were judged on the configured hardware before any booking existed; a verdict
        today's rules would not give blocks as stale (`standing_gate`)."""
        if isinstance(self.decision, DecisionResult):  # a stand-in built by hand records neither
            # Before the economics are judged again: a stored gate that failed on them may pass on
            # the booking's, and must not pass over a verdict or a baseline that no longer holds.
            drift = verdict_drift(self.decision) or baseline_drift(self.decision, manifest)
            if drift is not None:
                return _stale(self.decision.verdict, drift)
        if self.economics_config is None:
            return self.gate
        return decision_gate(self.decision.verdict, manifest,
                             decision_economics(self.decision, run_plan, self.economics_config, _threshold(manifest)))

    def summary(self) -> dict:
        return {
            "verdict": self.decision.verdict.value, "outcome": self.gate.outcome, "difference": self.decision.difference,
            "half_width": self.decision.half_width, "explanation": self.decision.explanation,
            "test": self.decision.test.to_dict(),
            "gate_passed": self.gate.passed, "gate_reason": self.gate.reason,
            "error_code": self.gate.error_code.value if self.gate.error_code else "",
            "accepted_by_manifest": self.gate.accepted_by_manifest,
            "economics": self.economics.to_dict() if self.economics else None, "plan_refusal": self.plan_refusal,
            "confidence": self.decision.test.confidence, "attempt": self.decision.attempt,
            "item_test": self.decision.item_test.to_dict() if self.decision.item_test else None,
            "num_items_by_benchmark": dict(self.decision.num_items_by_benchmark),
            "baseline": baseline_record(self.decision),
        }


def baseline_record(result: DecisionResult) -> dict:
    """What the candidate was measured against: the baseline texts' sha256, their files, and
    whether the manifest bound them (None: a decision recorded before it was said)."""
    return {"sha256": result.baseline_sha256 or "", "sources": [vars(s) for s in result.baseline_sources],
            "bound_by_manifest": result.baseline_bound}


def baseline_drift(result: DecisionResult, manifest: Manifest) -> str | None:
    """Why `result` was not measured against the baseline `manifest` binds (its files, their
    bytes, in order); None where it was, or where the manifest binds none."""
    if manifest.decision_baseline is None:
        return None
    bound = [(f.uri, f.sha256) for f in manifest.decision_baseline]
    if [(s.uri, s.sha256) for s in result.baseline_sources] == bound:
        return None
    return ("the decision measured the candidate against another baseline than the manifest's decision_baseline: "
            "materialize decision_run and data_decision again")


def judge_decision(result: DecisionResult, manifest: Manifest, hardware: Hardware, config: EconomicsConfig) -> DataDecision:
    try:
        # The curriculum's plan: the data decision is about pretraining data (economics.py).
        run_plan = plan_run(manifest, hardware, pair_shapes=None)
    except PlanRefused as refused:
        why = ", ".join(refused.reasons)
        unpriced = f"the full run could not be planned on the booked hardware ({why}): its cost was not weighed against the gain"
        return _checked(DataDecision(decision=result, gate=decision_gate(result.verdict, manifest, unpriced=unpriced),
                                     economics=None, plan_refusal=why, economics_config=config), manifest)
    economics = decision_economics(result, run_plan, config, _threshold(manifest))
    return _checked(DataDecision(decision=result, gate=decision_gate(result.verdict, manifest, economics),
                                 economics=economics, plan_refusal=None, economics_config=config), manifest)


def _checked(judged: DataDecision, manifest: Manifest) -> DataDecision:
    """`judged` with the gate it stands on today (`standing_gate`), against the manifest's baseline."""
    return replace(judged, gate=_against_bound_baseline(standing_gate(judged), judged.decision, manifest))


def _against_bound_baseline(gate: DecisionGateVerdict, result, manifest: Manifest) -> DecisionGateVerdict:
    """`gate`, failed as stale where it passed on a decision measured against another baseline than
    the one the manifest binds."""
    if not gate.passed or not isinstance(result, DecisionResult):
        return gate
    drift = baseline_drift(result, manifest)
    return gate if drift is None else _stale(result.verdict, drift)


def _threshold(manifest: Manifest) -> int | None:
    return manifest.decision_economics.max_cost_cents_per_improvement_point if manifest.decision_economics else None
