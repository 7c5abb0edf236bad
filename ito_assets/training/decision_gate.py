"""The data-decision gate: training proceeds on GO, or on a verdict the manifest's reviewers
accepted in writing.

The acceptance is the manifest's optional `data_decision` (schema.DataDecisionAcceptance):
`{"accepted_verdicts": ["NO_GO" | "WITHIN_NOISE" | "INCONCLUSIVE", ...], "reason": str,
"reviewed_by": str}`; without it every verdict other than GO blocks: a NO_GO with
DATA_DECISION_NO_GO, the verdicts that did not tell with DATA_DECISION_INCONCLUSIVE.
"""

from __future__ import annotations

from dataclasses import dataclass

from ito_assets.errors import ErrorCode
from ito_assets.manifest.schema import Manifest
from ito_assets.training.decision import DecisionResult
from ito_assets.training.economics import Economics, EconomicsConfig, decision_economics
from ito_assets.training.layout import PlanRefused
from ito_assets.training.planner import Hardware
from ito_assets.training.run_plan import plan_run
from ito_assets.training.verdict import Verdict


@dataclass(frozen=True, kw_only=True)
class DecisionGateVerdict:
    passed: bool
    verdict: Verdict
    accepted_by_manifest: bool
    reason: str

    @property
    def error_code(self) -> ErrorCode | None:
        """The code a blocked training reports; None when the gate passed."""
        if self.passed:
            return None
        return ErrorCode.DATA_DECISION_NO_GO if self.verdict is Verdict.NO_GO else ErrorCode.DATA_DECISION_INCONCLUSIVE


def accepted_verdicts(manifest: Manifest) -> frozenset[str]:
    if manifest.data_decision is None:
        return frozenset()
    return frozenset(manifest.data_decision.accepted_verdicts)


def decision_gate(verdict: Verdict, manifest: Manifest) -> DecisionGateVerdict:
    if verdict is Verdict.GO:
        return DecisionGateVerdict(passed=True, verdict=verdict, accepted_by_manifest=False,
                                   reason="the candidate data is better beyond noise")
    if verdict.value in accepted_verdicts(manifest):
        return DecisionGateVerdict(passed=True, verdict=verdict, accepted_by_manifest=True,
                                   reason=f"{verdict.value}, accepted by the manifest's reviewers")
    return DecisionGateVerdict(passed=False, verdict=verdict, accepted_by_manifest=False,
                               reason=f"{verdict.value}: the manifest's reviewers did not accept this verdict")


@dataclass(frozen=True, kw_only=True)
class DataDecision:
    """What the `data_decision` asset records: the verdict, the gate, and the economics (None
    with `plan_refusal` set when the full run could not be planned on the booked hardware)."""

    decision: DecisionResult
    gate: DecisionGateVerdict
    economics: Economics | None
    plan_refusal: str | None

    def summary(self) -> dict:
        return {
            "verdict": self.decision.verdict.value, "difference": self.decision.difference,
            "half_width": self.decision.half_width, "explanation": self.decision.explanation,
            "test": self.decision.test.to_dict(),
            "gate_passed": self.gate.passed, "gate_reason": self.gate.reason,
            "error_code": self.gate.error_code.value if self.gate.error_code else "",
            "accepted_by_manifest": self.gate.accepted_by_manifest,
            "economics": self.economics.to_dict() if self.economics else None, "plan_refusal": self.plan_refusal,
        }


def judge_decision(result: DecisionResult, manifest: Manifest, hardware: Hardware, config: EconomicsConfig) -> DataDecision:
    gate = decision_gate(result.verdict, manifest)
    try:
        run_plan = plan_run(manifest, hardware)
    except PlanRefused as refused:
        return DataDecision(decision=result, gate=gate, economics=None, plan_refusal=", ".join(refused.reasons))
    return DataDecision(decision=result, gate=gate, economics=decision_economics(result, run_plan, config), plan_refusal=None)
