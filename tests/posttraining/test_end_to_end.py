"""Tiny end-to-end runs: SFT on noisy instruction pairs, then RLVR with the generator in its own
process; RLVR must raise the verifiable reward on held-out prompts beyond noise (paired, 95%).
Once with the seeded `micro` model and the character vocabulary (the loops alone), and in
`make test-long` once from a pretraining checkpoint with its BPE tokenizer through `run_stage`
(what the Dagster stages run; `make test` runs those stages through Dagster in
test_posttraining_defs.py)."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import pytest

from ito_assets.posttraining.evaluation import evaluate_reward
from ito_assets.posttraining.fixtures import instruction_pairs
from ito_assets.posttraining.eval_gate import GateRule, GateSpec, judge_rewards
from ito_assets.manifest.schema import PostTrainingEval, RlvrStep, SftStep
from ito_assets.posttraining.base import pretrained, seeded
from ito_assets.posttraining.pipeline import battery, run_stage
from ito_assets.posttraining.stage import PostTrainingRuntime
from ito_assets.posttraining.rlvr import RlvrConfig, run_rlvr
from ito_assets.posttraining.sft import SftConfig, run_sft
from ito_assets.posttraining.vocab import CharVocab
from posttraining.pretrained_checkpoint import make_pretrained

ROOT = Path(__file__).resolve().parents[2]

RUNTIME = PostTrainingRuntime()
EVALUATION = PostTrainingEval()  # the battery's sizes: the manifest's defaults, 200 prompts and 8 tokens
# Measured on this configuration (seed 0, three repeats): held-out avg@8 0.32 after SFT, 0.64-0.65
# after RLVR (paired SE 0.02); greedy accuracy 0.69 -> 0.76-0.81. The bar is half the measured gain.
MIN_GAIN = 0.15


@pytest.mark.slow
def test_rlvr_raises_held_out_reward():
    codec = CharVocab()
    factory = seeded().factory()
    policy = factory()
    train, held_out = battery()
    # A short, noisy SFT (40% wrong answers) leaves a policy that guesses: mixed groups for GRPO.
    pairs = instruction_pairs(train[:400], copies=1, seed=0, error_rate=0.4)
    run_sft(policy, codec, pairs, SftConfig(num_epochs=8, learning_rate=3e-3, batch_size=16))
    before = evaluate_reward(policy, codec, held_out, max_new_tokens=EVALUATION.max_new_tokens)

    # L_max 8 and L_cache 4: the recipe's defaults (RlvrStep), the battery's completion length too.
    config = RlvrConfig(num_steps=40, groups_per_step=8, group_size=8, max_new_tokens=8, overlong_cache=4,
                        learning_rate=1e-3, max_staleness=1)
    result = run_rlvr(policy, copy.deepcopy(policy), codec, train[:400], config, policy_factory=factory)
    after = evaluate_reward(policy, codec, held_out, max_new_tokens=EVALUATION.max_new_tokens)

    verdict = judge_rewards("rlvr", before, after, GateSpec(rule=GateRule.IMPROVEMENT, min_gain=MIN_GAIN))
    assert verdict.passed, verdict.reason
    assert max(result.staleness.admitted) <= config.max_staleness
    assert result.num_weight_syncs == 1 + sum(1 for _ in result.steps)  # initial + one per optimizer step
    assert all(s.kl_to_reference >= 0 for s in result.steps)


# Measured on this configuration (tiny model after 30 pretraining steps): on the first machine, seed 0
# four times, held-out avg@8 0.127 after SFT and 0.386-0.426 after RLVR (gain +0.26 to +0.30, paired
# SE 0.024-0.029). On a later 2-core AMD EPYC machine, with the same code, tokenizer and SFT result,
# seeds 0-2 gained +0.11, +0.14 and +0.19 (SE ~0.018): the RL trajectory depends on the machine's
# arithmetic. The bar is about half the smallest measured gain.
BPE_MIN_GAIN = 0.05


@pytest.mark.slow
@pytest.mark.long  # 45-80 s on two cores: pretraining, SFT and RLVR with the BPE tokenizer
def test_rlvr_raises_held_out_reward_from_a_pretrained_checkpoint(tmp_path):
    """The Dagster path without Dagster: the pretraining chain's DCP checkpoint and BPE tokenizer,
    the manifest's steps bound to the committed pair file, SFT then RLVR through `run_stage`."""
    base = make_pretrained(tmp_path / "pretrained", num_steps=30)
    spec = pretrained(model_name="tiny", vocab_size=base.tokens.vocab_size, checkpoint=base.checkpoint,
                      tokenizer=base.tokenizer)
    sft_file = ROOT / "data" / "fixtures" / "posttraining" / "sft_pairs.jsonl"
    data = {"uri": "dataroot://fixtures/posttraining/sft_pairs.jsonl", "format": "jsonl", "license": "CC0-1.0",
            "sha256": hashlib.sha256(sft_file.read_bytes()).hexdigest()}
    sft = SftStep.model_validate({"kind": "sft", "learning_rate": 3e-3, "data": data})
    rlvr = RlvrStep.model_validate({"kind": "rlvr", "learning_rate": 1e-3, "group_size": 8, "max_staleness": 1})
    after_sft = run_stage(sft, start=spec, data_root=ROOT / "data", out_dir=tmp_path / "out", runtime=RUNTIME)
    assert after_sft.gate.passed, after_sft.gate.reason
    after_rlvr = run_stage(rlvr, start=after_sft, data_root=ROOT / "data", out_dir=tmp_path / "out", runtime=RUNTIME)
    verdict = judge_rewards("rlvr", after_rlvr.eval_before, after_rlvr.eval_after,
                    GateSpec(rule=GateRule.IMPROVEMENT, min_gain=BPE_MIN_GAIN))
    assert verdict.passed, verdict.reason
    assert after_rlvr.policy == spec  # the whole chain keeps the pretrained architecture and tokenizer
    assert max(int(k) for k in after_rlvr.metrics["staleness"]["admitted_by_staleness"]) <= rlvr.max_staleness
