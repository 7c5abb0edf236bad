"""Parameter and FLOP counts, exact, against the module and against published model sizes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ito_assets.training.model import DecoderLM, build_model
from ito_assets.training.model_config import (
    CONFIGS, ModelConfig, config_by_name, flops_per_token, matmul_parameter_count, parameter_count,
)

# Published totals: Llama 3 (Meta's model cards: 8.03B / 70.6B, exact from params.json shapes),
# OLMo-1B (Groeneveld et al. 2024: 1,176,832,000), and the DataDecide 150M shape at V = 50,304.
PUBLISHED = {
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "olmo-1b": 1_176_832_000,
    "proxy-150m": 151_898_880,
}


@pytest.mark.parametrize("name,expected", sorted(PUBLISHED.items()))
def test_parameter_count_matches_published_sizes(name, expected):
    assert parameter_count(CONFIGS[name]) == expected


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameter_count_equals_the_module(name):
    with torch.device("meta"):  # no memory: shapes only
        model = DecoderLM(CONFIGS[name])
    assert model.num_parameters() == parameter_count(CONFIGS[name])


def test_gelu_and_untied_variants_count_exactly():
    config = replace(CONFIGS["micro"], mlp="gelu", tie_embeddings=False, num_kv_heads=1)
    assert build_model(config, seed=0).num_parameters() == parameter_count(config)


def test_proxy_150m_shape_is_datadecide():
    config = CONFIGS["proxy-150m"]
    assert (config.num_layers, config.d_model, config.num_heads, config.vocab_size) == (12, 768, 12, 50_304)
    assert parameter_count(config, include_embedding=False) == 113_265_408


def test_flops_per_token_is_6n_plus_attention():
    config = CONFIGS["proxy-150m"]
    n = 12 * (4 * 768 * 768 + 3 * 768 * 3072) + 50_304 * 768  # matmul weights incl. the head
    assert matmul_parameter_count(config) == n
    assert flops_per_token(config, 2048) == 6 * n + 12 * 12 * 768 * 2048


def test_forward_shapes_and_seeded_initialisation():
    config = CONFIGS["micro"]
    a, b = build_model(config, seed=3), build_model(config, seed=3)
    tokens = torch.randint(0, config.vocab_size, (2, 16))
    assert a(tokens).shape == (2, 16, config.vocab_size)
    assert torch.equal(a(tokens), b(tokens))
    assert not torch.equal(a(tokens), build_model(config, seed=4)(tokens))
    assert a.head.weight is a.embedding.weight


def test_causality():
    model = build_model(CONFIGS["micro"], seed=0).eval()
    tokens = torch.randint(0, 512, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 512
    assert torch.allclose(model(tokens)[0, :8], model(changed)[0, :8], atol=1e-6)


@pytest.mark.parametrize(
    "changes,field",
    [({"d_model": 30}, "d_model"), ({"num_kv_heads": 3, "num_heads": 2, "d_model": 32}, "num_kv_heads"),
     ({"vocab_size": 0}, "vocab_size"), ({"mlp": "relu"}, "mlp")],
)
def test_config_validation_names_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**{**vars(CONFIGS["micro"]), **changes})


def test_unknown_config_name():
    with pytest.raises(ValueError, match="model config"):
        config_by_name("gpt-5")
