"""One AdamW builder and one optimizer step for pretraining and post-training: the two differ only
in their hyperparameters."""

from __future__ import annotations

import pytest
import torch

from ito_assets.posttraining import optim as post_optim
from ito_assets.training import optim
from ito_assets.training.model import build_model, config_by_name
from ito_assets.training.trainer import TrainConfig, build_optimizer


def _model():
    return build_model(config_by_name("micro", vocab_size=64), seed=0)


def _groups(optimizer: torch.optim.Optimizer) -> list[tuple[list[int], float]]:
    return [([id(p) for p in g["params"]], g["weight_decay"]) for g in optimizer.param_groups]


def test_matrices_decay_and_gains_do_not_on_the_bit_stable_cpu_path():
    model = _model()
    optimizer = optim.adamw(model, learning_rate=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    (decay, rate), (rest, zero) = _groups(optimizer)
    assert rate == 0.1 and zero == 0.0
    assert {id(p) for p in model.parameters() if p.dim() >= 2} == set(decay)
    assert {id(p) for p in model.parameters() if p.dim() < 2} == set(rest) and rest
    assert optimizer.defaults["foreach"] is False and not optimizer.defaults["fused"]


def test_pretraining_and_post_training_build_the_same_optimizer_with_their_own_settings():
    model = _model()
    config = TrainConfig(num_steps=1, batch_size=1, sequence_length=8)
    pre = build_optimizer(model, config)
    post = post_optim.adamw(model, learning_rate=config.learning_rate)
    shared = optim.adamw(model, learning_rate=config.learning_rate, betas=post_optim.BETAS, weight_decay=0.0)
    assert _groups(post) == _groups(shared)
    assert [g["params"] for g in pre.param_groups] == [g["params"] for g in post.param_groups]
    assert pre.defaults["betas"] == (0.9, 0.95) and pre.param_groups[0]["weight_decay"] == 0.1
    assert post.defaults["betas"] == (0.9, 0.999) and post.param_groups[0]["weight_decay"] == 0.0


@pytest.mark.parametrize("learning_rate", [0.0, 1.0, -1e-3])
def test_a_rate_outside_zero_one_is_refused(learning_rate):
    with pytest.raises(ValueError, match="learning_rate"):
        optim.adamw(_model(), learning_rate=learning_rate, betas=(0.9, 0.999), weight_decay=0.0)


def test_a_step_returns_the_norm_before_clipping_and_clips_the_update():
    model = _model()
    optimizer = optim.adamw(model, learning_rate=1e-3, betas=(0.9, 0.999), weight_decay=0.0)
    x = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    loss = model.loss(x, torch.roll(x, -1, 1))
    seen = []  # the gradients as the update reads them (the step frees them afterwards)
    optimizer.register_step_pre_hook(lambda *_: seen.append(torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()]))))
    norm = optim.optimizer_step(model, optimizer, loss, grad_clip=1e-6)
    assert norm > 1e-6
    assert float(seen[0]) == pytest.approx(1e-6, rel=1e-3)


def test_a_step_frees_its_gradients_before_the_next_forward_pass():
    model = _model()
    optimizer = optim.adamw(model, learning_rate=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    tokens = torch.randint(0, 64, (2, 9))
    norm = optim.optimizer_step(model, optimizer, model.loss(tokens[:, :-1], tokens[:, 1:]), grad_clip=1.0)
    assert norm > 0
    assert all(p.grad is None for p in model.parameters())  # nothing held while the next batch runs
