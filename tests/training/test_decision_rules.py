"""The decision's rules as pure functions: the run config's ranges, the arms' minimum text, the
verdict over items as well as seeds, a stored verdict drawn again from its runs, the baseline
recorded, and the confidence split across repeated decisions about the same candidate."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import valid_manifest
from ito_assets.defs.decision.params import checked_defaults
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import Manifest
from ito_assets.runtime.stage.config import MAX_SEED
from ito_assets.training import decision
from ito_assets.training.decision import ArmRun, ArmSummary, DecisionResult, decide, ordered_sha256, restated
from ito_assets.training.decision_config import (
    MAX_BATCH_SIZE, MAX_EVAL_CANDIDATES, MAX_SEEDS, MAX_STEPS, MAX_VOCAB_SIZE, DecisionConfig,
)
from ito_assets.training.decision_gate import DecisionGateVerdict, standing_gate, verdict_drift
from ito_assets.training.economics import EconomicsConfig
from ito_assets.training.tokenizer import TokenizerConfig
from ito_assets.training.trainer import TrainResult
from ito_assets.training.verdict import MIN_ITEMS_PER_BENCHMARK, PairedTest, Verdict, item_test

ULP = math.ulp(1.0)


# --- the run config's ranges ---------------------------------------------------------------------

@pytest.mark.parametrize(("fields", "refused"), [
    ({"seeds": [-1, 0]}, "seeds must each lie in"), ({"seeds": [0, 1]}, None),
    ({"seeds": [MAX_SEED - 1, MAX_SEED]}, None), ({"seeds": [MAX_SEED + 1, 1]}, "seeds must each lie in"),
    ({"seeds": [2**64, 1]}, "seeds must each lie in"),
    ({"seeds": list(range(MAX_SEEDS))}, None), ({"seeds": list(range(MAX_SEEDS + 1))}, "seeds must number at most"),
    ({"num_steps": MAX_STEPS}, None), ({"num_steps": MAX_STEPS + 1}, "num_steps must lie in"),
    ({"batch_size": MAX_BATCH_SIZE}, None), ({"batch_size": MAX_BATCH_SIZE + 1}, "batch_size must lie in"),
    ({"model_name": "micro", "sequence_length": 256}, None),
    ({"model_name": "micro", "sequence_length": 257}, "sequence_length must be at most 256"),
    ({"sequence_length": 512}, None), ({"sequence_length": 513}, "sequence_length must be at most 512"),
    ({"vocab_size": 257}, None), ({"vocab_size": MAX_VOCAB_SIZE}, None),
    ({"vocab_size": MAX_VOCAB_SIZE + 1}, "vocab_size must lie in"), ({"vocab_size": 10**9}, "vocab_size must lie in"),
    ({"num_eval_candidates": MAX_EVAL_CANDIDATES}, None),
    ({"num_eval_candidates": MAX_EVAL_CANDIDATES + 1}, "num_eval_candidates must lie in"),
    ({"learning_rate": 1.0}, None), ({"learning_rate": math.nextafter(1.0, 2.0)}, "learning_rate must be at most 1"),
])
def test_every_run_config_field_has_a_range_named_in_its_refusal(fields, refused):
    if refused is None:
        assert checked_defaults(fields, "test") == fields
        return
    with pytest.raises(ValueError, match=f"^test: {refused}") as error:
        checked_defaults(fields, "test")
    assert str(MAX_SEED + 1) not in str(error.value) and "1000000000" not in str(error.value)  # never the value


def test_stein_s_extra_seeds_stay_within_the_seed_range():
    DecisionConfig(seeds=(MAX_SEED - 2, MAX_SEED - 1), target_detectable_effect=0.1, max_seeds=3)
    with pytest.raises(ValueError, match="seeds must leave room"):
        DecisionConfig(seeds=(MAX_SEED - 2, MAX_SEED - 1), target_detectable_effect=0.1, max_seeds=4)


# --- the arms' minimum text ----------------------------------------------------------------------

class _NoTraining:
    def train(self, **kwargs):
        raise AssertionError("an arm trained")


@pytest.mark.parametrize("arm", ["candidate", "baseline"])
def test_an_arm_of_one_document_is_source_invalid_before_the_tokenizer(arm, tmp_path):
    texts = {"candidate": ["one document"] * 3, "baseline": ["another document"] * 3}
    texts[arm] = texts[arm][:1]
    with pytest.raises(ItoError) as refused:
        decision.run_decision(candidate_texts=texts["candidate"], baseline_texts=texts["baseline"], eval_items=[object()],
                              config=DecisionConfig(model_name="micro"), work_dir=tmp_path, trainer=_NoTraining())
    assert refused.value.code is ErrorCode.SOURCE_INVALID and f"the {arm} mixture holds 1 document" in refused.value.message
    assert not (tmp_path / "tokenizer.json").exists()


@pytest.mark.parametrize(("num_tokens", "ok"), [(4 * 8, False), (4 * 8 + 1, True), (5 * 8 + 1, True)])
def test_an_arm_with_fewer_windows_than_a_batch_is_source_invalid(num_tokens, ok):
    config = DecisionConfig(model_name="micro", batch_size=4, sequence_length=8)
    tokens = {"candidate": np.zeros(100, dtype=np.uint16), "baseline": np.zeros(num_tokens, dtype=np.uint16)}
    if ok:
        decision._require_windows(tokens, config)
        return
    with pytest.raises(ItoError) as refused:
        decision._require_windows(tokens, config)
    assert refused.value.code is ErrorCode.SOURCE_INVALID and "baseline mixture's training text fills 3 window(s)" in refused.value.message


def test_too_little_text_to_fill_a_batch_trains_no_arm(tmp_path):
    short = ["a few words only", "and a few more"]
    with pytest.raises(ItoError) as refused:
        decision.run_decision(candidate_texts=short, baseline_texts=short, eval_items=[object()],
                              config=DecisionConfig(model_name="micro", tokenizer=TokenizerConfig(vocab_size=300)),
                              work_dir=tmp_path, trainer=_NoTraining())
    assert refused.value.code is ErrorCode.SOURCE_INVALID and "a step needs batch_size = 16" in refused.value.message


# --- runs as recorded ------------------------------------------------------------------------------

def _score(values, benchmark="b"):
    return SimpleNamespace(benchmark=benchmark, num_items=len(values), item_bits_per_byte=tuple(values))


class _Report:
    """An eval report as the decision reads it: benchmarks with per-item scores, and the primary
    metric, the mean of its benchmarks' item means (as evaluate's macro mean)."""

    def __init__(self, benchmarks) -> None:
        self.benchmarks, self.heldout_bits_per_byte = benchmarks, None
        self.primary = sum(sum(b.item_bits_per_byte) / b.num_items for b in benchmarks) / len(benchmarks)

    def metric(self, name: str) -> float:
        return self.primary

    def summary(self) -> dict:
        return {}


def _run(arm, seed, items_by_benchmark, loss=5.0):
    report = _Report(tuple(_score(values, name) for name, values in items_by_benchmark.items()))
    train = TrainResult(losses=(loss,), num_steps=1, num_tokens=1, wall_seconds=0.0, tokens_per_second=1.0, model_flops=0)
    return ArmRun(arm=arm, seed=seed, train=train, report=report, heldout_bits_per_byte=None)


LUCK = (0.0, 0.03, -0.02)  # a seed's luck, shared by both arms
NOISE = (0.0, 0.004, -0.003)  # and the baseline's own, on top


def _runs(candidate_items, baseline_items):
    """Seed s shifts both arms' items by LUCK[s], the baseline's by NOISE[s] more."""
    def shifted(items, s, noise):
        return {name: [v + LUCK[s] + noise * (1 + 0.01 * i) for i, v in enumerate(values)] for name, values in items.items()}

    return {"candidate": [_run("candidate", s, shifted(candidate_items, s, 0.0)) for s in range(3)],
            "baseline": [_run("baseline", s, shifted(baseline_items, s, NOISE[s])) for s in range(3)]}


CONFIG = DecisionConfig(model_name="micro")
VOCAB = 512


def _better(num_items, gap=0.1):
    """The candidate better on every item by about `gap`, items of differing difficulty."""
    base = [1.0 + 0.05 * i for i in range(num_items)]
    return {"b": [v - gap for v in base]}, {"b": base}


@pytest.mark.parametrize(("num_items", "verdict"), [
    (1, Verdict.INCONCLUSIVE), (MIN_ITEMS_PER_BENCHMARK - 1, Verdict.INCONCLUSIVE),
    (MIN_ITEMS_PER_BENCHMARK, Verdict.GO), (MIN_ITEMS_PER_BENCHMARK + 1, Verdict.GO),
])
def test_a_benchmark_of_too_few_items_decides_nothing(num_items, verdict):
    test, items = decide(_runs(*_better(num_items)), CONFIG, VOCAB)
    assert test.verdict is verdict
    if verdict is Verdict.INCONCLUSIVE:
        assert items is None and f"b ({num_items}), under {MIN_ITEMS_PER_BENCHMARK} per benchmark" in test.explanation
    else:
        assert items.verdict is Verdict.GO and items.num_items == num_items and items.interval_low > 0


def test_every_benchmark_needs_the_minimum():
    candidate, baseline = _better(MIN_ITEMS_PER_BENCHMARK)
    small_c, small_b = _better(MIN_ITEMS_PER_BENCHMARK - 1)
    test, _ = decide(_runs({**candidate, "small": small_c["b"]}, {**baseline, "small": small_b["b"]}), CONFIG, VOCAB)
    assert test.verdict is Verdict.INCONCLUSIVE and "small (14)" in test.explanation


def test_an_advantage_over_seeds_that_rests_on_one_item_is_within_noise():
    """One item 1.5 bits/byte better, the other 19 a little worse: the seeds' interval lies above
    zero (the same items every seed), the items' does not."""
    base = [1.0 + 0.05 * i for i in range(20)]
    cand = [base[0] - 1.5] + [v + 0.01 * (1 + i % 4) for i, v in enumerate(base[1:])]
    seeds_only = decision.seed_test(_runs({"b": cand}, {"b": base}), CONFIG, VOCAB)
    assert seeds_only.verdict is Verdict.GO
    test, items = decide(_runs({"b": cand}, {"b": base}), CONFIG, VOCAB)
    assert test.verdict is Verdict.WITHIN_NOISE and items.verdict is Verdict.WITHIN_NOISE
    assert "over the items it is not" in test.explanation and test.interval_low == seeds_only.interval_low


