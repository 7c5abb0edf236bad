"""The data decision's error rates, simulated: how often each rule says GO or NO_GO when the arms do
not differ, and how often it says GO when the candidate is truly better (power), at 2, 3 and 5 seeds.

Model of one decision (the same for both rules): seed s gives both arms a shared seed effect
u_s ~ N(0, seed_sd^2) (same initial weights, same batch order) plus each arm its own noise
e ~ N(0, arm_sd^2); the candidate's true gain is `effect`, in units of arm_sd. Two scenarios:
`independent` (seed_sd 0: nothing shared, where a fixed band is too narrow for few seeds) and
`shared` (seed_sd 3: most of a seed's luck is common to both arms, where pairing gains power). The baseline rule is
the one this project used before: GO/NO_GO when the mean difference leaves 2 standard errors of a
pooled, unpaired standard deviation. The paired rule is `training.verdict.paired_test` itself.

Then the seed count chosen by the data, when a manifest asks for a minimum detectable effect: a
pilot of 3 seeds, at most 20, targets in units of the per-seed difference's sd. Stein's two-stage
test (`stein_seed_count`, `stein_test`) against adding one seed at a time until the observed MDE
is small enough and then testing as usual: false-decision rate under the null, power at the
target, mean seeds trained.

Then decisions made again about the same candidate until one says GO (`--reruns`): equal arms, 3
seeds, seed luck 0.03 shared by both arms and 0.01 of each arm's own (bits per byte), a fresh draw
for each decision; the share of cases with a false GO within the first N decisions, under
Bonferroni's a / k for the k-th decision (the rule before) and under `DecisionConfig.for_attempt`.

    .venv/bin/python benchmarks/decision_rule.py [--trials 10000] [--seed 0]
    .venv/bin/python benchmarks/decision_rule.py --reruns [--trials 4000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ito_assets.training.verdict import Verdict, paired_test, stein_seed_count, stein_test  # noqa: E402

SEED_COUNTS = (2, 3, 5)
EFFECTS = (0.0, 0.5, 1.0, 2.0, 4.0)  # true gain, in arm noise standard deviations
SCENARIOS = {"independent": 0.0, "shared": 3.0}  # seed_sd per scenario
ARM_SD = 1.0


def unpaired_two_se(candidate: list[float], baseline: list[float]) -> Verdict:
    """The rule before the paired test: a fixed 2-standard-error band from a pooled variance."""
    n = len(candidate)
    difference = statistics.fmean(baseline) - statistics.fmean(candidate)
    band = 2.0 * ((statistics.variance(candidate) + statistics.variance(baseline)) / 2) ** 0.5 * (2 / n) ** 0.5
    return Verdict.GO if difference > band else Verdict.NO_GO if difference < -band else Verdict.WITHIN_NOISE


def simulate(rule, seed_sd: float, num_seeds: int, effect: float, trials: int, rng: np.random.Generator) -> dict:
    shared = rng.normal(0, seed_sd, size=(trials, num_seeds))
    baseline = 10.0 + shared + rng.normal(0, ARM_SD, size=(trials, num_seeds))
    candidate = 10.0 - effect * ARM_SD + shared + rng.normal(0, ARM_SD, size=(trials, num_seeds))
    verdicts = [rule(c.tolist(), b.tolist()) for c, b in zip(candidate, baseline)]
    return {"go": sum(v is Verdict.GO for v in verdicts) / trials, "no_go": sum(v is Verdict.NO_GO for v in verdicts) / trials}


PILOT, MAX_SEEDS = 3, 20
TARGETS = (1.0, 1.5, 2.5)  # minimum detectable effect, in sds of the per-seed difference


def stein(rng: np.random.Generator, effect: float, target: float) -> tuple[Verdict, int]:
    pilot = list(rng.normal(effect, 1.0, PILOT))
    total = stein_seed_count(pilot, target, 0.95, MAX_SEEDS)
    differences = pilot + list(rng.normal(effect, 1.0, total - PILOT))
    return stein_test([0.0] * total, differences, PILOT, 0.95).verdict, total


def until_small_enough(rng: np.random.Generator, effect: float, target: float) -> tuple[Verdict, int]:
    differences = list(rng.normal(effect, 1.0, PILOT))
    while (test := paired_test([0.0] * len(differences), differences, 0.95)).minimum_detectable_effect > target \
            and len(differences) < MAX_SEEDS:
        differences.append(rng.normal(effect, 1.0))
    return test.verdict, len(differences)


def seed_count_rows(trials: int, seed: int) -> list[dict]:
    rows = []
    for target in TARGETS:
        row: dict = {"target_sd": target}
        for name, rule in (("stein", stein), ("until_small_enough", until_small_enough)):
            figures = {}
            for label, effect in (("null", 0.0), ("at_target", target)):
                rng = np.random.default_rng([seed, int(target * 10), int(effect > 0)])
                outcomes = [rule(rng, effect, target) for _ in range(trials)]
                decided = {"null": (Verdict.GO, Verdict.NO_GO), "at_target": (Verdict.GO,)}[label]
                figures[label] = sum(v in decided for v, _ in outcomes) / trials
                figures[f"{label}_mean_seeds"] = statistics.fmean(n for _, n in outcomes)
            row[name] = figures
        rows.append(row)
    return rows


def fixed_seed_rows(trials: int, seed: int) -> list[dict]:
    rules = {"unpaired_2se": unpaired_two_se, "paired_t_95": lambda c, b: paired_test(c, b, 0.95).verdict}
    rows = []
    for scenario, seed_sd in SCENARIOS.items():
        for num_seeds in SEED_COUNTS:
            for effect in EFFECTS:
                row = {"scenario": scenario, "num_seeds": num_seeds, "effect_arm_sd": effect}
                for name, rule in rules.items():
                    rng = np.random.default_rng([seed, int(seed_sd), num_seeds, int(effect * 10)])
                    row[name] = simulate(rule, seed_sd, num_seeds, effect, trials, rng)
                rows.append(row)
    return rows


def print_fixed(rows: list[dict], trials: int) -> None:
    print(f"{trials} trials per cell; arm sd {ARM_SD}; seed sd shared by both arms: {SCENARIOS}")
    print("scenario     seeds  effect | unpaired 2-SE: GO   NO_GO | paired t 95%: GO   NO_GO")
    for row in rows:
        old, new = row["unpaired_2se"], row["paired_t_95"]
        print(f"{row['scenario']:<12} {row['num_seeds']:>5}  {row['effect_arm_sd']:>6.1f} | {old['go']:>17.3f} {old['no_go']:>7.3f} |"
              f" {new['go']:>16.3f} {new['no_go']:>7.3f}")


def print_seed_counts(rows: list[dict]) -> None:
    print(f"seeds chosen by the data: pilot {PILOT}, at most {MAX_SEEDS}; target in sds of the per-seed difference")
    print("target | Stein: false  power  seeds | until small enough: false  power  seeds")
    for row in rows:
        cells = [row[name] for name in ("stein", "until_small_enough")]
        print(f"{row['target_sd']:>6.1f} | " + " | ".join(
            f"{c['null']:>12.3f} {c['at_target']:>6.3f} {c['at_target_mean_seeds']:>6.2f}" for c in cells))


RERUN_SEEDS, RERUN_SEED_SD, RERUN_ARM_SD = 3, 0.03, 0.01
RERUN_HORIZONS = (1, 2, 5, 10, 20, 50)


def rerun_rows(trials: int, seed: int) -> dict[str, dict[int, float]]:
    """rule -> N -> the share of equal-arm cases with a GO within their first N decisions."""
    from ito_assets.training.decision_config import DecisionConfig

    base = DecisionConfig()
    rules = {"bonferroni_a_over_k": lambda k: 1 - (1 - base.confidence) / k,
             "for_attempt": lambda k: base.for_attempt(k).confidence}
    horizon = max(RERUN_HORIZONS)
    found = {}
    for name, confidence in rules.items():
        rng = np.random.default_rng([seed, horizon])  # the same draws for both rules
        first_go = []
        for _ in range(trials):
            shared = rng.normal(0, RERUN_SEED_SD, size=(horizon, RERUN_SEEDS))
            baseline = 1.0 + shared + rng.normal(0, RERUN_ARM_SD, size=(horizon, RERUN_SEEDS))
            candidate = 1.0 + shared + rng.normal(0, RERUN_ARM_SD, size=(horizon, RERUN_SEEDS))
            first_go.append(next((k for k in range(1, horizon + 1)
                                  if paired_test(candidate[k - 1].tolist(), baseline[k - 1].tolist(),
                                                 confidence(k)).verdict is Verdict.GO), horizon + 1))
        found[name] = {n: sum(k <= n for k in first_go) / trials for n in RERUN_HORIZONS}
    return found


def print_reruns(rows: dict[str, dict[int, float]], trials: int) -> None:
    print(f"{trials} equal-arm cases, decided again until GO; the share with a false GO within N decisions")
    print("N      " + "  ".join(f"{name:>20}" for name in rows))
    for n in RERUN_HORIZONS:
        print(f"{n:<6} " + "  ".join(f"{rows[name][n]:>20.4f}" for name in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reruns", action="store_true", help="only the decisions made again until GO")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.reruns:
        rows = rerun_rows(args.trials, args.seed)
        print_reruns(rows, args.trials)
        print(json.dumps({"rule": {k: {str(n): v for n, v in r.items()} for k, r in rows.items()},
                          "seconds": round(time.perf_counter() - started, 1)}))
        return
    rows, counted = fixed_seed_rows(args.trials, args.seed), seed_count_rows(args.trials, args.seed)
    print_fixed(rows, args.trials)
    print_seed_counts(counted)
    null = [r for r in rows if r["effect_arm_sd"] == 0.0]
    verdict = {
        "stein_false_decision_rate_max": max(r["stein"]["null"] for r in counted),
        "until_small_enough_false_decision_rate_max": max(r["until_small_enough"]["null"] for r in counted),
        "paired_false_decision_rate_max": max(r["paired_t_95"]["go"] + r["paired_t_95"]["no_go"] for r in null),
        "unpaired_false_decision_rate_max": max(r["unpaired_2se"]["go"] + r["unpaired_2se"]["no_go"] for r in null),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(verdict))


if __name__ == "__main__":
    main()
