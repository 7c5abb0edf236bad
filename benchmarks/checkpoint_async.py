"""Asynchronous checkpoint blocking time over synchronous save time (goal <= 0.1:
training waits for at most a tenth of what a synchronous save would take).

World size 2 on gloo (CPU): each rank holds the model (DDP layout) and its AdamW state after one
step. For each repeat, rank-synchronized:
  sync      dcp.save of the full training state on the checkpoint group (training waits for it all)
  async     what the worker does: capture the state, `Checkpointer.save` (plan, start the staging
            copy and the background write), the next forward and backward pass, then
            `wait_staged` before the optimizer step; training-blocking seconds = the save call + that
            wait. Then the total seconds until the completion marker is on disk
Prints medians and the ratio async blocking / sync save, plus bytes and bandwidth.

    .venv/bin/python benchmarks/checkpoint_async.py [--model tiny|proxy-150m] [--repeat 3] [--world-size 2]
    python3 benchmarks/checkpoint_async.py --device cuda --world-size 1 --model proxy-150m   (one GPU)

On a GPU the staging copy goes to pinned memory on a side stream; the process group is
`cpu:gloo,cuda:nccl` and the checkpoint group gloo, as in the worker.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from ito_assets.runtime.checkpoint import registry  # noqa: E402
from ito_assets.runtime.checkpoint.saver import CheckpointConfig, Checkpointer  # noqa: E402
from ito_assets.runtime.worker import train_state  # noqa: E402
from ito_assets.training.model import build_model, config_by_name  # noqa: E402
from ito_assets.training.model_config import parameter_count  # noqa: E402
from ito_assets.training.trainer import TrainConfig, build_optimizer  # noqa: E402


def _one_step(model, optimizer, before_update=lambda: 0.0, batch: int = 2) -> float:
    """A training step on random tokens; returns what `before_update` returned (seconds waited)."""
    device = next(model.parameters()).device
    tokens = torch.randint(0, model.config.vocab_size, (batch, 33), device=device)
    model.loss(tokens[:, :-1], tokens[:, 1:]).backward()
    waited = before_update()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return waited


def _rank_main(rank: int, world_size: int, args, out_dir: str, init_file: str) -> None:
    on_gpu = args.device == "cuda"
    if on_gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("cpu:gloo,cuda:nccl" if on_gpu else "gloo", init_method=f"file://{init_file}",
                            rank=rank, world_size=world_size)
    group = dist.new_group(backend="gloo")
    model = build_model(config_by_name(args.model), seed=0, device=f"cuda:{rank}" if on_gpu else "cpu")
    optimizer = build_optimizer(model, TrainConfig(num_steps=1, batch_size=2, sequence_length=32))
    _one_step(model, optimizer)
    saver = Checkpointer(CheckpointConfig(directory=Path(out_dir) / "async", interval_steps=1, keep_last=2),
                         process_group=group, rank=rank)
    sync_s, blocking_s, total_s = [], [], []
    for repeat in range(1, args.repeat + 1):
        state = train_state.capture(model, optimizer, step=repeat, position=repeat, rank=rank)
        dist.barrier()
        started = time.perf_counter()
        dcp.save(state, checkpoint_id=str(Path(out_dir) / "sync" / f"step-{repeat}"), process_group=group)
        dist.barrier()
        sync_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        state = train_state.capture(model, optimizer, step=repeat, position=repeat, rank=rank)
        saver.save(repeat, state)
        call = time.perf_counter() - started
        waited = _one_step(model, optimizer, saver.wait_staged, batch=args.batch)
        if on_gpu:
            torch.cuda.synchronize()
        blocking_s.append(call + waited)
        saver.wait()
        dist.barrier()
    if rank == 0:
        records = registry.read(Path(out_dir) / "async")
        total_s = [r.total_seconds for r in records]
        figures = {
            "model": args.model, "device": args.device, "torch": torch.__version__,
            "num_parameters": parameter_count(model.config), "world_size": world_size,
            "repeats": args.repeat, "checkpoint_bytes": records[-1].num_bytes,
            "sync_save_s_median": statistics.median(sync_s),
            "async_blocking_s_median": statistics.median(blocking_s),
            "async_total_s_median": statistics.median(total_s),
            "ratio_async_blocking_over_sync": statistics.median(blocking_s) / statistics.median(sync_s),
            "async_bandwidth_bytes_per_s": records[-1].num_bytes / statistics.median(total_s),
        }
        print(json.dumps(figures, indent=2))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch", type=int, default=2, help="sequences of 32 tokens in the overlapped step")
    args = parser.parse_args()
    out_dir = tempfile.mkdtemp(prefix="ito-ckpt-bench-")
    try:
        mp.spawn(_rank_main, args=(args.world_size, args, out_dir, os.path.join(out_dir, "init")),
                 nprocs=args.world_size, join=True)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
