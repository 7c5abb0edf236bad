"""The decision job prefers a clean mixture over garbage, says so honestly within noise, and
prices itself against the full run."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from ito_assets.evals.suite import load_suite
from ito_assets.training.decision import run_decision
from ito_assets.training.decision_config import DecisionConfig
from ito_assets.training.economics import EconomicsConfig, decision_economics
from ito_assets.training.eval_config import EvalConfig
from ito_assets.training.hardware import gpu_spec, network_spec
from ito_assets.training.planner import Hardware
from ito_assets.training.run_plan import plan_run
from ito_assets.training.tokenizer import TokenizerConfig
from ito_assets.training.verdict import Verdict, paired_test
from ito_assets.manifest.schema import Manifest

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "fixtures"


def _texts(name: str, limit: int) -> list[str]:
    with (FIXTURES / "corpora" / f"{name}.jsonl").open() as handle:
        return [json.loads(line)["text"] for line in handle][:limit]


def _shuffled_words(texts: list[str], seed: int) -> list[str]:
    """Every word's letters shuffled: the same characters and lengths, no language left. (Words
    drawn at random keep the unigram statistics, which a 40-step micro model is all that learns.)"""
    rng = random.Random(seed)

    def shuffle(word: str) -> str:
        letters = list(word)
        rng.shuffle(letters)
        return "".join(letters)

    return [" ".join(shuffle(word) for word in text.split()) for text in texts]


def _random_bytes(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [bytes(rng.randrange(32, 127) for _ in range(600)).decode() for _ in range(count)]


CONFIG = DecisionConfig(
    model_name="micro", tokenizer=TokenizerConfig(vocab_size=512), seeds=(0, 1, 2), num_steps=40, batch_size=8,
    sequence_length=64, learning_rate=1e-2, eval=EvalConfig(batch_size=64),
)


@pytest.fixture(scope="module")
def suite():
    return load_suite(FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl")


@pytest.mark.parametrize("garbage", [pytest.param("shuffled_words", marks=pytest.mark.long), "random_bytes"])
def test_clean_mixture_beats_garbage(garbage, suite, tmp_path):
    clean = _texts("pydoc_topics", 200) + _texts("forum_posts", 200)
    junk = _shuffled_words(clean, seed=1) if garbage == "shuffled_words" else _random_bytes(400, seed=1)
    result = run_decision(candidate_texts=clean, baseline_texts=junk, eval_items=suite.items[::2], config=CONFIG, work_dir=tmp_path)
    assert result.verdict is Verdict.GO, result.explanation
    assert result.difference > result.half_width > 0 and result.test.interval_low > 0
    assert len(result.runs) == 6 and {r.seed for r in result.runs} == {0, 1, 2}
    assert (tmp_path / "tokenizer.json").is_file() and (tmp_path / "tokens" / "candidate.npy").is_file()
    assert result.tokenizer_sha256 and result.to_dict()["verdict"] == "GO"
    assert result.scale == f"micro ({result.num_parameters:,} parameters): a small stand-in, not a 150M decision"
    proxy = dataclasses.replace(result, model_name="proxy-150m")
    assert proxy.scale.endswith("the 150M-scale decision") and result.to_dict()["scale"] == result.scale
    assert result.to_dict()["test"]["degrees_of_freedom"] == 2
    # The test pairs by seed: the same runs with the arms swapped are a NO_GO.
    reverse = paired_test([r.primary for r in result.runs if r.arm == "baseline"],
                          [r.primary for r in result.runs if r.arm == "candidate"], CONFIG.confidence)
    assert reverse.verdict is Verdict.NO_GO


def test_economics_prices_the_decision_against_the_full_run(suite):
    from helpers import valid_manifest  # the shared manifest builder (tests/helpers.py)

    document = valid_manifest()
    document["model"]["size"] = "proxy-150m"
    document["training_target"] = {"num_tokens": 3_000_000_000, "stages": [
        {"name": "pretraining", "num_tokens": 3_000_000_000, "sequence_length": 2048}]}
    document["budget"] = {"cap_cents": 10_000_000, "max_incremental_cents": 5_000_000}
    manifest = Manifest.model_validate_json(json.dumps(document))
    hw = Hardware(gpu=gpu_spec("H100-SXM"), network=network_spec("infiniband"), num_nodes=1, gpus_per_node=8, price_cents_per_gpu_hour=250)
    run_plan = plan_run(manifest, hw, pair_shapes=None)
    clean, junk = _texts("pydoc_topics", 100), _random_bytes(100, seed=2)
    config = DecisionConfig(model_name="micro", tokenizer=TokenizerConfig(vocab_size=512), seeds=(0, 1), num_steps=10,
                            batch_size=8, sequence_length=64, learning_rate=1e-2)
    result = run_decision(candidate_texts=clean, baseline_texts=junk, eval_items=suite.items[:40], config=config)
    economics = decision_economics(result, run_plan, EconomicsConfig())
    assert economics.full_run_cost_cents == run_plan.cost_cents > 0
    assert economics.decision_num_tokens == 4 * config.num_tokens_per_run
    assert 0 < economics.decision_cost_fraction < 0.02
    assert economics.within_budget_cap and economics.within_max_incremental
    assert economics.worth_it and economics.reasons == () and economics.notes == ()
    assert economics.relative_improvement > 0  # random bytes are the worse arm
    assert economics.cost_cents_per_improvement_point == pytest.approx(
        run_plan.cost_cents / (economics.relative_improvement * 100))
    strict = decision_economics(result, run_plan, EconomicsConfig(min_relative_improvement=0.99))
    assert not strict.worth_it and strict.reasons[0].startswith("relative improvement")
    per_point = economics.cost_cents_per_improvement_point
    dear = decision_economics(result, run_plan, EconomicsConfig(), max_cents_per_point=int(per_point) - 1)
    assert not dear.worth_it and "per point of improvement" in dear.reasons[0]


def test_validation_names_the_field():
    with pytest.raises(ValueError, match="seeds"):
        DecisionConfig(seeds=())
    with pytest.raises(ValueError, match="model config"):
        DecisionConfig(model_name="huge")


def test_an_arm_with_a_diverged_run_is_summarized_not_a_crash():
    from types import SimpleNamespace

    from ito_assets.training.decision import _summarize

    report = SimpleNamespace(metric=lambda name: 0.5)
    runs = [SimpleNamespace(primary=value, report=report) for value in (1.0, float("nan"), 1.2)]
    summary = _summarize("candidate", runs, num_documents=3, num_tokens=30)
    assert summary.stdev != summary.stdev and summary.accuracy == 0.5  # NaN, reported as such
    steady = _summarize("candidate", [SimpleNamespace(primary=v, report=report) for v in (1.0, 1.2)], 2, 20)
    assert steady.stdev == pytest.approx(0.1414213562, rel=1e-9)


def test_a_detectable_effect_trains_the_seeds_the_pilot_asks_for(suite):
    clean, junk = _texts("pydoc_topics", 60), _random_bytes(60, seed=3)
    config = DecisionConfig(model_name="micro", tokenizer=TokenizerConfig(vocab_size=512), seeds=(0, 1), num_steps=6,
                            batch_size=4, sequence_length=32, learning_rate=1e-2, target_detectable_effect=1e-9,
                            max_seeds=3)
    result = run_decision(candidate_texts=clean, baseline_texts=junk, eval_items=suite.items[:10], config=config)
    assert sorted({r.seed for r in result.runs}) == [0, 1, 2] and len(result.runs) == 6  # the ceiling, one seed more
    assert (result.test.method, result.test.degrees_of_freedom, result.test.num_seeds) == ("Stein two-stage paired t", 1, 3)
    assert result.to_dict()["seeds"] == [0, 1, 2] and result.to_dict()["target_detectable_effect"] == 1e-9
    loose = dataclasses.replace(config, target_detectable_effect=1e9)  # the pilot already detects it
    assert sorted({r.seed for r in run_decision(candidate_texts=clean, baseline_texts=junk, eval_items=suite.items[:10],
                                                config=loose).runs}) == [0, 1]