def test_runs_without_per_item_scores_decide_nothing():
    runs = _runs(*_better(MIN_ITEMS_PER_BENCHMARK))
    for run in runs["baseline"]:
        for score in run.report.benchmarks:
            score.item_bits_per_byte = ()  # a score recorded before they were kept
    test, items = decide(runs, CONFIG, VOCAB)
    assert test.verdict is Verdict.INCONCLUSIVE and items is None and "no per-item scores" in test.explanation


@pytest.mark.parametrize(("differences", "verdict"), [
    ([0.1, 0.2, 0.15], Verdict.GO), ([-0.1, -0.2, -0.15], Verdict.NO_GO), ([0.1, -0.2, 0.15], Verdict.WITHIN_NOISE),
    ([0.1], Verdict.INCONCLUSIVE), ([0.1, 0.1, 0.1], Verdict.INCONCLUSIVE), ([0.1, math.nan], Verdict.INCONCLUSIVE),
])
def test_the_item_interval(differences, verdict):
    test = item_test(differences, 0.95)
    assert test.verdict is verdict and test.num_items == len(differences)
    assert (test.p_value is None) is (verdict is Verdict.INCONCLUSIVE)


# --- a stored verdict, drawn again ---------------------------------------------------------------

def _result(runs, test, **fields) -> DecisionResult:
    summary = ArmSummary(arm="x", num_documents=10, num_tokens_available=10, mean=1.0, stdev=0.1, accuracy=0, correct_prob=0)
    every = tuple(runs["candidate"] + runs["baseline"])
    return DecisionResult(metric="answer_bits_per_byte", test=test, candidate=summary, baseline=summary, runs=every,
                          config=CONFIG, model_name="micro", num_parameters=1, num_tokens_per_run=1, tokenizer_sha256=None,
                          train_wall_seconds=0.0, model_flops=0, candidate_shards=("a",), vocab_size=VOCAB, **fields)


