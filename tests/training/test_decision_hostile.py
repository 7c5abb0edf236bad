"""The data decision says GO only when the data say so: the economics' minimum, and the held-out
split the decision shares with the training stages whatever seeds its proxies train with."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ito_assets.runtime.stage import corpus
from ito_assets.training import evaluation
from ito_assets.training.decision import DecisionConfig, run_decision
from ito_assets.training.economics import EconomicsConfig, not_worth_it
from ito_assets.training.tokenizer import TokenizerConfig
from ito_assets.training.trainer import TrainResult


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
    def __init__(self, value: float) -> None:
        self.value, self.heldout_bits_per_byte = value, None

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
