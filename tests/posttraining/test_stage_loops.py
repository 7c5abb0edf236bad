"""The SFT and DPO loops, batching, collation, checkpoints and gates on small inputs."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.checkpoint import load_policy, save_policy
from ito_assets.posttraining.dpo import DpoConfig, dpo_rows, run_dpo
from ito_assets.posttraining.losses import answer_logprobs
from ito_assets.posttraining.evaluation import RewardEval, kl_to_reference
from ito_assets.posttraining.fixtures import (
    InstructionPair, instruction_pairs, preference_pairs, read_instruction_pairs, read_preference_pairs,
)
from ito_assets.posttraining.eval_gate import BATTERY, GateRule, GateSpec, judge_rewards, require_passed
from ito_assets.posttraining.base import seeded
from ito_assets.posttraining.pipeline import battery
from ito_assets.posttraining.rollouts import Group, Rollout, collate
from ito_assets.posttraining.sft import SftConfig, response_batch, run_sft
from ito_assets.posttraining.vocab import CharVocab

ROOT = Path(__file__).resolve().parents[2]
VOCAB = CharVocab()


def _policy():
    return seeded().factory()()


def test_response_batch_masks_prompt_and_padding():
    tokens, mask = response_batch(VOCAB, ["ab", "a"], ["c", "de"])
    # Row 0: bos a b c eos (5 tokens); targets 1..4 are a b c eos, response = c, eos.
    assert tokens.shape == (2, 5) and mask.shape == (2, 4)
    assert mask[0].tolist() == [0.0, 0.0, 1.0, 1.0]
    # Row 1: bos a d e eos; response d e eos.
    assert mask[1].tolist() == [0.0, 1.0, 1.0, 1.0]
    assert tokens[0, -1].item() == VOCAB.eos_id and VOCAB.decode(tokens[1].tolist()) == "ade"


def test_collate_aligns_behaviour_logprobs_and_masks_truncated():
    done = Rollout(prompt_ids=(1, 5), completion_ids=(7, 2), behaviour_logprobs=(-0.5, -0.25), truncated=False,
                   score=1.0, reward=1.0)
    cut = Rollout(prompt_ids=(1, 5), completion_ids=(7, 7, 7), behaviour_logprobs=(-1.0, -1.0, -1.0), truncated=True,
                  score=0.0, reward=-1.0)
    batch = collate([Group(task_id="t", policy_version=3, rollouts=(done, cut))], pad_id=0)
    assert batch.tokens.tolist() == [[1, 5, 7, 2, 0], [1, 5, 7, 7, 7]]
    # Completion token j sits at position 2 + j and is predicted at position 1 + j.
    assert batch.behaviour_logprobs[0].tolist() == [0.0, -0.5, -0.25, 0.0]
    assert batch.loss_mask.tolist() == [[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert batch.rewards.tolist() == [1.0, -1.0] and batch.policy_versions.tolist() == [3, 3]


def test_sft_lowers_the_response_loss():
    pairs = [InstructionPair(pair_id=str(i), prompt=f"max {i:03d}=", response=max(f"{i:03d}")) for i in range(64)]
    result = run_sft(_policy(), VOCAB, pairs, SftConfig(num_epochs=4, learning_rate=3e-3, batch_size=16))
    assert result.num_steps == 16 and result.num_response_tokens == 64 * 4 * 2  # answer + eos
    assert result.losses[-1] < 0.7 * result.losses[0]


def test_dpo_prefers_chosen_and_leaves_the_reference_alone():
    train, _ = battery()
    pairs = preference_pairs(train[:64], copies=1, seed=0)
    policy = _policy()
    reference = copy.deepcopy(policy)
    frozen = {k: v.clone() for k, v in reference.state_dict().items()}
    result = run_dpo(policy, reference, VOCAB, pairs, DpoConfig(learning_rate=3e-3, batch_size=16, num_epochs=3))
    assert result.losses[0] == pytest.approx(0.6931, abs=1e-3)  # margin 0 at the start: log 2
    assert result.losses[-1] < result.losses[0] and result.accuracies[-1] > 0.5
    assert all(torch.equal(frozen[k], v) for k, v in reference.state_dict().items())


def _chosen_nll(policy, pairs) -> float:
    """The chosen answers' NLL per token, averaged over the pairs (RPO's term)."""
    rows = torch.from_numpy(dpo_rows(VOCAB, pairs)).long()
    with torch.no_grad():
        sums, lengths = answer_logprobs(policy, rows[:, :, 0], rows[:, :, 1])
    return float((-sums[:, 0] / lengths[:, 0]).mean())


def test_the_chosen_answers_log_likelihood_term_keeps_dpo_from_lowering_them():
    """From an SFT policy, plain DPO lowers the chosen answers' likelihood along with the rejected
    ones' (the mass goes elsewhere); with rpo_alpha 1 the chosen answers become likelier."""
    train, _ = battery()
    pairs = preference_pairs(train[:64], copies=1, seed=0)
    sft = _policy()
    run_sft(sft, VOCAB, [InstructionPair(pair_id=p.pair_id, prompt=p.prompt, response=p.chosen) for p in pairs],
            SftConfig(num_epochs=8, learning_rate=3e-3, batch_size=16))
    start = _chosen_nll(sft, pairs)
    after = {}
    for alpha in (0.0, 1.0):
        policy = copy.deepcopy(sft)
        result = run_dpo(policy, copy.deepcopy(sft), VOCAB, pairs,
                         DpoConfig(learning_rate=3e-3, batch_size=16, num_epochs=3, rpo_alpha=alpha))
        assert result.accuracies[-1] > 0.5
        after[alpha] = _chosen_nll(policy, pairs)
    assert after[0.0] > start > after[1.0], (start, after)