def _by_an_earlier_rule(runs) -> PairedTest:
    return PairedTest(verdict=Verdict.GO, num_seeds=3, difference=2 * ULP, confidence=0.95, interval_low=2 * ULP,
                      interval_high=2 * ULP, p_value=0.0, minimum_detectable_effect=0.0, explanation="an earlier rule",
                      degrees_of_freedom=2)


def _manifest() -> Manifest:
    return Manifest.model_validate_json(json.dumps(valid_manifest()))


def _judged(result):
    from ito_assets.defs.decision.resources import BookedHardwareResource
    from ito_assets.training.decision_gate import judge_decision

    return judge_decision(result, _manifest(), BookedHardwareResource().hardware(), EconomicsConfig())


def test_a_go_by_an_earlier_rule_is_stale_everywhere_the_gate_is_read():
    """Differences of two ULPs on every seed: GO at p = 0 by the rule before the no-spread one."""
    from ito_assets.defs.decision.checks import decision_is_go
    from ito_assets.defs.training.assets import _require_data

    import dagster as dg

    base = {"b": [1.0 + 0.05 * i for i in range(MIN_ITEMS_PER_BENCHMARK)]}
    runs = {arm: [_run(arm, s, {"b": [v + s * 0.1 + (2 * ULP if arm == "baseline" else 0) for v in base["b"]]})
                  for s in range(3)] for arm in decision.ARMS}
    result = _result(runs, _by_an_earlier_rule(runs))
    assert restated(result)[0].verdict is Verdict.INCONCLUSIVE and "measured no noise" in verdict_drift(result)
    judged = _judged(result)
    assert (judged.gate.passed, judged.gate.error_code) == (False, ErrorCode.DATA_DECISION_STALE)
    # A decision stored by an earlier release, whose gate passed: the check and training refuse it.
    stored = dataclasses.replace(judged, gate=dataclasses.replace(judged.gate, passed=True, stale=None))
    check = decision_is_go(data_decision=stored)
    assert not check.passed and check.metadata["error_code"].value == "DATA_DECISION_STALE"
    clean = SimpleNamespace(shards=SimpleNamespace(shards=(SimpleNamespace(sha256="a"),), verify=lambda: []),
                            conservation=SimpleNamespace(holds=True))
    with pytest.raises(dg.Failure) as refused:
        _require_data(clean, stored)
    assert refused.value.metadata["error_code"].value == "DATA_DECISION_STALE"
    assert stored.for_booking(None, _manifest()).error_code is ErrorCode.DATA_DECISION_STALE


