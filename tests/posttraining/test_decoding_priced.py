"""The plan's count of the host's forwards holds every forward the runtime makes: the evaluation
after a stage (the reward's sampled and greedy decoding, the KL's sampling and scoring) and RLVR's
generation, counted on the real battery through a policy that records its calls."""

from __future__ import annotations

import copy
import random

import torch

from ito_assets.manifest.schema import PostTrainingEval, RlvrStep
from ito_assets.posttraining import plan
from ito_assets.posttraining.base import seeded
from ito_assets.posttraining.decoding import encode_prompt
from ito_assets.posttraining.evaluation import _same_length_batches, evaluate_reward, sampled_kl
from ito_assets.posttraining.generation import GenerationConfig, make_group
from ito_assets.posttraining.pipeline import battery
from ito_assets.training.hardware import gpu_spec, network_spec
from ito_assets.training.model import DecoderLM
from ito_assets.training.model_config import config_by_name
from ito_assets.training.planner import Hardware

HARDWARE = Hardware(gpu=gpu_spec("H100-SXM"), network=network_spec("infiniband"), num_nodes=1, gpus_per_node=8,
                    price_cents_per_gpu_hour=250)


class Counting(DecoderLM):
    calls = 0

    def forward(self, tokens, cache=None):
        Counting.calls += 1
        return super().forward(tokens, cache)


def _policy() -> Counting:
    spec = seeded()
    torch.manual_seed(0)
    return Counting(config_by_name(spec.model_name, vocab_size=spec.vocab_size)).eval()


def test_the_evaluation_after_a_stage_makes_no_more_forwards_than_planned():
    sizes = PostTrainingEval(num_prompts=200, max_new_tokens=4)
    _, held_out = battery(sizes)
    policy, codec = _policy(), seeded().codec()
    reference = copy.deepcopy(policy)
    batches = list(_same_length_batches([encode_prompt(codec, task.prompt) for task in held_out]))
    Counting.calls = 0
    evaluate_reward(policy, codec, held_out, max_new_tokens=sizes.max_new_tokens)
    sampled_kl(policy, reference, codec, held_out, max_new_tokens=sizes.max_new_tokens)
    # The seed's weights rarely stop early: every batch decodes (nearly) to its limit.
    assert len(batches) * (3 + 2) <= Counting.calls <= len(batches) * (3 * sizes.max_new_tokens + 2)
    assert Counting.calls <= plan.evaluation_forwards(sizes, first=False)


def test_rlvrs_generation_makes_no_more_forwards_than_planned():
    train, _ = battery()
    policy, codec = _policy(), seeded().codec()
    # One draw a group: the groups priced are the groups made here (10 a group would price 10x them).
    step = RlvrStep(kind="rlvr", num_steps=1, groups_per_step=5, group_size=8, max_new_tokens=6, overlong_cache=3,
                    max_draws_per_group=1)
    [planned] = plan.plan_post_training([step], policy.config, HARDWARE, {}, PostTrainingEval())
    config = GenerationConfig(group_size=step.group_size, max_new_tokens=step.max_new_tokens,
                              overlong_cache=step.overlong_cache)
    generator, rng = torch.Generator().manual_seed(0), random.Random(0)
    Counting.calls = 0
    # The 5 groups its step draws, then a full queue of 5 and the one in hand when training stops.
    made = plan.generated_groups(step)
    for _ in range(made):
        make_group(policy, codec, train[rng.randrange(len(train))], version=0, config=config, generator=generator)
    assert made < Counting.calls <= planned.host_forwards == (5 + 5 + 1) * 6
