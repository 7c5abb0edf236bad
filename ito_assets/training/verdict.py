"""The data decision's verdict: a paired t-test over seeds.

Seed s trains both arms from the same initial weights in the same batch order, so the seed's own
luck is shared and cancels in the per-seed difference d_s = baseline_s - candidate_s (lower bits
per byte is better, so d_s > 0 favours the candidate). The test is Student's paired t-test on the
d_s (Student 1908; any statistics text, e.g. Wasserman, "All of Statistics", 10.4): with n seeds the
mean difference over its standard error follows a t distribution with n - 1 degrees of freedom
when the arms do not differ. The rule it replaces (the difference of seed means against 2 standard
errors of a pooled, unpaired spread) said GO or NO_GO about equal arms in 18% of decisions at
n = 2 (benchmarks/decision_rule.py). The interval's half-width replaces that band.

- GO: the interval lies above zero; NO_GO: below zero; WITHIN_NOISE: it contains zero.
- INCONCLUSIVE: fewer than two paired seeds (no noise to test against); differences with no spread
  beyond float rounding: every seed gave the same difference, whether the seeds changed neither arm (one run
  repeated) or moved both arms alike, so t is d / 0 and any difference, one rounding error
  included, would be a GO or NO_GO at p = 0; or a run whose metric is not finite (a diverged proxy
  says nothing about its data; values whose mean or spread overflows a float count as such), or
  whose training loss ended far above a uniform guess's (`decision.diverged`: a diverged proxy
  whose metric is finite).
The minimum detectable effect is (t_{1-a/2} + t_{power}) standard errors from the observed spread,
the usual approximation (Cohen 1988, ch. 2) of the true difference these seeds would find with
80% power; if the true spread is the observed one, its exact power is lower at few seeds (about
73% at 2, 77% at 3, 79% at 5, from the noncentral t): a run records roughly what it could have seen.

When the manifest asks for a minimum detectable effect, the seed count comes from the data by
Stein's two-stage procedure (Stein 1945, "A two-sample test for a linear hypothesis whose power is
independent of the variance"): the first seeds are a pilot whose spread s0 sets the total count n
(`stein_seed_count`), and the test over all n seeds uses s0 with the pilot's n0 - 1 degrees of
freedom (`stein_test`), which keeps the false-decision rate at exactly 1 - confidence. Adding
seeds until the observed MDE is small enough and then testing as usual does not: simulated under
the null it said GO or NO_GO in 7-9% of decisions (benchmarks/decision_rule.py).

The seeds' interval is about one fixed set of eval items: a suite of one item gave GO or NO_GO with
small p-values where the whole suite said NO_GO. So a GO or NO_GO also needs its sign to hold over
the items (`item_test`): Student's t over the items' differences, each the mean over seeds of
baseline - candidate on that item, at the same confidence (the paired comparison over questions of
Miller 2024, "Adding Error Bars to Evals"), from at least MIN_ITEMS_PER_BENCHMARK items of every
benchmark.
"""

from __future__ import annotations

import enum
import functools
import math
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from typing import Sequence

# The power the minimum detectable effect is stated at: Cohen's (1988) conventional 80%.
POWER = 0.80
# The fewest eval items of any benchmark a GO or NO_GO is drawn from. From 15 observations on, a t
# interval holds unless the data are strongly skewed or have outliers; below that, only for data
# close to normal (Moore, McCabe & Craig, "Introduction to the Practice of Statistics", on the
# robustness of t procedures), which per-item differences of bits per byte are not shown to be.
MIN_ITEMS_PER_BENCHMARK = 15


class Verdict(str, enum.Enum):
    GO = "GO"
    NO_GO = "NO_GO"
    WITHIN_NOISE = "WITHIN_NOISE"
    INCONCLUSIVE = "INCONCLUSIVE"


