"""The data decision says GO only when the data say so: degenerate seeds (no spread, a diverged or
absurd metric, a confidence of nothing), the sign of a lower-is-better metric under generated
per-seed values, the gate over every verdict, economics and acceptance, and the held-out split the
decision shares with the training stages whatever seeds its proxies train with."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import valid_manifest
from ito_assets.errors import ErrorCode
from ito_assets.manifest.schema import Manifest
from ito_assets.runtime.stage import corpus
from ito_assets.training import evaluation
from ito_assets.training import decision
from ito_assets.training.decision import run_decision
from ito_assets.training.decision_config import DecisionConfig
from ito_assets.training.decision_gate import NOT_WORTH_IT, decision_gate
from ito_assets.training.economics import Economics, EconomicsConfig, not_worth_it
from ito_assets.training.tokenizer import TokenizerConfig
from ito_assets.training.trainer import TrainResult
from ito_assets.training.verdict import MIN_ITEMS_PER_BENCHMARK, Verdict, paired_test, stein_test

ULP = math.ulp(1.0)


# --- the paired test ---------------------------------------------------------------------------

@pytest.mark.parametrize("shift", [ULP, -ULP, 2.0**-20, 0.5, 0.0])
def test_identical_differences_from_seeds_that_moved_both_arms_are_inconclusive(shift):
    # Each seed moved both arms by the same amount, so every difference is the same: t = d / 0. The
    # test gave a one-ULP (2e-16 bits/byte) difference a GO at p = 0.
    candidate = [1.0, 1.5, 1.25]
    baseline = [c + shift for c in candidate]
    assert len({b - c for c, b in zip(candidate, baseline)}) == 1 and len(set(candidate)) == 3
    test = paired_test(candidate, baseline, 0.95)
    assert test.verdict is Verdict.INCONCLUSIVE and test.p_value is None and test.interval_low is None
    assert "measured no noise" in test.explanation


def test_a_stein_pilot_of_identical_differences_is_inconclusive_whatever_later_seeds_did():
    candidate, baseline = [1.0, 1.5, 1.25, 1.1], [1.0 + ULP, 1.5 + ULP, 1.25 + ULP, 1.3]
    test = stein_test(candidate, baseline, 3, 0.95)
    assert test.verdict is Verdict.INCONCLUSIVE and test.num_seeds == 4 and "measured no noise" in test.explanation


@pytest.mark.parametrize("ulps, expected", [(2, Verdict.INCONCLUSIVE), (64, Verdict.GO)])
def test_a_spread_of_rounding_alone_is_none_and_one_beyond_it_is_tested(ulps, expected):
    # Differences a few ULPs apart measured float rounding, not seed noise (a GO at p ~ 1e-15 before);
    # beyond 8 epsilons of the values (here 2.0: 3.6e-15) they are tested as usual.
    test = paired_test([1.0, 1.5, 1.25], [1.5, 2.0, 1.75 + ulps * ULP], 0.95)
    assert test.verdict is expected and (test.p_value is None) is (expected is Verdict.INCONCLUSIVE)


@pytest.mark.parametrize(("candidate", "baseline"), [
    ([0.0, 0.0], [1e308, 1.5e308]),  # the mean overflows
    ([0.0, 0.0], [1.7e308, -1.7e308]),  # the spread overflows
    ([0.0, 0.0, 0.0], [1.7e308, 1.7e308, -1.0]),
])
def test_finite_values_whose_mean_or_spread_overflows_are_inconclusive_not_a_crash(candidate, baseline):
    for test in (paired_test(candidate, baseline, 0.95), stein_test(candidate, baseline, 2, 0.95)):
        assert test.verdict is Verdict.INCONCLUSIVE and "not finite" in test.explanation


@pytest.mark.parametrize("confidence", [0.0, -0.5, 1.0, 1.5, math.nan])
def test_a_confidence_outside_zero_and_one_is_refused(confidence):
    # At 0 the interval has no width and every positive mean was a GO, noise or not.
    with pytest.raises(ValueError, match="confidence"):
        paired_test([1.0, 1.2], [1.3, 1.0], confidence)
    with pytest.raises(ValueError, match="confidence"):
        stein_test([1.0, 1.2], [1.3, 1.0], 2, confidence)


def test_diverged_arms_and_negative_zero_never_decide():
    for broken in (math.nan, math.inf, -math.inf):
        assert paired_test([1.0, 1.1, 1.2], [broken, 1.5, 1.6], 0.95).verdict is Verdict.INCONCLUSIVE
        assert paired_test([broken] * 3, [broken] * 3, 0.95).verdict is Verdict.INCONCLUSIVE
    assert paired_test([1.0, -0.0, 2.0], [1.0, 0.0, 2.0], 0.95).verdict is Verdict.INCONCLUSIVE


_BITS = st.floats(min_value=-1e30, max_value=1e30, allow_nan=False, allow_infinity=False)


@settings(max_examples=400, deadline=None)
@given(pairs=st.lists(st.tuples(_BITS, _BITS), min_size=1, max_size=6),
       confidence=st.sampled_from([0.5, 0.8, 0.95, 0.99]))
def test_go_means_the_candidates_bits_per_byte_are_lower_beyond_the_interval(pairs, confidence):
    candidate, baseline = [c for c, _ in pairs], [b for _, b in pairs]
    test = paired_test(candidate, baseline, confidence)
    differences = {b - c for c, b in pairs}
    exact = sum(map(Fraction, baseline)) - sum(map(Fraction, candidate))  # n x the exact mean difference
    if test.verdict is Verdict.GO:
        assert exact > 0 and test.interval_low > 0 and test.p_value < 1 - confidence and len(differences) > 1
    if test.verdict is Verdict.NO_GO:
        assert exact < 0 and test.interval_high < 0 and len(differences) > 1


@settings(max_examples=200, deadline=None)
@given(differences=st.lists(st.floats(min_value=-0.1, max_value=0.1), min_size=2, max_size=6),
       luck=st.lists(st.floats(min_value=0.5, max_value=3.0), min_size=6, max_size=6))
def test_swapping_the_arms_swaps_go_and_no_go(differences, luck):
    # Bits per byte: lower is better. A sign error would make the worse arm the GO.
    baseline = [u + 0.05 for u in luck[: len(differences)]]
    candidate = [b - d for b, d in zip(baseline, differences)]
    forward, backward = paired_test(candidate, baseline, 0.95), paired_test(baseline, candidate, 0.95)
    swapped = {Verdict.GO: Verdict.NO_GO, Verdict.NO_GO: Verdict.GO}
    assert backward.verdict is swapped.get(forward.verdict, forward.verdict)


# --- the gate ----------------------------------------------------------------------------------

def _economics(worth_it: bool) -> Economics:
    reasons = () if worth_it else ("relative improvement 0.10% is below 1.00%",)
    return Economics(decision_num_tokens=1, decision_cost_cents=1, full_run_cost_cents=100,
                     decision_cost_fraction=0.01, relative_improvement=0.001, cost_cents_per_improvement_point=1000,
                     max_cost_cents_per_improvement_point=None, within_budget_cap=True, within_max_incremental=True,
                     worth_it=worth_it, reasons=reasons, notes=())


_ACCEPTABLE = ["NO_GO", "WITHIN_NOISE", "INCONCLUSIVE", NOT_WORTH_IT]


def _manifest(accepted: list[str]) -> Manifest:
    body = valid_manifest()
    if accepted:
        body["data_decision"] = {"accepted_verdicts": accepted, "reason": "coverage", "reviewed_by": "desk"}
    return Manifest.model_validate_json(json.dumps(body))


@settings(max_examples=200, deadline=None)
@given(verdict=st.sampled_from(list(Verdict)), worth_it=st.sampled_from([True, False, None]),
       accepted=st.lists(st.sampled_from(_ACCEPTABLE), unique=True, max_size=4))
def test_the_gate_passes_a_go_worth_it_or_exactly_what_reviewers_accepted(verdict, worth_it, accepted):
    gate = decision_gate(verdict, _manifest(accepted), None if worth_it is None else _economics(worth_it))
    outcome = NOT_WORTH_IT if verdict is Verdict.GO and worth_it is False else verdict.value
    assert gate.outcome == outcome
    assert gate.passed is (outcome == "GO" or outcome in accepted)
    assert gate.accepted_by_manifest is (outcome != "GO" and outcome in accepted)
    expected_code = None if gate.passed else {
        "NO_GO": ErrorCode.DATA_DECISION_NO_GO, NOT_WORTH_IT: ErrorCode.DATA_DECISION_NOT_WORTH_IT,
    }.get(outcome, ErrorCode.DATA_DECISION_INCONCLUSIVE)
    assert gate.error_code is expected_code


def test_a_within_noise_acceptance_never_lets_a_no_go_through():
    gate = decision_gate(Verdict.NO_GO, _manifest(["WITHIN_NOISE", "INCONCLUSIVE", NOT_WORTH_IT]))
    assert not gate.passed and gate.error_code is ErrorCode.DATA_DECISION_NO_GO


# --- the economics -----------------------------------------------------------------------------

def test_an_improvement_that_is_not_a_number_is_below_any_minimum():
    # NaN < minimum is False: the old comparison let a NaN improvement pass the desk's minimum.
    reasons = not_worth_it(math.nan, 1_000, EconomicsConfig(min_relative_improvement=0.01), None)
    assert len(reasons) == 1 and "below 1.00%" in reasons[0]
    assert not_worth_it(math.nan, 1_000, EconomicsConfig(), 100) != ()


@pytest.mark.parametrize(("improvement", "worth"), [(0.05, True), (math.nextafter(0.05, 0), False)])
def test_the_minimum_improvement_binds_to_the_last_bit(improvement, worth):
    assert (not_worth_it(improvement, 1_000, EconomicsConfig(min_relative_improvement=0.05), None) == ()) is worth


# --- the held-out split ------------------------------------------------------------------------

class _Report:
    """An eval report of one benchmark of MIN_ITEMS_PER_BENCHMARK items, each item's bits per byte
    the value scaled a little more than the last (so that items differ, and the arms' differences too)."""

    def __init__(self, value: float) -> None:
        self.value, self.heldout_bits_per_byte = value, None
        items = tuple(value * (1 + 0.01 * i) for i in range(MIN_ITEMS_PER_BENCHMARK))
        self.benchmarks = (SimpleNamespace(benchmark="b", num_items=len(items), item_bits_per_byte=items),)

    def metric(self, name: str) -> float:
        return self.value


class _Trainer:
    """Trains nothing: the split, not the proxy, is under test."""

    def train(self, *, arm_dir, tokens_path, model_config, config):
        return object(), TrainResult(losses=(1.0,), num_steps=1, num_tokens=1, wall_seconds=0.0,
                                     tokens_per_second=1.0, model_flops=0)


def test_the_decision_holds_out_the_training_stages_documents_whatever_its_seeds(monkeypatch, tmp_path):
    # The training stages split with seed 0 (runtime.stage.corpus); the decision split with its
    # first proxy seed, so a decision run with seeds (3, 4) scored other documents than training.
    held: dict[int, list[str]] = {}
    values = iter(np.linspace(1.0, 2.0, 8))

    def evaluate(model, tokenizer, items, config, *, heldout_texts, heldout_sequence_length):
        held[len(held)] = list(heldout_texts)
        return _Report(float(next(values)))

    monkeypatch.setattr(evaluation, "evaluate", evaluate)
    texts = [f"document number {i} says {'ab' * (i % 7)} and more words" for i in range(61)]
    config = DecisionConfig(model_name="micro", tokenizer=TokenizerConfig(vocab_size=300), seeds=(3, 4),
                            num_steps=1, batch_size=1, sequence_length=8)
    run_decision(candidate_texts=texts, baseline_texts=texts[::-1], eval_items=[object()], config=config,
                 work_dir=tmp_path, trainer=_Trainer())
    mask = corpus.heldout_mask(len(texts), corpus.HELDOUT_FRACTION, 0)  # the stages' split: corpus's seed 0
    training_heldout = [t for t, m in zip(texts, mask) if m]
    assert held[0] == training_heldout and held[2] == training_heldout  # the candidate arm, both seeds
    assert held[1] == [t for t, m in zip(texts[::-1], mask) if m]


# --- a diverged proxy --------------------------------------------------------------------------

class _Curves:
    """Each arm's training losses, as its proxy would report them."""

    def __init__(self, **losses: tuple[float, ...]) -> None:
        self.losses = losses

    def train(self, *, arm_dir, tokens_path, model_config, config):
        arm = arm_dir.name.split("-")[0]
        return arm, _result(*self.losses[arm])


def _result(*losses: float) -> TrainResult:
    return TrainResult(losses=losses, num_steps=len(losses), num_tokens=1, wall_seconds=0.0, tokens_per_second=1.0,
                       model_flops=0)


LEARNED = (6.2, 5.0)


@pytest.mark.parametrize(("candidate", "baseline", "verdict"), [
    (LEARNED, LEARNED, Verdict.GO),
    (LEARNED, (5.6, 5.9), Verdict.GO),  # up a little at the start: a short run's noise, no divergence
    (LEARNED, (6.2, math.nan, 5.0), Verdict.GO),  # a step dropped for a non-finite loss changed no weight
    (LEARNED, (6.2, 40.0), Verdict.INCONCLUSIVE),  # a blow-up whose bits per byte stay finite
    (LEARNED, (6.2, math.nan), Verdict.INCONCLUSIVE),
    ((6.2, 40.0), LEARNED, Verdict.INCONCLUSIVE),  # a diverged candidate: no NO_GO either
])
def test_a_decision_against_a_diverged_proxy_is_no_decision(monkeypatch, tmp_path, candidate, baseline, verdict):
    """The baseline's huge but finite bits per byte would make the candidate a GO by a wide margin;
    its training loss, far above a uniform guess's, says the proxy diverged, not that the data differ."""
    calls = iter(range(100))

    def evaluate(model, tokenizer, items, config, *, heldout_texts, heldout_sequence_length):
        k = next(calls)  # seed to seed, a little noise in the difference
        return _Report(1.0 + 0.01 * k if model == "candidate" else 9.0 + 0.03 * k)

    monkeypatch.setattr(evaluation, "evaluate", evaluate)
    texts = [f"document number {i} says {'ab' * (i % 7)} and more words" for i in range(61)]
    config = DecisionConfig(model_name="micro", tokenizer=TokenizerConfig(vocab_size=300), seeds=(3, 4, 5),
                            num_steps=2, batch_size=1, sequence_length=8)
    result = run_decision(candidate_texts=texts, baseline_texts=texts[::-1], eval_items=[object()], config=config,
                          work_dir=tmp_path, trainer=_Curves(candidate=candidate, baseline=baseline))
    assert result.verdict is verdict
    if verdict is Verdict.INCONCLUSIVE:
        arm = "baseline" if baseline != LEARNED else "candidate"
        assert result.explanation.startswith(f"training diverged in the {arm}'s seed 3, the {arm}'s seed 4")


def test_a_run_diverged_when_its_loss_ended_a_nat_above_a_uniform_guess():
    bound = math.log(300) + decision.DIVERGED_NATS
    assert not decision.diverged(_result(5.7, bound), 300)
    assert decision.diverged(_result(5.7, math.nextafter(bound, math.inf)), 300)
    assert decision.diverged(_result(5.7, math.inf), 300) and decision.diverged(_result(5.7, math.nan), 300)
    assert not decision.diverged(_result(5.7), 300)  # one step: its loss is a start's
    # The end is the mean of the last tenth, its finite steps: one late spike among 20 steps is not the end.
    assert not decision.diverged(_result(*([5.7] + [2.0] * 18 + [7.0])), 300)
    assert not decision.diverged(_result(*([5.7] + [2.0] * 18 + [math.nan])), 300)
    assert decision.diverged(_result(*([5.7] + [2.0] * 18 + [12.0])), 300)
    assert decision.diverged(_result(*([5.7] + [2.0] * 17 + [math.nan, math.nan])), 300)


def test_a_second_decision_in_a_held_folder_writes_and_trains_nothing(tmp_path):
    """Two decision runs of one manifest share its work folder: the second is refused before it
    writes a token or removes an arm's folder under the first; the folder is free again after."""
    import fcntl

    from ito_assets.errors import ItoError

    texts = ["alpha beta gamma delta"] * 4
    arms = tmp_path / "arms" / "candidate-seed0"
    arms.mkdir(parents=True)
    with open(tmp_path / decision.LOCK_NAME, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a first decision running here
        with pytest.raises(ItoError) as refused:
            run_decision(candidate_texts=texts, baseline_texts=texts, eval_items=[], config=DecisionConfig(),
                         work_dir=tmp_path)
    assert refused.value.code is ErrorCode.STAGE_BUSY
    assert sorted(p.name for p in tmp_path.iterdir()) == [decision.LOCK_NAME, "arms"] and arms.is_dir()
    with decision._holding(tmp_path):  # the first ended: the folder is taken again at once
        pass
