"""A tiny end-to-end run: SFT on noisy instruction pairs, then RLVR with the generator in its own
process; RLVR must raise the verifiable reward on held-out prompts beyond noise (paired, 95%)."""

from __future__ import annotations

import copy

import pytest

from ito_assets.posttraining.evaluation import evaluate_reward
from ito_assets.posttraining.fixtures import instruction_pairs
from ito_assets.posttraining.gates import GateRule, GateSpec, judge
from ito_assets.posttraining.pipeline import PostTrainingRuntime, battery, policy_factory
from ito_assets.posttraining.rlvr import RlvrConfig, run_rlvr
from ito_assets.posttraining.sft import SftConfig, run_sft
from ito_assets.posttraining.vocab import CharVocab

RUNTIME = PostTrainingRuntime()
# Measured on this configuration (seed 0, three repeats): held-out avg@8 0.32 after SFT, 0.64-0.65
# after RLVR (paired SE 0.02); greedy accuracy 0.69 -> 0.76-0.81. The bar is half the measured gain.
MIN_GAIN = 0.15


@pytest.mark.slow
def test_rlvr_raises_held_out_reward():
    codec = CharVocab()
    factory = policy_factory(RUNTIME, codec)
    policy = factory()
    train, held_out = battery(RUNTIME)
    # A short, noisy SFT (40% wrong answers) leaves a policy that guesses: mixed groups for GRPO.
    pairs = instruction_pairs(train[:400], copies=1, seed=0, error_rate=0.4)
    run_sft(policy, codec, pairs, SftConfig(num_epochs=8, learning_rate=3e-3, batch_size=16))
    before = evaluate_reward(policy, codec, held_out, max_new_tokens=RUNTIME.max_new_tokens)

    config = RlvrConfig(num_steps=40, groups_per_step=8, group_size=8, max_new_tokens=RUNTIME.max_new_tokens,
                        overlong_cache=RUNTIME.overlong_cache, learning_rate=1e-3, max_staleness=1)
    result = run_rlvr(policy, copy.deepcopy(policy), codec, train[:400], config, policy_factory=factory)
    after = evaluate_reward(policy, codec, held_out, max_new_tokens=RUNTIME.max_new_tokens)

    verdict = judge("rlvr", before, after, GateSpec(rule=GateRule.IMPROVEMENT, min_gain=MIN_GAIN))
    assert verdict.passed, verdict.reason
    assert max(result.staleness.admitted) <= config.max_staleness
    assert result.num_weight_syncs == 1 + sum(1 for _ in result.steps)  # initial + one per optimizer step
    assert all(s.kl_to_reference >= 0 for s in result.steps)