@dataclass(frozen=True, kw_only=True)
class PairedTest:
    verdict: Verdict
    num_seeds: int
    difference: float  # mean of baseline - candidate per seed: > 0 favours the candidate
    confidence: float
    interval_low: float | None  # None with fewer than two seeds
    interval_high: float | None
    p_value: float | None
    minimum_detectable_effect: float | None
    explanation: str
    degrees_of_freedom: int = 0  # of the t distribution the interval uses (n - 1, or the pilot's n0 - 1)
    method: str = "paired t"

    @property
    def half_width(self) -> float | None:
        return None if self.interval_high is None else (self.interval_high - self.interval_low) / 2

    def to_dict(self) -> dict:
        return {**asdict(self), "verdict": self.verdict.value}


@dataclass(frozen=True, kw_only=True)
class ItemTest:
    """Whether the candidate's advantage holds over eval items: Student's t over the per-item
    differences (each the mean over seeds of baseline - candidate bits per byte on that item)."""

    verdict: Verdict  # GO / NO_GO / WITHIN_NOISE as the seed test's; INCONCLUSIVE: no spread or no scores
    num_items: int
    difference: float  # mean over items: > 0 favours the candidate
    confidence: float
    interval_low: float | None
    interval_high: float | None
    p_value: float | None
    explanation: str

    def to_dict(self) -> dict:
        return {**asdict(self), "verdict": self.verdict.value}


@functools.lru_cache(maxsize=256)
def _t_quantile(probability: float, degrees: int) -> float:
    from scipy import stats  # imported here: the code location loads without it

    return float(stats.t.ppf(probability, degrees))


def _two_sided_p(t: float, degrees: int) -> float:
    from scipy import stats

    return float(2 * stats.t.sf(abs(t), degrees))


def _inconclusive(num_seeds: int, difference: float, confidence: float, why: str) -> PairedTest:
    return PairedTest(verdict=Verdict.INCONCLUSIVE, num_seeds=num_seeds, difference=difference, confidence=confidence,
                      interval_low=None, interval_high=None, p_value=None, minimum_detectable_effect=None,
                      explanation=why)


def withheld(test: PairedTest, why: str) -> PairedTest:
    """`test` as INCONCLUSIVE for a reason outside its figures (a run that diverged)."""
    return _inconclusive(test.num_seeds, test.difference, test.confidence, why)


def _seeds_changed_nothing(candidate: Sequence[float], baseline: Sequence[float]) -> bool:
    """True when every seed gave each arm the same value: the seeds were not replicates (the seed
    reached neither arm's training), so there is one measurement and no noise to test against."""
    return len(set(candidate)) == 1 and len(set(baseline)) == 1


_NOT_REPLICATES = "every seed gave each arm the same value: the seeds repeated one run and measured no noise; no decision"
_NO_SPREAD = ("every seed gave the same difference between the arms (to float rounding): the seeds measured no noise "
              "in it, and its zero spread would make any difference a decision at p = 0; no decision")
_NOT_FINITE = "a run's metric is not finite (a diverged proxy); no decision"
_ONE_SEED = "one seed per arm cannot measure seed-to-seed noise; no decision"


# A spread of the differences this many float epsilons of the values' magnitude or less is float
# rounding alone: the values' own (each within half an ulp of what was measured) and their
# subtraction's. Three seeds giving 0.1 exactly each, written as [1.3, 1.2, 1.1] - [1.2, 1.1, 1.0],
# differ by 1e-16 and would be a GO at p = 5e-31.
_ROUNDING_EPSILONS = 8


def _within_rounding(spread: float, candidate: Sequence[float], baseline: Sequence[float]) -> bool:
    scale = max(abs(v) for v in (*candidate, *baseline))
    return spread <= _ROUNDING_EPSILONS * sys.float_info.epsilon * scale


def _check_confidence(confidence: float) -> None:
    # A confidence of 0 is an interval of zero width: every positive mean would be a GO.
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")


def _moments(values: Sequence[float]) -> tuple[float, float] | None:
    """(mean, sample standard deviation) of two or more values; None when either is not a finite
    float (finite values far beyond any bits per byte can overflow their sum or their spread)."""
    if not all(math.isfinite(v) for v in values):
        return None
    try:
        mean, spread = statistics.fmean(values), statistics.stdev(values)
    except OverflowError:
        return None
    return (mean, spread) if math.isfinite(mean) and math.isfinite(spread) else None