def test_checkpoint_round_trip_and_tamper_detection(tmp_path):
    policy = _policy()
    record = save_policy(policy, tmp_path / "sft" / "policy.pt", stage="sft", policy_version=12)
    other = seeded(seed=1).factory()()
    load_policy(other, record)
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), other.state_dict().values()))
    with open(record.path, "ab") as handle:
        handle.write(b"x")
    with pytest.raises(ItoError) as caught:
        load_policy(other, record)
    assert caught.value.code is ErrorCode.CHECKPOINT_DIGEST_MISMATCH


def test_checkpoint_swapped_after_its_digest_check_is_never_loaded(tmp_path, monkeypatch):
    """The file is replaced by another valid checkpoint between the digest check and the load
    (torch.load is where a second read would happen): the weights loaded are the checked ones."""
    policy = _policy()
    record = save_policy(policy, tmp_path / "sft" / "policy.pt", stage="sft", policy_version=12)
    swapped = seeded(seed=2).factory()()
    impostor = save_policy(swapped, tmp_path / "other" / "policy.pt", stage="sft", policy_version=1)
    real_load = torch.load

    def swap_then_load(source, *args, **kwargs):
        Path(impostor.path).replace(record.path)
        return real_load(source, *args, **kwargs)

    monkeypatch.setattr(torch, "load", swap_then_load)
    loaded = load_policy(seeded(seed=1).factory()(), record)
    assert Path(record.path).read_bytes() != b"" and not Path(impostor.path).exists()  # the swap happened
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), loaded.state_dict().values()))
    assert not all(torch.equal(a, b) for a, b in zip(swapped.state_dict().values(), loaded.state_dict().values()))

def _eval(per_task: list[float], variance: float = 0.0) -> RewardEval:
    """`variance`: each prompt's variance over its 8 draws (0: every draw scored alike)."""
    return RewardEval(mean_reward=sum(per_task) / len(per_task), per_task=tuple(per_task),
                      per_task_variance=(variance,) * len(per_task), greedy_accuracy=0.0, num_tasks=len(per_task),
                      num_samples=8)


def test_gate_rules():
    before = _eval([0.5, 0.5, 0.5, 0.5])
    up = _eval([0.75, 0.75, 0.625, 0.75])  # diffs .25 .25 .125 .25: mean .21875, SE .03125
    assert judge_rewards("rlvr", before, up, BATTERY["rlvr"]).passed
    assert not judge_rewards("rlvr", before, up, GateSpec(rule=GateRule.IMPROVEMENT, min_gain=0.2)).passed
    flat = _eval([0.5, 0.5, 0.5, 0.5])
    assert not judge_rewards("sft", before, flat, BATTERY["sft"]).passed  # no rise is not a rise
    assert judge_rewards("dpo", before, flat, BATTERY["dpo"]).passed
    noisy_drop = _eval([0.25, 0.75, 0.5, 0.375])  # mean drop .03125, SE .1 : within noise
    assert judge_rewards("dpo", before, noisy_drop, BATTERY["dpo"]).passed
    clear_drop = _eval([0.25, 0.25, 0.125, 0.25])
    verdict = judge_rewards("dpo", before, clear_drop, BATTERY["dpo"])
    assert not verdict.passed
    with pytest.raises(ItoError) as caught:
        require_passed(verdict)
    assert caught.value.code is ErrorCode.EVAL_GATE_FAILED


