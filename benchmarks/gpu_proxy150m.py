"""proxy-150m on one GPU: tokens/s and MFU in bf16 with torch.compile, and the planner's memory
estimate against torch.cuda.max_memory_allocated (goal: >= 40% MFU on an H100/H200-class GPU).

Standalone: needs only torch (CUDA build) and this repository (no numpy, no Dagster, no network).
For each micro-batch size: fp32 master weights, bf16 autocast, fused AdamW, gradient clipping,
the compiled loss (`DecoderLM.loss`: forward, fp32 upcast, cross-entropy), `--warmup` untimed
steps (compilation happens there), then `--steps` steps timed with CUDA events. MFU is model FLOPs
(6N + 12LDT per token, PaLM convention) over the GPU's dense bf16 peak from
ito_assets/training/hardware.py. The memory estimate is the planner's for one GPU (no sharding)
without its fixed reserve, which max_memory_allocated does not see (CUDA context, allocator slack).

    python benchmarks/gpu_proxy150m.py [--micro-batches 4 8 16] [--seq 2048] [--steps 20] [--warmup 8]
                                       [--gpu H100-SXM|H200|A100-80GB|L40S] [--no-compile] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ito_assets.training.hardware import GIB, GPUS, gpu_spec, network_spec  # noqa: E402
from ito_assets.training.layout import Layout  # noqa: E402
from ito_assets.training.memory import estimate_memory  # noqa: E402
from ito_assets.training.model import build_model, config_by_name  # noqa: E402
from ito_assets.training.model_config import flops_per_token, parameter_count  # noqa: E402
from ito_assets.training.planner import Hardware, PlanRequest, default_global_batch_sequences, plan  # noqa: E402
from ito_assets.training.throughput import estimate_step  # noqa: E402
from ito_assets.training.trainer import TrainConfig, build_optimizer, learning_rate_at  # noqa: E402


def detect_gpu() -> str:
    name = torch.cuda.get_device_name().upper()
    for key, spec in (("H200", "H200"), ("H100", "H100-SXM"), ("A100", "A100-80GB"), ("L40S", "L40S")):
        if key in name:
            return spec
    raise SystemExit(f"unknown GPU {name!r}: pass --gpu one of {sorted(GPUS)}")


def run_one(micro_batch: int, args: argparse.Namespace) -> dict:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    config = config_by_name("proxy-150m")
    model = build_model(config, seed=0, device="cuda")
    train_config = TrainConfig(num_steps=args.warmup + args.steps, batch_size=micro_batch, sequence_length=args.seq)
    optimizer = build_optimizer(model, train_config)
    loss_fn = torch.compile(model.loss) if args.compile else model.loss
    tokens = torch.randint(0, config.vocab_size, (micro_batch, args.seq + 1), device="cuda")
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step(index: int) -> torch.Tensor:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(index, train_config)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.grad_clip)
        optimizer.step()
        return loss

    compile_started = time.perf_counter()
    for index in range(args.warmup):
        step(index)
    torch.cuda.synchronize()
    warmup_seconds = time.perf_counter() - compile_started
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for index in range(args.warmup, args.warmup + args.steps):
        loss = step(index)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000
    return _report(config, micro_batch, args, seconds, warmup_seconds, float(loss))


def _report(config, micro_batch: int, args: argparse.Namespace, seconds: float, warmup_seconds: float, loss: float) -> dict:
    gpu = gpu_spec(args.gpu)
    tokens_per_second = args.steps * micro_batch * args.seq / seconds
    mfu = tokens_per_second * flops_per_token(config, args.seq) / gpu.peak_bf16_flops
    estimate = estimate_memory(config, Layout(micro_batch_size=micro_batch), args.seq, gpu)
    predicted = estimate_step(config, Layout(micro_batch_size=micro_batch), sequence_length=args.seq,
                              global_batch_sequences=micro_batch, gpu=gpu, network=network_spec("infiniband"), gpus_per_node=1)
    measured = torch.cuda.max_memory_allocated()
    without_reserve = estimate.total - estimate.reserve
    return {
        "gpu": torch.cuda.get_device_name(), "spec": gpu.name, "torch": torch.__version__, "compile": args.compile,
        "num_parameters": parameter_count(config), "micro_batch": micro_batch, "seq": args.seq, "steps": args.steps,
        "warmup_seconds": round(warmup_seconds, 1), "step_ms": round(1000 * seconds / args.steps, 2),
        "tokens_per_second": round(tokens_per_second, 1), "mfu": round(mfu, 4), "predicted_mfu": round(predicted.mfu, 4),
        "final_loss": round(loss, 4), "max_memory_allocated_gib": round(measured / GIB, 3),
        "estimate_without_reserve_gib": round(without_reserve / GIB, 3),
        "estimate_over_measured": round(without_reserve / measured, 3), "estimate": estimate.to_dict(),
    }


def planner_choice(args: argparse.Namespace) -> dict:
    config = config_by_name("proxy-150m")
    hardware = Hardware(gpu=gpu_spec(args.gpu), network=network_spec("infiniband"), num_nodes=1, gpus_per_node=1,
                        price_cents_per_gpu_hour=0)
    request = PlanRequest(model=config, sequence_length=args.seq, num_training_tokens=15_000_000_000, hardware=hardware,
                          global_batch_sequences=default_global_batch_sequences(config, args.seq, 1))
    return {"planner_layout": plan(request).to_dict()["layout"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--gpu", choices=sorted(GPUS), default=None, help="spec for the peak FLOP/s (default: detected)")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as one JSON file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark needs a GPU (CPU figures: benchmarks/tokens_per_second.py)")
    args.gpu = args.gpu or detect_gpu()
    torch.backends.cuda.matmul.allow_tf32 = True
    results = [planner_choice(args)]
    print(json.dumps(results[0]), flush=True)
    for micro_batch in args.micro_batches:
        try:
            result = run_one(micro_batch, args)
        except torch.OutOfMemoryError:
            result = {"micro_batch": micro_batch, "out_of_memory": True,
                      "estimate": estimate_memory(config_by_name("proxy-150m"), Layout(micro_batch_size=micro_batch), args.seq, gpu_spec(args.gpu)).to_dict()}
        results.append(result)
        print(json.dumps(result), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