def test_a_go_today_s_rules_give_again_passes():
    runs = _runs(*_better(MIN_ITEMS_PER_BENCHMARK))
    test, items = decide(runs, CONFIG, VOCAB)
    result = _result(runs, test, item_test=items)
    assert test.verdict is Verdict.GO and verdict_drift(result) is None
    judged = _judged(result)
    assert judged.gate.stale is None and standing_gate(judged) is judged.gate


def test_a_go_from_runs_that_do_not_pair_by_seed_is_stale():
    runs = _runs(*_better(MIN_ITEMS_PER_BENCHMARK))
    test, items = decide(runs, CONFIG, VOCAB)
    runs["baseline"] = runs["baseline"][::-1]
    assert "do not pair seed by seed" in verdict_drift(_result(runs, test, item_test=items))


# --- what is recorded ------------------------------------------------------------------------------

def test_a_result_recorded_before_the_new_fields_loads_with_their_defaults():
    runs = _runs(*_better(MIN_ITEMS_PER_BENCHMARK))
    result = _result(runs, decide(runs, CONFIG, VOCAB)[0])
    gate = DecisionGateVerdict(passed=True, verdict=Verdict.GO, accepted_by_manifest=False, reason="r")
    for old, names in ((result, ("baseline_sha256", "baseline_sources", "vocab_size", "item_test",
                                 "num_items_by_benchmark", "attempt")), (gate, ("stale",))):
        for name in names:
            object.__delattr__(old, name)  # as an object pickled by the release before
        loaded = pickle.loads(pickle.dumps(old))
        assert all(getattr(loaded, name) == getattr(type(old), name) for name in names)
    assert loaded.error_code is None


