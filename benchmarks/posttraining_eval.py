"""The post-training eval battery (verifiable reward on the 200 held-out prompts, 8 samples each, and
greedy accuracy) decoded prompts-at-once against one prompt at a time, the baseline in the same run.

    .venv/bin/python benchmarks/posttraining_eval.py [--batch-prompts 8 32 200] [--repeats 3]

Two policies: the seeded char model as initialised (completions ramble to the token limit, the
worst case for a batch that runs until its last row ends) and the same model after the fixture's
SFT (short answers). Greedy accuracy must agree exactly both ways; the sampled reward draws other
random numbers when batched, so it agrees within its standard error, not to the digit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from ito_assets.manifest.schema import PostTrainingEval  # noqa: E402
from ito_assets.posttraining import evaluation  # noqa: E402
from ito_assets.posttraining.base import seeded  # noqa: E402
from ito_assets.posttraining.decoding import encode_prompt, sample  # noqa: E402
from ito_assets.posttraining.pipeline import battery  # noqa: E402
from ito_assets.posttraining.rewards import score  # noqa: E402
from posttraining_recipe import run_recipe  # noqa: E402


def one_prompt_at_a_time(policy, codec, tasks, *, max_new_tokens: int, seed: int) -> tuple[float, float]:
    """The baseline: the battery as it was decoded before, prompt by prompt. (mean reward, greedy accuracy)"""
    generator, per_task, greedy = torch.Generator().manual_seed(seed), [], []
    for task in tasks:
        prompt = encode_prompt(codec, task.prompt)
        sampled = sample(policy, prompt, num_samples=evaluation.EVAL_SAMPLES_PER_PROMPT,
                         max_new_tokens=max_new_tokens, eos_id=codec.eos_id, generator=generator)
        per_task.append(statistics.fmean(score(task, c.text(codec)) for c in sampled))
        [best] = sample(policy, prompt, num_samples=1, max_new_tokens=max_new_tokens, eos_id=codec.eos_id,
                        temperature=0)
        greedy.append(score(task, best.text(codec)))
    return statistics.fmean(per_task), statistics.fmean(greedy)


def _best_of(repeats: int, run) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-prompts", type=int, nargs="+", default=[8, 32, 200])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = PostTrainingEval()
    _, held_out = battery(sizes)
    spec = seeded()
    codec = spec.codec()
    with tempfile.TemporaryDirectory() as folder:
        run_recipe(0, (3e-3, 1e-4, 1e-3), Path(folder), stages=("sft",))
        tuned = spec.factory()()
        tuned.load_state_dict(torch.load(Path(folder) / "0" / "sft" / "policy.pt", weights_only=True))
    policies = {"seed weights": spec.factory()(), "after SFT": tuned}
    print(f"{len(held_out)} prompts x {evaluation.EVAL_SAMPLES_PER_PROMPT} samples, max {sizes.max_new_tokens} "
          f"new tokens, one thread; best of {args.repeats}")
    for name, policy in policies.items():
        policy.eval()
        base_s, (base_reward, base_greedy) = _best_of(args.repeats, lambda: one_prompt_at_a_time(
            policy, codec, held_out, max_new_tokens=sizes.max_new_tokens, seed=0))
        print(f"{name}: one prompt at a time {base_s:.2f} s, reward {base_reward:.4f}, greedy {base_greedy:.4f}")
        for size in args.batch_prompts:
            evaluation.EVAL_BATCH_PROMPTS = size
            seconds, result = _best_of(args.repeats, lambda: evaluation.evaluate_reward(
                policy, codec, held_out, max_new_tokens=sizes.max_new_tokens, seed=0))
            agrees = "same greedy" if result.greedy_accuracy == base_greedy else "GREEDY DIFFERS"
            print(f"  {size:>3} prompts a batch: {seconds:.2f} s ({base_s / seconds:.1f}x), reward "
                  f"{result.mean_reward:.4f} (SE {result.standard_error:.4f}), greedy {result.greedy_accuracy:.4f}, "
                  f"{agrees}")


if __name__ == "__main__":
    main()
