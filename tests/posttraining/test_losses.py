"""Each loss against values computed by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from ito_assets.posttraining.losses import (
    dapo_policy_loss, dpo_loss, group_advantages, overlong_penalty, sft_loss, truncated_importance_weights,
)


def test_sft_loss_averages_response_tokens_only():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, -1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    # Response targets: -2, -3, -4 -> NLL (2 + 3 + 4) / 3 = 3; prompt positions ignored.
    assert sft_loss(logprobs, mask).item() == pytest.approx(3.0)


def test_dpo_sigmoid_loss_by_hand():
    # Pair 1: margin = 0.5 * ((-1 - -3) - (-2 - -2)) = 1.0 -> -log s(1) = log(1 + e^-1) = 0.3132617
    # Pair 2: margin = 0.5 * ((-2 - -1) - 0) = -0.5 -> -log s(-0.5) = log(1 + e^0.5) = 0.9740770
    result = dpo_loss(torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.0]), torch.tensor([-2.0, -1.5]),
                      torch.tensor([-2.0, -1.5]), beta=0.5)
    assert result.loss.item() == pytest.approx((0.31326169 + 0.97407698) / 2, abs=1e-6)
    assert result.margins.tolist() == pytest.approx([1.0, -0.5])
    assert result.accuracy == 0.5


def test_dpo_label_smoothing_is_conservative_dpo():
    # e = 0.1, margin 1: 0.9 * log(1 + e^-1) + 0.1 * log(1 + e^1) = 0.2819355 + 0.1313262
    result = dpo_loss(torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.0]),
                      beta=0.5, label_smoothing=0.1)
    assert result.loss.item() == pytest.approx(0.41326169, abs=1e-6)


def test_rpo_adds_alpha_times_the_chosen_negative_log_likelihood():
    args = torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.0])
    plain = dpo_loss(*args, beta=0.5).loss.item()  # 0.31326169, as above
    nll = torch.tensor(0.75)
    assert dpo_loss(*args, beta=0.5, rpo_alpha=2.0, chosen_nll=nll).loss.item() == pytest.approx(plain + 1.5, abs=1e-6)
    assert dpo_loss(*args, beta=0.5, rpo_alpha=0.0, chosen_nll=nll).loss.item() == pytest.approx(plain, abs=1e-7)


def test_dpo_reference_gets_no_gradient():
    ref = torch.tensor([-2.0], requires_grad=True)
    policy = torch.tensor([-1.0], requires_grad=True)
    dpo_loss(policy, torch.tensor([-3.0]), ref, torch.tensor([-2.0]), beta=0.1).loss.backward()
    assert ref.grad is None and policy.grad is not None


def test_group_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    adv = group_advantages(rewards)
    # Group 1: mean 0.5, unbiased std sqrt(1/3) = 0.57735 -> +-0.5 / 0.57735 = +-0.866025
    assert adv[0].tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)
    # Group 2: mean 0.75, unbiased var (3 x 0.0625 + 0.5625) / 3 = 0.25 -> std 0.5
    assert adv[1].tolist() == pytest.approx([0.5, 0.5, 0.5, -1.5], abs=1e-5)
    # All equal: no signal at all.
    assert adv[2].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_overlong_penalty_by_hand():
    # L_max 10, L_cache 4 -> no penalty up to 6; (6 - L) / 4 in (6, 10]; -1 beyond.
    lengths = torch.tensor([3, 6, 7, 9, 10, 11])
    assert overlong_penalty(lengths, max_length=10, cache_length=4).tolist() == [0.0, 0.0, -0.25, -0.75, -1.0, -1.0]


def test_truncated_importance_weights_by_hand():
    proximal = torch.tensor([[math.log(0.5), math.log(0.2)]])
    behaviour = torch.tensor([[math.log(0.25), math.log(0.4)]])
    # 0.5 / 0.25 = 2 (capped at 1.5), 0.2 / 0.4 = 0.5
    assert truncated_importance_weights(proximal, behaviour, cap=1.5).tolist()[0] == pytest.approx([1.5, 0.5])
    assert truncated_importance_weights(proximal, behaviour, cap=2.0).tolist()[0] == pytest.approx([2.0, 0.5])


def _ratios_case():
    # Ratios pi / pi_old = [[1.5, 0.5], [0.9, 1.3]], advantages [1, -2]; row 2's second token masked.
    logprobs = torch.log(torch.tensor([[1.5, 0.5], [0.9, 1.3]])).requires_grad_()
    return logprobs, torch.zeros(2, 2), torch.tensor([1.0, -2.0]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])


def test_dapo_loss_clip_higher_and_token_level_mean():
    logprobs, proximal, advantages, mask = _ratios_case()
    result = dapo_policy_loss(logprobs, proximal, advantages, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    # Row 1 (A=1): min(1.5, clip(1.5)=1.28) = 1.28; min(0.5, clip(0.5)=0.8) = 0.5.
    # Row 2 (A=-2): min(-1.8, -1.8) = -1.8. Token mean over 3 tokens: (1.28 + 0.5 - 1.8) / 3.
    assert result.loss.item() == pytest.approx(-(1.28 + 0.5 - 1.8) / 3, abs=1e-6)
    assert result.clip_fraction == pytest.approx(1 / 3)
    assert result.num_tokens == 3
    # Symmetric clipping (PPO's 0.2) caps at 1.2 instead: clip-higher changes the value.
    symmetric = dapo_policy_loss(logprobs, proximal, advantages, mask, clip_eps_low=0.2, clip_eps_high=0.2)
    assert symmetric.loss.item() == pytest.approx(-(1.2 + 0.5 - 1.8) / 3, abs=1e-6)


def test_dapo_loss_gradient_vanishes_on_clipped_tokens():
    logprobs, proximal, advantages, mask = _ratios_case()
    dapo_policy_loss(logprobs, proximal, advantages, mask).loss.backward()
    grad = logprobs.grad
    assert grad[0, 0].item() == 0.0  # clipped at 1 + eps_high: no push further up
    assert grad[1, 1].item() == 0.0  # masked (truncated sample)
    # d/dlogp of -(ratio * A) / 3 = -ratio * A / 3
    assert grad[0, 1].item() == pytest.approx(-0.5 / 3)
    assert grad[1, 0].item() == pytest.approx(0.9 * 2 / 3)


def test_dapo_loss_with_importance_weights():
    logprobs, proximal, advantages, mask = _ratios_case()
    weights = torch.tensor([[2.0, 1.0], [0.5, 1.0]])
    result = dapo_policy_loss(logprobs, proximal, advantages, mask, importance_weights=weights)
    # (2 x 1.28 + 0.5 + 0.5 x -1.8) / 3 = (2.56 + 0.5 - 0.9) / 3
    assert result.loss.item() == pytest.approx(-(2.56 + 0.5 - 0.9) / 3, abs=1e-6)


def test_all_truncated_batch_has_zero_loss():
    logprobs, proximal, advantages, _ = _ratios_case()
    result = dapo_policy_loss(logprobs, proximal, advantages, torch.zeros(2, 2))
    assert result.loss.item() == 0.0 and result.num_tokens == 0


@pytest.mark.parametrize("bad", [{"beta": 0.0}, {"beta": 0.1, "label_smoothing": 0.5},
                                 {"beta": 0.1, "rpo_alpha": -0.01, "chosen_nll": torch.tensor(1.0)},
                                 {"beta": 0.1, "rpo_alpha": 1.0}])
def test_dpo_rejects_bad_hyperparameters(bad):
    one = torch.tensor([0.0])
    with pytest.raises(ValueError):
        dpo_loss(one, one, one, one, **bad)
