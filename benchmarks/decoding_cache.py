"""Decoding through the KV cache against feeding the whole prefix each token (the baseline, in the
same run), and both against what the post-training plan prices for the same work.

    .venv/bin/python benchmarks/decoding_cache.py [--models micro tiny] [--new-tokens 8] [--groups 32]

Two workloads, one thread, CPU seconds (`time.process_time`):
- the evaluation battery after a stage (the reward's samples and greedy answers, then the KL's
  samples and forwards): the held-out prompts of `post_training_eval`, at each `--new-tokens`;
- RLVR's generation: `--groups` groups of `group_size` completions of one prompt each.
The weights are the seed's (completions ramble to their limit, the worst case). The baseline's time
grows with the square of the length: `--models micro --new-tokens 64` runs in about a minute,
`tiny` at 64 ran past 8 minutes and was stopped (2-core VM). The greedy answers must agree both
ways; the planned seconds are the price the plan puts on that work (its FLOPs and its forwards'
fixed cost), which must not be below the measured one.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ito_assets.manifest.schema import PostTrainingEval, RlvrStep  # noqa: E402
from ito_assets.posttraining import plan  # noqa: E402
from ito_assets.posttraining.base import seeded  # noqa: E402
from ito_assets.posttraining.evaluation import evaluate_reward, sampled_kl  # noqa: E402
from ito_assets.posttraining.generation import GenerationConfig, make_group  # noqa: E402
from ito_assets.posttraining.pipeline import battery  # noqa: E402
from ito_assets.training.hardware import gpu_spec, network_spec  # noqa: E402
from ito_assets.training.model_config import config_by_name  # noqa: E402
from ito_assets.training.planner import Hardware  # noqa: E402

# Any booking: the generation's price is the host's.
HARDWARE = Hardware(gpu=gpu_spec("H100-SXM"), network=network_spec("infiniband"), num_nodes=1, gpus_per_node=8,
                    price_cents_per_gpu_hour=250)


class WholePrefix(torch.nn.Module):
    """The policy without `new_cache`: decoding then feeds it the whole prefix every token."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)


def _cpu_seconds(run) -> tuple[float, object]:
    started = time.process_time()
    result = run()
    return time.process_time() - started, result


def _against_plan(planned: float, measured: float) -> str:
    verdict = "" if planned >= measured else ", BELOW THE MEASURED: the plan underprices this"
    return f"planned {planned:.2f} s ({planned / measured:.1f}x the measured{verdict})"


def _battery(policy, reference, codec, tasks, new: int):
    reward = evaluate_reward(policy, codec, tasks, max_new_tokens=new, seed=0)
    return reward, sampled_kl(policy, reference, codec, tasks, max_new_tokens=new, seed=0)


def _groups(policy, codec, tasks, new: int, count: int, group_size: int):
    config = GenerationConfig(group_size=group_size, max_new_tokens=new, overlong_cache=new)
    rng, generator = random.Random(0), torch.Generator().manual_seed(0)
    return [make_group(policy, codec, tasks[rng.randrange(len(tasks))], version=0, config=config, generator=generator)
            for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["micro", "tiny"])
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[8])
    parser.add_argument("--groups", type=int, default=32)
    args = parser.parse_args()
    if min(args.new_tokens) < 3:  # an RLVR step's least: an answer, its eos and one overlong token
        parser.error("--new-tokens must be at least 3")
    torch.set_num_threads(1)
    train, _ = battery()
    for name in args.models:
        spec = seeded(name)
        codec, config = spec.codec(), config_by_name(name, vocab_size=spec.vocab_size)
        policy = spec.factory()().eval()
        reference = copy.deepcopy(policy)
        for new in args.new_tokens:
            sizes = PostTrainingEval(max_new_tokens=new)
            _, held_out = battery(sizes)
            cached_s, (cached, kl) = _cpu_seconds(lambda: _battery(policy, reference, codec, held_out, new))
            whole_s, (whole, kl_whole) = _cpu_seconds(
                lambda: _battery(WholePrefix(policy), WholePrefix(reference), codec, held_out, new))
            planned = plan.host_seconds(plan.evaluation_flops(config, sizes, first=False),
                                        plan.evaluation_forwards(sizes, first=False), config)
            greedy = "same greedy" if cached.greedy_accuracy == whole.greedy_accuracy else "GREEDY DIFFERS"
            print(f"{name}, battery of {len(held_out)} prompts, {new} new tokens: cache {cached_s:.2f} s, whole prefix "
                  f"{whole_s:.2f} s ({whole_s / cached_s:.1f}x); {_against_plan(planned, cached_s)}; {greedy}, "
                  f"KL {kl:.4f} / {kl_whole:.4f}")
            # The manifest leaves room for an answer and its eos before DAPO's overlong window.
            step = RlvrStep(kind="rlvr", max_new_tokens=new, overlong_cache=new - 2, num_steps=1,
                            groups_per_step=args.groups)
            cached_s, _ = _cpu_seconds(lambda: _groups(policy, codec, train, new, args.groups, step.group_size))
            whole_s, _ = _cpu_seconds(lambda: _groups(WholePrefix(policy), codec, train, new, args.groups,
                                                      step.group_size))
            [priced] = plan.plan_post_training([step], config, HARDWARE, {}, sizes)
            planned = priced.host_seconds
            print(f"{name}, RLVR generation, {args.groups} groups of {step.group_size}, {new} new tokens: cache "
                  f"{cached_s:.2f} s, whole prefix {whole_s:.2f} s ({whole_s / cached_s:.1f}x); "
                  f"{_against_plan(planned, cached_s)}")


if __name__ == "__main__":
    main()