def test_the_baseline_digest_is_of_the_texts_in_order():
    assert ordered_sha256(["ab", "c"]) != ordered_sha256(["a", "bc"]) != ordered_sha256(["c", "ab"])
    assert ordered_sha256([]) == ordered_sha256(())


def test_a_decision_records_its_baseline_and_the_items_it_was_drawn_from(monkeypatch, tmp_path):
    from ito_assets.training import evaluation

    values = iter(np.linspace(1.0, 2.0, 8))

    def evaluate(model, tokenizer, items, config, *, heldout_texts, heldout_sequence_length):
        return _Report((_score([float(next(values))] * 3),))

    class _Trainer:
        def train(self, **kwargs):
            return object(), TrainResult(losses=(1.0,), num_steps=1, num_tokens=1, wall_seconds=0.0,
                                         tokens_per_second=1.0, model_flops=0)

    monkeypatch.setattr(evaluation, "evaluate", evaluate)
    texts = [f"document number {i} says {'ab' * (i % 7)} and more words" for i in range(61)]
    config = DecisionConfig(model_name="micro", tokenizer=TokenizerConfig(vocab_size=300), seeds=(0, 1),
                            num_steps=1, batch_size=1, sequence_length=8)
    result = decision.run_decision(candidate_texts=texts, baseline_texts=texts[::-1], eval_items=[object()],
                                   config=config, work_dir=tmp_path, trainer=_Trainer())
    assert result.baseline_sha256 == ordered_sha256(texts[::-1]) and result.num_items_by_benchmark == (("b", 3),)
    assert result.vocab_size and result.to_dict()["baseline_sha256"] == result.baseline_sha256
    assert result.verdict is Verdict.INCONCLUSIVE and verdict_drift(result) is None


def test_per_item_bits_per_byte_pool_to_the_benchmark_s():
    from ito_assets.evals.suite import EvalItem
    from ito_assets.training.eval_config import EvalConfig
    from ito_assets.training.evaluation import evaluate
    from ito_assets.training.model import build_model
    from ito_assets.training.model_config import config_by_name
    from ito_assets.training.tokenizer import TokenizerConfig, train_tokenizer

    items = [EvalItem(id=f"a{i}", benchmark="arith", question=f"What is {i} plus {i}?", answer=str(2 * i)) for i in range(6)]
    tokenizer = train_tokenizer([f"What is {i} plus {i}? {2 * i}" for i in range(30)], TokenizerConfig(vocab_size=300))
    model = build_model(config_by_name("micro", vocab_size=tokenizer.get_vocab_size()), seed=0)
    [score] = evaluate(model, tokenizer, items, EvalConfig(num_candidates=4)).benchmarks
    sizes = [len((" " + item.answer).encode()) for item in items]
    assert len(score.item_bits_per_byte) == 6
    assert sum(v * n for v, n in zip(score.item_bits_per_byte, sizes)) / sum(sizes) == pytest.approx(score.bits_per_byte)
    assert "item_bits_per_byte" not in evaluate(model, tokenizer, items, EvalConfig()).summary()["benchmarks"]["arith"]


