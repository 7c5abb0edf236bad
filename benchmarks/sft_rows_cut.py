"""Supervised fine-tuning on rows of many lengths: each batch cut after its last target, against the
same batches padded to the stage's longest pair (the baseline, as before the cut), in one run.

Pairs: the paragraphs of the package descriptions this machine's virtual environment ships
(`*.dist-info/METADATA`, real documentation of every length), the characters the char codec
knows, up to the model's window; the first word is the prompt, the rest the response. The loop is
the stage's in-process SFT (`run_sft`: the worker's loader and loss) on the `tiny` model, one torch
thread, the same seed both ways; trials alternate the two. Printed: the rows' length and padding
share, seconds a step (median over trials), the ratio, and the largest loss difference between
the two (the cut is exact under a causal model, up to the order of floating-point sums).

    .venv/bin/python benchmarks/sft_rows_cut.py [--steps 40] [--batch 16] [--trials 3]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ito_assets.posttraining.base import seeded  # noqa: E402
from ito_assets.posttraining.fixtures import InstructionPair  # noqa: E402
from ito_assets.posttraining.sft import SftConfig, run_sft, sft_batches  # noqa: E402
from ito_assets.posttraining.vocab import PRINTABLE, CharVocab  # noqa: E402
from ito_assets.runtime.worker import batches  # noqa: E402
from ito_assets.runtime.worker.batches import IGNORE  # noqa: E402

MODEL = "tiny"
WINDOW = 512  # tiny's max_seq_len: bos + prompt + response + eos must fit


def documentation_pairs(limit: int) -> list[InstructionPair]:
    allowed, pairs = set(PRINTABLE), []
    for dist in sorted(importlib.metadata.distributions(), key=lambda d: d.metadata.get("Name", "").lower()):
        text = dist.metadata.get_payload() or ""
        for paragraph in text.split("\n\n"):
            words = " ".join(paragraph.split())
            if 12 <= len(words) <= WINDOW - 3 and " " in words and set(words) <= allowed:
                head, _, tail = words.partition(" ")
                pairs.append(InstructionPair(pair_id=f"{dist.metadata['Name']}/{len(pairs)}", prompt=head + " ", response=tail))
        if len(pairs) >= limit:
            break
    return pairs[:limit]


def train(pairs: list[InstructionPair], config: SftConfig, *, cut: bool) -> tuple[float, tuple[float, ...]]:
    """Seconds a step and the losses of one run, with the cut or with every batch padded to T."""
    original = batches.cut_length
    if not cut:
        batches.cut_length = lambda rows, multiple=1: rows.shape[-1]
    try:
        policy = seeded(MODEL).factory()()
        result = run_sft(policy, CharVocab(), pairs, config)
    finally:
        batches.cut_length = original
    return result.wall_seconds / result.num_steps, result.losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pairs = documentation_pairs(args.steps * args.batch)
    config = SftConfig(num_epochs=1, batch_size=args.batch, learning_rate=1e-4, seed=0)
    loader, num_steps = sft_batches(CharVocab(), pairs, config)
    rows = np.asarray(loader.tokens)
    t = rows.shape[-1]
    ends = [batches.cut_length(rows[loader.rows_at(p)]) for p in range(num_steps)]
    real = (rows[:, 1] != IGNORE).any(axis=0)
    print(f"{len(pairs)} pairs from package descriptions; rows of T = {t} positions (the longest pair), "
          f"{num_steps} steps of {args.batch}; model {MODEL}, 1 torch thread")
    print(f"  positions a step computes: padded {t}, cut median {int(np.median(ends))} (min {min(ends)}, max {max(ends)}); "
          f"columns with any target: {int(real.sum())}")
    timings = {"padded": [], "cut": []}
    losses = {}
    for trial in range(args.trials):
        for name in (("padded", "cut") if trial % 2 == 0 else ("cut", "padded")):
            seconds, losses[name] = train(pairs, config, cut=name == "cut")
            timings[name].append(seconds)
    padded, cut = statistics.median(timings["padded"]), statistics.median(timings["cut"])
    difference = max(abs(a - b) for a, b in zip(losses["padded"], losses["cut"]))
    print(f"  seconds a step (median of {args.trials}): padded {padded:.4f}, cut {cut:.4f}: {padded / cut:.2f}x")
    print(f"  largest loss difference over {num_steps} steps: {difference:.2e}")


if __name__ == "__main__":
    main()
