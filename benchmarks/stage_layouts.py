"""The product's own stage worker (`ito_assets.runtime.worker.main` under torchrun, not a separate
loop) on one model for a fixed number of steps, in four executions of one layout: eager fp32,
bf16, bf16 + compile, bf16 + compile + activation checkpointing.

Prints, per execution: tokens/s per device, MFU against the named device's bf16 peak, peak
memory, the planner's predicted step time beside the measured one (their ratio), the layout the
worker ran and its fallbacks; then the ratios against eager fp32 from the same run.

    .venv/bin/python benchmarks/stage_layouts.py                         (CPU: tiny, seq 128)
    python3 benchmarks/stage_layouts.py --model proxy-150m --sequence-length 2048 --batch 16 \\
        --micro-batch 8 --gpu H200 --steps 20                            (one GPU)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ito_assets.runtime.stage.calibration import calibrate  # noqa: E402
from ito_assets.runtime.stage.config import RESULT_NAME, WorkerConfig  # noqa: E402
from ito_assets.runtime.supervision.launch import worker_command  # noqa: E402
from ito_assets.training.hardware import gpu_spec, network_spec  # noqa: E402
from ito_assets.training.layout import Layout  # noqa: E402
from ito_assets.training.model_config import config_by_name, flops_per_token  # noqa: E402
from ito_assets.training.planner import Hardware, PlanRequest  # noqa: E402

EXECUTIONS = {
    "eager_fp32": {"precision": "fp32", "compile": False},
    "bf16": {"precision": "bf16", "compile": False},
    "bf16_compile": {"precision": "bf16", "compile": True},
    "bf16_compile_ac": {"precision": "bf16", "compile": True, "checkpointing": "full"},
}


def _tokens(folder: Path, vocab: int, count: int) -> str:
    path = folder / "train.npy"
    np.save(path, np.random.default_rng(0).integers(0, vocab, count, dtype=np.uint32 if vocab > 65535 else np.uint16))
    return str(path)


def _run(work: Path, name: str, args: argparse.Namespace, tokens: str, vocab: int) -> dict:
    layout = Layout(dp_shard=args.nproc, micro_batch_size=args.micro_batch, **EXECUTIONS[name])
    config = WorkerConfig(
        run_key="bench", stage="pretraining", model=args.model, vocab_size=vocab, tokens_path=tokens, heldout_path=None,
        stage_dir=str(work / name / "pretraining"), heartbeat_dir=str(work / name / "hb"),
        metrics_path=str(work / name / "metrics.jsonl"), num_steps=args.steps, batch_size=args.batch,
        sequence_length=args.sequence_length, interval_steps=args.steps, keep_last=1, launched_at=time.time(),
        layout=layout)
    path = work / f"{name}.json"
    path.write_text(config.to_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    started = time.perf_counter()
    done = subprocess.run(worker_command(path, args.nproc), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    result = json.loads((Path(config.stage_dir) / RESULT_NAME).read_text())
    return {**result["measured"], "ran": result["layout"]["ran"], "fallbacks": result["layout"]["fallbacks"],
            "wall_seconds": round(time.perf_counter() - started, 1)}


def _figures(measured: dict, args: argparse.Namespace) -> dict:
    """The stage's own calibration (`ito_assets.runtime.stage.calibration`) and MFU."""
    model, gpu = config_by_name(args.model), gpu_spec(args.gpu)
    hardware = Hardware(gpu=gpu, network=network_spec("infiniband"), num_nodes=1, gpus_per_node=args.nproc,
                        price_cents_per_gpu_hour=0)
    request = PlanRequest(model=model, sequence_length=args.sequence_length, global_batch_sequences=args.batch,
                          num_training_tokens=args.steps * args.batch * args.sequence_length, hardware=hardware)
    figures = calibrate(request, Layout.from_dict(measured["ran"]), measured)
    per_device = args.batch * args.sequence_length / figures.measured_step_s / args.nproc
    return {"tokens_per_second_per_device": round(per_device, 1),
            "mfu": round(flops_per_token(model, args.sequence_length) * per_device / gpu.peak_bf16_flops, 4),
            "peak_memory_gib": round(figures.measured_peak_memory_bytes / 2**30, 3),
            "peak_memory_source": figures.peak_memory_source, "measured_step_s": round(figures.measured_step_s, 4),
            "predicted_step_s": round(figures.predicted_step_s, 4),
            "measured_over_predicted": round(figures.step_time_ratio, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16, help="global batch, in sequences")
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--gpu", default="CPU", help="the device whose bf16 peak MFU is quoted against (hardware.py)")
    parser.add_argument("--only", nargs="*", choices=sorted(EXECUTIONS), help="a subset of the executions")
    args = parser.parse_args()
    vocab = config_by_name(args.model).vocab_size
    work = Path(tempfile.mkdtemp(prefix="ito-layouts-bench-"))
    try:
        tokens = _tokens(work, vocab, (args.steps + 2) * args.batch * args.sequence_length + 1)
        rows = {}
        for name in args.only or EXECUTIONS:
            measured = _run(work, name, args, tokens, vocab)
            rows[name] = measured if "error" in measured else {**_figures(measured, args), "ran": measured["ran"],
                                                              "fallbacks": measured["fallbacks"],
                                                              "wall_seconds": measured["wall_seconds"]}
            print(name, json.dumps(rows[name]), flush=True)
        base = rows.get("eager_fp32", {})
        ratios = {name: {"speed_vs_eager_fp32": round(r["tokens_per_second_per_device"] / base["tokens_per_second_per_device"], 3),
                         "peak_memory_vs_eager_fp32": round(r["peak_memory_gib"] / base["peak_memory_gib"], 3)}
                  for name, r in rows.items() if "error" not in r and "error" not in base and base}
        print(json.dumps({"device": "cuda" if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
                          "model": args.model, "sequence_length": args.sequence_length, "batch": args.batch,
                          "micro_batch": args.micro_batch, "nproc": args.nproc, "steps": args.steps,
                          "executions": rows, "ratios": ratios}, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
