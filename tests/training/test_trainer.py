"""The training loop: schedule, determinism, learning."""

from __future__ import annotations

import numpy as np
import pytest

from ito_assets.training.model import build_model, config_by_name
from ito_assets.training.tokenizer import LoaderConfig, iterate_batches
from ito_assets.training.trainer import TrainConfig, learning_rate_at, train


def test_warmup_then_cosine_to_the_floor():
    config = TrainConfig(num_steps=100, batch_size=1, sequence_length=8, learning_rate=1e-3, warmup_fraction=0.1)
    rates = [learning_rate_at(s, config) for s in range(100)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(rates[9:], rates[10:]))
    assert learning_rate_at(100, config) == pytest.approx(1e-4)


def _run(seed: int, steps: int = 12):
    tokens = (np.arange(4000) % 97).astype(np.uint16)  # a learnable periodic sequence
    model = build_model(config_by_name("micro"), seed=seed)
    config = TrainConfig(num_steps=steps, batch_size=4, sequence_length=32, seed=seed, learning_rate=1e-2)
    return train(model, iterate_batches(tokens, LoaderConfig(batch_size=4, sequence_length=32, seed=seed)), config)


def test_same_seed_same_losses_and_it_learns():
    a, b = _run(0), _run(0)
    assert a.losses == b.losses
    assert a.losses[-1] < a.losses[0] - 0.5
    assert a.num_tokens == 12 * 4 * 32 and a.tokens_per_second > 0 and a.model_flops > 0
    assert _run(1).losses != a.losses


def test_validation_names_the_field():
    with pytest.raises(ValueError, match="grad_clip"):
        TrainConfig(num_steps=1, batch_size=1, sequence_length=1, grad_clip=0)