def paired_test(candidate: Sequence[float], baseline: Sequence[float], confidence: float) -> PairedTest:
    """The verdict from per-seed values of a lower-is-better metric, paired by position (seed)."""
    _check_confidence(confidence)
    if len(candidate) != len(baseline):
        raise ValueError("candidate and baseline need one value per seed each")
    differences = [b - c for c, b in zip(candidate, baseline)]
    n = len(differences)
    if n == 0:
        raise ValueError("a paired test needs at least one seed")
    if not all(math.isfinite(d) for d in differences):
        return _inconclusive(n, math.nan, confidence, _NOT_FINITE)
    if n < 2:
        return _inconclusive(n, differences[0], confidence, _ONE_SEED)
    moments = _moments(differences)
    if moments is None:
        return _inconclusive(n, math.nan, confidence, _NOT_FINITE)
    mean, spread = moments
    if _seeds_changed_nothing(candidate, baseline):
        return _inconclusive(n, mean, confidence, _NOT_REPLICATES)
    if _within_rounding(spread, candidate, baseline):
        return _inconclusive(n, mean, confidence, _NO_SPREAD)
    return _t_interval(mean, spread / math.sqrt(n), n - 1, n, confidence, "paired t")


def item_test(differences: Sequence[float], confidence: float) -> ItemTest:
    """The t interval over items of per-item differences (> 0 favours the candidate)."""
    _check_confidence(confidence)
    n = len(differences)
    moments = _moments(differences) if n >= 2 else None
    if moments is None or not moments[1] > 0:
        why = ("fewer than two items, a score that is not finite, or items that all differ alike: "
               "the items measured no spread")
        return ItemTest(verdict=Verdict.INCONCLUSIVE, num_items=n, difference=moments[0] if moments else math.nan,
                        confidence=confidence, interval_low=None, interval_high=None, p_value=None, explanation=why)
    mean, spread = moments
    standard_error = spread / math.sqrt(n)
    half_width = _t_quantile(0.5 + confidence / 2, n - 1) * standard_error
    low, high = mean - half_width, mean + half_width
    verdict = Verdict.GO if low > 0 else Verdict.NO_GO if high < 0 else Verdict.WITHIN_NOISE
    return ItemTest(verdict=verdict, num_items=n, difference=mean, confidence=confidence, interval_low=low,
                    interval_high=high, p_value=_two_sided_p(mean / standard_error, n - 1),
                    explanation=f"{confidence:.0%} interval [{low:+.4f}, {high:+.4f}] bits/byte over {n} eval items")


def over_items(test: PairedTest, num_items_by_benchmark: Sequence[tuple[str, int]],
               differences: Sequence[float] | None) -> tuple[PairedTest, ItemTest | None]:
    """The seeds' verdict where the items bear it out: INCONCLUSIVE from a benchmark of fewer than
    MIN_ITEMS_PER_BENCHMARK items or without per-item `differences`; a GO or NO_GO whose interval
    over items does not share its side is WITHIN_NOISE (INCONCLUSIVE where the items had no spread)."""
    if test.verdict is Verdict.INCONCLUSIVE:
        return test, None
    few = ", ".join(f"{name} ({count})" for name, count in num_items_by_benchmark if count < MIN_ITEMS_PER_BENCHMARK)
    if few:
        return replace(test, verdict=Verdict.INCONCLUSIVE, explanation=(
            f"too few eval items for a decision: {few}, under {MIN_ITEMS_PER_BENCHMARK} per benchmark; "
            f"over seeds alone: {test.explanation}")), None
    if differences is None:
        return replace(test, verdict=Verdict.INCONCLUSIVE, explanation=(
            f"the runs kept no per-item scores to test the items with; over seeds alone: {test.explanation}")), None
    items = item_test(differences, test.confidence)
    if test.verdict is Verdict.WITHIN_NOISE or items.verdict is test.verdict:
        return test, items
    verdict = Verdict.INCONCLUSIVE if items.verdict is Verdict.INCONCLUSIVE else Verdict.WITHIN_NOISE
    return replace(test, verdict=verdict, explanation=(
        f"{test.explanation}; but over the items it is not: {items.explanation} ({items.verdict.value}), "
        "so the difference may rest on a few items")), items