# --- decisions run again until GO ------------------------------------------------------------------

@pytest.mark.parametrize(("attempt", "confidence"), [(1, 0.95), (2, 0.975), (3, 1 - 0.05 / 6), (5, 0.9975)])
def test_the_k_th_decision_about_a_candidate_tests_at_a_over_k_k_minus_1(attempt, confidence):
    assert DecisionConfig().for_attempt(attempt).confidence == pytest.approx(confidence)


def test_the_error_rates_of_any_number_of_decisions_add_up_to_at_most_twice_the_first():
    """A two-sided test errs towards GO in half its rate: the chance of any false GO over every
    decision made again about one candidate stays within 1 - c. Bonferroni's a / k did not."""
    config = DecisionConfig(confidence=0.9)
    spent = math.fsum(1 - config.for_attempt(k).confidence for k in range(1, 100_001))
    assert 0.19 < spent <= 0.2
    assert math.fsum(0.1 / k for k in range(1, 101)) > 0.5  # the rule before, at 100 decisions
    with pytest.raises(ValueError, match="attempt"):
        config.for_attempt(0)


def test_earlier_decisions_that_were_not_a_go_count_for_the_same_candidate_only():
    import dagster as dg

    from ito_assets.defs.decision.assets import CANDIDATE_DIGEST_KEY, _earlier_non_go

    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("manifests", ["m1", "m2"])
        for partition, digest, verdict in (("m1", "same", "NO_GO"), ("m1", "same", "WITHIN_NOISE"), ("m1", "same", "GO"),
                                           ("m1", "other", "NO_GO"), ("m2", "same", "NO_GO")):
            instance.report_runless_asset_event(dg.AssetMaterialization(
                asset_key="decision_run", partition=partition, metadata={CANDIDATE_DIGEST_KEY: digest, "verdict": verdict}))
        context = dg.build_asset_context(instance=instance, partition_key="m1")
        assert _earlier_non_go(context, "same") == 2 and _earlier_non_go(context, "new") == 0


@pytest.mark.parametrize("smallest, accepted, refused", [
    (MIN_ITEMS_PER_BENCHMARK - 1, ["WITHIN_NOISE"], True),
    (MIN_ITEMS_PER_BENCHMARK, ["WITHIN_NOISE"], False),
    (MIN_ITEMS_PER_BENCHMARK + 1, None, False),
    (1, None, True),  # no reviewers: only a GO passes, and none can come
    (MIN_ITEMS_PER_BENCHMARK - 1, ["WITHIN_NOISE", "INCONCLUSIVE"], False),  # the reviewers accept what comes
])
def test_a_suite_that_can_only_be_inconclusive_is_refused_before_the_proxies_train(smallest, accepted, refused):
    from ito_assets.training.decision_gate import require_items_for_a_verdict

    document = valid_manifest()
    document["data_decision"] = (None if accepted is None else
                                 {"accepted_verdicts": accepted, "reason": "test", "reviewed_by": "tests"})
    manifest = Manifest.model_validate_json(json.dumps(document))
    benchmarks = ["arith"] * 40 + ["trivia"] * smallest
    if not refused:
        require_items_for_a_verdict(manifest, benchmarks)
        return
    with pytest.raises(ItoError) as caught:
        require_items_for_a_verdict(manifest, benchmarks)
    assert caught.value.code is ErrorCode.EVAL_SUITE_INVALID and f"trivia ({smallest})" in caught.value.message
