"""A stage's positions: the manifest may raise the RoPE base or interpolate positions for a
long-context stage; later stages keep them; the worker builds its model with them."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from ito_assets.manifest.schema import Stage, TrainingTarget
from ito_assets.runtime.stage import curriculum
from ito_assets.training.model import build_model, rotary_tables
from runtime_helpers import worker_config


def _target(*stages: Stage) -> TrainingTarget:
    return TrainingTarget(num_tokens=sum(s.num_tokens for s in stages), stages=stages)


@pytest.mark.parametrize("field,value,ok", [
    ("rope_theta", 1, True), ("rope_theta", 0.999, False), ("rope_theta", 1e9, True), ("rope_theta", 1e9 + 1, False),
    ("position_scale", 1, True), ("position_scale", 0.999, False), ("position_scale", 64, True),
    ("position_scale", 64.001, False),
])
def test_the_manifest_bounds_a_stages_positions(field, value, ok):
    body = {"name": "long_context", "num_tokens": 100, "sequence_length": 256, field: value}
    if ok:
        assert getattr(Stage(**body), field) == value
    else:
        with pytest.raises(ValidationError):
            Stage(**body)


def test_a_stage_keeps_the_nearest_earlier_positions():
    target = _target(Stage(name="pretraining", num_tokens=100, sequence_length=128),
                     Stage(name="mid_training", num_tokens=100, sequence_length=128, position_scale=2.0),
                     Stage(name="long_context", num_tokens=100, sequence_length=256, rope_theta=500_000.0))
    assert curriculum.positions(target, "pretraining") == {"rope_theta": None, "position_scale": None}
    assert curriculum.positions(target, "mid_training") == {"rope_theta": None, "position_scale": 2.0}
    assert curriculum.positions(target, "long_context") == {"rope_theta": 500_000.0, "position_scale": 2.0}
    with pytest.raises(ValueError):
        curriculum.positions(_target(Stage(name="pretraining", num_tokens=1, sequence_length=8)), "long_context")


def test_interpolation_divides_the_positions():
    cos, sin = rotary_tables(16, 8, 10_000.0)
    half_cos, half_sin = rotary_tables(16, 8, 10_000.0, scale=2.0)
    torch.testing.assert_close(half_cos[2], cos[1])
    torch.testing.assert_close(half_sin[6], sin[3])


def test_the_worker_builds_its_model_with_the_stages_positions(tmp_path, tokens):
    plain = worker_config(tmp_path, tokens).model_config()
    long = worker_config(tmp_path, tokens, rope_theta=500_000.0, position_scale=4.0).model_config()
    assert (plain.rope_theta, plain.rope_position_scale) == (10_000.0, 1.0)  # the model's own
    assert (long.rope_theta, long.rope_position_scale) == (500_000.0, 4.0)
    a, b = build_model(plain, seed=0), build_model(long, seed=0)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))  # same weights
    assert not torch.equal(a.rope_cos, b.rope_cos)  # other positions
    expected, _ = rotary_tables(long.head_dim, long.max_seq_len, 500_000.0, scale=4.0)
    torch.testing.assert_close(b.rope_cos, expected)
