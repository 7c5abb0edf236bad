"""The post-training eval gate: held-out verifiable reward before and after a stage, compared
per prompt (paired), against the sampling noise band.

Two rules:
- improvement: the stage must raise the held-out reward by at least `min_gain`, beyond noise:
  delta - z x SE >= min_gain. SFT (the base has never seen the answer format) and RLVR (the
  stage whose objective is this reward) are held to it.
- no_regression: the held-out reward must not drop beyond noise: delta + z x SE >= 0. DPO, which
  optimises preferences rather than the reward, is held to this.
SE is the standard error of the mean per-prompt difference: the spread of the differences over
prompts, but never less than what sampling alone gives (each prompt's score is a mean of its draws;
two prompts that each happen to gain one draw in eight differ by nothing, and their spread says 0).
A failed gate stops the chain: the next stage refuses to start (EVAL_GATE_FAILED), whatever retries
or flags are used.
"""

from __future__ import annotations

import enum
import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ito_assets.errors import ErrorCode, ItoError

# Only read here (its fields), never built: the evaluation that produces it needs torch, the gate
# (and the checks that name its battery) must not.
if TYPE_CHECKING:
    from ito_assets.posttraining.evaluation import RewardEval

# 1.96: the two-sided 95% quantile of the normal distribution.
Z_95 = 1.96
# 8 samples per prompt (avg@8): the reward RL optimises, with a sampling error small enough to
# compare stages; DAPO reports avg@32 on AIME for the same reason (Yu et al. 2025, section 4.1).
# Here, not in evaluation.py (torch), so that the planner prices the battery without torch.
EVAL_SAMPLES_PER_PROMPT = 8
# Prompts of one length decoded together: 32 x 8 samples = 256 rows a forward. The battery's 200
# prompts took a third of the time they took one at a time; all 200 at once were no faster and
# hold 8x the logits (benchmarks/posttraining_eval.py).
EVAL_BATCH_PROMPTS = 32


class GateRule(str, enum.Enum):
    IMPROVEMENT = "improvement"
    NO_REGRESSION = "no_regression"


@dataclass(frozen=True, kw_only=True)
class GateSpec:
    rule: GateRule
    min_gain: float = 0.0  # improvement only: the margin the rise must clear beyond noise
    z: float = Z_95

    def __post_init__(self) -> None:
        if self.min_gain < 0 or self.z < 0:
            raise ValueError("min_gain and z must be >= 0")


# The post-training battery: one rule per stage of the recipe.
BATTERY: dict[str, GateSpec] = {
    "sft": GateSpec(rule=GateRule.IMPROVEMENT),
    "dpo": GateSpec(rule=GateRule.NO_REGRESSION),
    "rlvr": GateSpec(rule=GateRule.IMPROVEMENT),
}


@dataclass(frozen=True, kw_only=True)
class RewardGateVerdict:
    stage: str
    rule: str
    passed: bool
    reward_before: float
    reward_after: float
    delta: float
    standard_error: float
    min_gain: float
    reason: str

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def judge_rewards(stage: str, before: RewardEval, after: RewardEval, spec: GateSpec) -> RewardGateVerdict:
    """`before` and `after` must be evaluations of the same held-out prompts, in the same order."""
    if before.num_tasks != after.num_tasks or before.num_tasks < 2:
        raise ValueError("before and after must cover the same held-out prompts (at least 2)")
    diffs = [a - b for a, b in zip(after.per_task, before.per_task)]
    spread = statistics.stdev(diffs) / len(diffs) ** 0.5
    delta, se = statistics.fmean(diffs), max(spread, _sampling_error(before, after))
    if spec.rule is GateRule.IMPROVEMENT:
        passed = delta - spec.z * se >= spec.min_gain and delta > 0
        reason = f"held-out reward rose by {delta:+.4f} (SE {se:.4f}); needed > {spec.min_gain} beyond {spec.z} SE"
    else:
        passed = delta + spec.z * se >= 0
        reason = f"held-out reward moved by {delta:+.4f} (SE {se:.4f}); a drop beyond {spec.z} SE fails"
    return RewardGateVerdict(
        stage=stage, rule=spec.rule.value, passed=passed, reward_before=before.mean_reward,
        reward_after=after.mean_reward, delta=delta, standard_error=se, min_gain=spec.min_gain, reason=reason,
    )


def _sampling_error(before: RewardEval, after: RewardEval) -> float:
    """The standard error of the mean difference from sampling alone: each prompt's score is the
    mean of its draws (variance s^2 / draws), the two evaluations' variances added as if their
    draws were independent. Both draw from the same seed, which makes the difference's own noise
    smaller where the policies agree: the floor errs towards a wider band. 0 where an evaluation
    stored before the variances were recorded has none."""
    if not before.per_task_variance or not after.per_task_variance:
        return 0.0
    variances = [b / before.num_samples + a / after.num_samples
                 for b, a in zip(before.per_task_variance, after.per_task_variance, strict=True)]
    return math.sqrt(math.fsum(variances)) / len(variances)


def require_passed(verdict: RewardGateVerdict) -> None:
    """Where the side effect happens: a stage does not start after a failed gate."""
    if not verdict.passed:
        raise ItoError(ErrorCode.EVAL_GATE_FAILED, f"the {verdict.stage} eval gate failed: {verdict.reason}")
