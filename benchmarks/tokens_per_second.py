"""Training tokens per second of the CPU configurations.

For each configuration: a warm-up of `--warmup` steps, then `--steps` timed AdamW steps on
random tokens (throughput does not depend on the token values), with 1 and with all intra-op
threads. Prints one JSON line per measurement with tokens/s and achieved FLOP/s (6N + 12LDT).

    .venv/bin/python benchmarks/tokens_per_second.py [--configs micro tiny] [--steps 20] [--batch 16] [--seq 128]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ito_assets.training.model import build_model, config_by_name  # noqa: E402
from ito_assets.training.model_config import flops_per_token, parameter_count  # noqa: E402
from ito_assets.training.trainer import TrainConfig, build_optimizer, train_step  # noqa: E402


def measure(name: str, *, batch: int, seq: int, steps: int, warmup: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    config = config_by_name(name)
    model = build_model(config, seed=0)
    train_config = TrainConfig(num_steps=warmup + steps, batch_size=batch, sequence_length=seq)
    optimizer = build_optimizer(model, train_config)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (warmup + steps, batch, seq + 1), generator=generator)
    for step in range(warmup):
        train_step(model, optimizer, tokens[step, :, :-1], tokens[step, :, 1:], step, train_config)
    started = time.perf_counter()
    for step in range(warmup, warmup + steps):
        train_step(model, optimizer, tokens[step, :, :-1], tokens[step, :, 1:], step, train_config)
    seconds = time.perf_counter() - started
    rate = steps * batch * seq / seconds
    return {"config": name, "num_parameters": parameter_count(config), "threads": threads, "batch": batch, "seq": seq,
            "steps": steps, "tokens_per_second": round(rate, 1), "gflops_per_second": round(rate * flops_per_token(config, seq) / 1e9, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["micro", "tiny"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    print(json.dumps({"machine": platform.processor() or platform.machine(), "cpu_count": cores, "torch": torch.__version__,
                      "load_average_1m": os.getloadavg()[0]}))
    for name in args.configs:
        for threads in sorted({1, cores}):
            print(json.dumps(measure(name, batch=args.batch, seq=args.seq, steps=args.steps, warmup=args.warmup, threads=threads)), flush=True)


if __name__ == "__main__":
    main()