def stein_seed_count(pilot: Sequence[float], target: float, confidence: float, max_seeds: int) -> int:
    """Seeds in all for a paired test that detects `target` with POWER, from the pilot's per-seed
    differences (Stein's first stage); at least the pilot, at most `max_seeds`."""
    n0 = len(pilot)
    if n0 < 2 or target <= 0 or max_seeds < n0:
        raise ValueError("a pilot of two or more seeds, a positive target and max_seeds >= the pilot are needed")
    degrees = n0 - 1
    factor = _t_quantile(0.5 + confidence / 2, degrees) + _t_quantile(POWER, degrees)
    ratio = factor * statistics.stdev(pilot) / target
    if not ratio <= math.sqrt(max_seeds):  # past the cap (a tiny target: squared, it overflowed)
        return max_seeds
    return min(max_seeds, max(n0, math.ceil(ratio**2)))


def stein_test(candidate: Sequence[float], baseline: Sequence[float], num_pilot: int, confidence: float) -> PairedTest:
    """Stein's second stage: the mean of all paired differences over the pilot's spread, with the
    pilot's degrees of freedom; exact whatever rule chose the count from the pilot."""
    _check_confidence(confidence)
    if len(candidate) != len(baseline) or not 2 <= num_pilot <= len(candidate):
        raise ValueError("one value per seed per arm, and a pilot of two or more of those seeds")
    differences = [b - c for c, b in zip(candidate, baseline)]
    n = len(differences)
    every, pilot = _moments(differences), _moments(differences[:num_pilot])
    if every is None or pilot is None:
        return _inconclusive(n, math.nan, confidence, _NOT_FINITE)
    if _seeds_changed_nothing(candidate[:num_pilot], baseline[:num_pilot]):
        return _inconclusive(n, every[0], confidence, _NOT_REPLICATES)
    if _within_rounding(pilot[1], candidate[:num_pilot], baseline[:num_pilot]):
        return _inconclusive(n, every[0], confidence, _NO_SPREAD)
    return _t_interval(every[0], pilot[1] / math.sqrt(n), num_pilot - 1, n, confidence, "Stein two-stage paired t")


def _t_interval(mean: float, standard_error: float, degrees: int, n: int, confidence: float, method: str) -> PairedTest:
    if not standard_error > 0:  # identical differences (or a spread below the smallest float): t = mean / 0
        return _inconclusive(n, mean, confidence, _NO_SPREAD)
    critical = _t_quantile(0.5 + confidence / 2, degrees)
    half_width = critical * standard_error
    low, high = mean - half_width, mean + half_width
    p_value = _two_sided_p(mean / standard_error, degrees)
    detectable = (critical + _t_quantile(POWER, degrees)) * standard_error
    verdict = Verdict.GO if low > 0 else Verdict.NO_GO if high < 0 else Verdict.WITHIN_NOISE
    return PairedTest(verdict=verdict, num_seeds=n, difference=mean, confidence=confidence, interval_low=low,
                      interval_high=high, p_value=p_value, minimum_detectable_effect=detectable,
                      explanation=_explain(verdict, mean, low, high, confidence, n, detectable),
                      degrees_of_freedom=degrees, method=method)


def _explain(verdict: Verdict, mean: float, low: float, high: float, confidence: float, n: int, detectable: float) -> str:
    interval = f"{confidence:.0%} interval [{low:+.4f}, {high:+.4f}] bits/byte over {n} paired seeds"
    if verdict is Verdict.GO:
        return f"candidate better by {mean:.4f} bits/byte; {interval} lies above zero"
    if verdict is Verdict.NO_GO:
        return f"candidate worse by {-mean:.4f} bits/byte; {interval} lies below zero"
    return (f"difference {mean:+.4f} bits/byte; {interval} contains zero: the data is not shown to be better "
            f"or worse (these seeds detect about {detectable:.4f} bits/byte with {POWER:.0%} power)")