def test_the_gate_counts_sampling_noise_where_prompts_move_alike():
    # Two prompts, each one right draw in eight after none before: the differences agree (spread 0),
    # but one lucky draw each is what sampling gives. Draws 1,0,...,0 have variance 1/8.
    before, after = _eval([0.0, 0.0]), _eval([0.125, 0.125], variance=0.125)
    verdict = judge_rewards("sft", before, after, BATTERY["sft"])
    assert verdict.standard_error == pytest.approx((2 * 0.125 / 8) ** 0.5 / 2)  # 0.0884
    assert not verdict.passed and "SE 0.0884" in verdict.reason
    # The same rise on 16 prompts clears the noise (SE 0.0313: 0.125 - 1.96 x 0.0313 = 0.064).
    assert judge_rewards("sft", _eval([0.0] * 16), _eval([0.125] * 16, variance=0.125), BATTERY["sft"]).passed
    # DPO: a drop every prompt shares is a drop only beyond the draws' noise.
    assert judge_rewards("dpo", _eval([0.5, 0.5], variance=2 / 7), _eval([0.375, 0.375], variance=0.27),
                         BATTERY["dpo"]).passed
    assert not judge_rewards("dpo", _eval([0.5] * 32, variance=2 / 7), _eval([0.375] * 32, variance=0.27),
                             BATTERY["dpo"]).passed


def test_an_evaluation_stored_before_its_variances_were_recorded_is_judged_on_the_spread():
    # A previous stage's "after", pickled by an older release, has no variances: the stage that
    # follows trained, then failed reading them.
    import pickle

    stored = _eval([0.5, 0.5, 0.5, 0.5], variance=0.2)
    old = pickle.loads(pickle.dumps(stored))
    del old.__dict__["per_task_variance"]  # as an older release's pickle restores it
    up = _eval([0.75, 0.75, 0.625, 0.75], variance=0.2)
    verdict = judge_rewards("rlvr", old, up, BATTERY["rlvr"])
    assert verdict.passed and verdict.standard_error == pytest.approx(0.03125)
    assert judge_rewards("rlvr", stored, up, BATTERY["rlvr"]).standard_error > 0.03125


def test_the_gate_takes_the_larger_of_the_spread_and_the_sampling_noise():
    before = _eval([0.5, 0.5, 0.5, 0.5], variance=0.01)
    spread = _eval([0.25, 0.75, 0.5, 0.375], variance=0.01)  # the spread's SE .1067 > sampling's .025
    assert judge_rewards("dpo", before, spread, BATTERY["dpo"]).standard_error == pytest.approx(0.1067, abs=1e-4)
    alike = _eval([0.375] * 4, variance=0.01)  # no spread: sampling's sqrt(4 x .02 / 8) / 4 = .025
    assert judge_rewards("dpo", before, alike, BATTERY["dpo"]).standard_error == pytest.approx(0.025)


def test_kl_estimator_by_hand():
    # log r = ref - policy = [log 2, 0]; k3 = (r - 1) - log r = (1 - 0.693147) and 0; mean over 2 tokens.
    policy = torch.tensor([[0.0, -1.0]])
    reference = torch.tensor([[0.693147, -1.0]])
    assert kl_to_reference(policy, reference, torch.ones(1, 2)) == pytest.approx((1 - 0.693147) / 2, abs=1e-5)


def test_committed_fixtures_are_what_the_script_writes(tmp_path):
    folder = ROOT / "data" / "fixtures" / "posttraining"
    sft, dpo = read_instruction_pairs(folder / "sft_pairs.jsonl"), read_preference_pairs(folder / "dpo_pairs.jsonl")
    train, held_out = battery()
    assert sft == instruction_pairs(train, copies=2, seed=20241129, error_rate=0.3)
    assert dpo == preference_pairs(train, copies=1, seed=20241130)
    held = {t.prompt for t in held_out}
    assert not held & {p.prompt for p in sft} and not held & {p.prompt for p in dpo}
    assert all(p.chosen != p.rejected for p in dpo)


def test_malformed_fixture_is_refused(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text('{"pair_id": "a", "prompt": "x"}\n')
    with pytest.raises(ItoError) as caught:
        read_instruction_pairs(path)
    assert caught.value.code is ErrorCode.POSTTRAINING_DATA_INVALID


def test_fixture_script_is_deterministic(tmp_path):
    script = ROOT / "scripts" / "make_posttraining_fixtures.py"
    assert script.is_file()
    folder = ROOT / "data" / "fixtures" / "posttraining"
    before = {name: (folder / name).read_bytes() for name in ("sft_pairs.jsonl", "dpo_pairs.jsonl")}
    subprocess.run([sys.executable, str(script)], check=True, capture_output=True, timeout=120)
    assert before == {name: (folder / name).read_bytes() for name in before}
