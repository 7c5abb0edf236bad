"""The eval battery decodes prompts of one length together: every prompt's figures land on its own
task, whatever the mix of lengths and however many prompts share a batch, and the KL to the
reference counts each completion's own tokens."""

from __future__ import annotations

import pytest
import torch

from ito_assets.posttraining import evaluation
from ito_assets.posttraining.evaluation import evaluate_reward, sampled_kl
from ito_assets.posttraining.tasks import Task
from ito_assets.posttraining.vocab import CharVocab

CODEC = CharVocab()
EQUALS, BANG = CODEC.encode("=")[0], CODEC.encode("!")[0]
DIGITS = {CODEC.encode(str(d))[0]: d for d in range(10)}


class Oracle(torch.nn.Module):
    """After "=": the largest digit of a three-digit prompt, the smallest of a shorter one; an odd
    answer is followed by "!" (a longer completion that scores nothing); then eos. `sharpness`
    1e4 makes sampling at temperature 1 deterministic; a small one is a soft reference."""

    def __init__(self, sharpness: float = 1e4):
        super().__init__()
        self.sharpness = sharpness

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*tokens.shape, CODEC.vocab_size)  # (B, T, V)
        for b, row in enumerate(tokens.tolist()):
            equals = row.index(EQUALS) if EQUALS in row else len(row)
            digits = [DIGITS[t] for t in row[:equals] if t in DIGITS]
            answer = (max if len(digits) == 3 else min)(digits) if digits else 0
            for t in range(len(row)):
                written = row[equals + 1 : t + 1]
                if t < equals:
                    nxt = CODEC.eos_id
                elif not written:
                    nxt = CODEC.encode(str(answer))[0]
                elif len(written) == 1 and answer % 2:
                    nxt = BANG
                else:
                    nxt = CODEC.eos_id
                logits[b, t, nxt] = self.sharpness
        return logits


def _task(digits: str) -> Task:
    return Task(task_id=f"max/{digits}", family="exact_match", prompt=f"max {digits}=", answer=max(digits))


# Three-digit and two-digit prompts interleaved: two lengths, each in batches of its own.
TASKS = [_task(d) for d in ("482", "13", "629", "75", "801", "24", "357", "96", "406")]
EXPECTED = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]  # three digits with an even largest one


@pytest.mark.parametrize("batch_prompts", [1, 2, 3, 32])
def test_each_prompts_reward_lands_on_its_own_task_whatever_the_batch(monkeypatch, batch_prompts):
    monkeypatch.setattr(evaluation, "EVAL_BATCH_PROMPTS", batch_prompts)
    result = evaluate_reward(Oracle(), CODEC, TASKS, max_new_tokens=4, num_samples=3)
    assert list(result.per_task) == EXPECTED
    assert result.greedy_accuracy == pytest.approx(3 / 9) and result.num_tasks == 9


def test_the_kl_counts_each_completions_own_tokens_whatever_the_batch(monkeypatch):
    policy, reference = Oracle(), Oracle(sharpness=2.0)
    assert sampled_kl(policy, policy, CODEC, TASKS, max_new_tokens=4, num_samples=2) == 0.0
    figures = []
    for batch_prompts in (1, 3, 32):
        monkeypatch.setattr(evaluation, "EVAL_BATCH_PROMPTS", batch_prompts)
        figures.append(sampled_kl(policy, reference, CODEC, TASKS, max_new_tokens=4, num_samples=2))
    # By hand: every target is the policy's point mass; the reference gives it e^2 / (e^2 + V - 1).
    log_ratio = torch.log(torch.tensor(2.0).exp() / (torch.tensor(2.0).exp() + CODEC.vocab_size - 1))
    per_token = float(torch.expm1(log_ratio) - log_ratio)
    assert figures == pytest.approx([per_token] * 3, rel=1e-5)


def test_the_batches_group_one_length_in_order_and_stop_at_the_size(monkeypatch):
    monkeypatch.setattr(evaluation, "EVAL_BATCH_PROMPTS", 2)
    prompts = [[1] * n for n in (3, 2, 3, 3, 2, 3)]
    assert list(evaluation._same_length_batches(prompts)) == [[0, 2], [3, 5], [1, 4]]
    monkeypatch.setattr(evaluation, "EVAL_BATCH_PROMPTS", 4)
    assert list(evaluation._same_length_batches(prompts)) == [[0, 2, 3, 5], [1, 4]]
    monkeypatch.setattr(evaluation, "EVAL_BATCH_PROMPTS", 3)
    assert list(evaluation._same_length_batches(prompts)) == [[0, 2, 3], [5], [1, 4]]


def test_a_huge_ratio_on_padding_leaves_the_kl_finite():
    policy = torch.tensor([[-0.5, -1e4]])  # (N, L): the second position is padding
    reference = torch.tensor([[-1.0, -1.0]])
    mask = torch.tensor([[1.0, 0.0]])
    log_ratio = torch.tensor(-0.5)
    assert evaluation.kl_to_reference(policy, reference, mask) == pytest.approx(float(torch.expm1(log_ratio) - log_ratio))
