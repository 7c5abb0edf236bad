"""Resume is bit-exact: N steps straight against N/2 steps, a checkpoint, and N/2 more in a fresh
process group, through the real worker under torchrun (gloo on CPU, nccl on a GPU).

Prints the steps compared, the largest loss difference and whether every parameter and optimizer
tensor of the final checkpoints is identical (torch.equal).

    .venv/bin/python benchmarks/checkpoint_resume.py [--nproc 2] [--steps 24] [--model micro]
    python3 benchmarks/checkpoint_resume.py --nproc 1 --model tiny     (one GPU)
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
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.metadata import TensorStorageMetadata  # noqa: E402

from ito_assets.runtime.record import events  # noqa: E402
from ito_assets.runtime.checkpoint import markers  # noqa: E402
from ito_assets.runtime.stage.config import WorkerConfig  # noqa: E402
from ito_assets.runtime.supervision.launch import worker_command  # noqa: E402
from ito_assets.training.layout import Layout  # noqa: E402

VOCAB = 512


def _tokens(folder: Path) -> tuple[str, str]:
    """A Markov chain over VOCAB states, four successors each: learnable in a few dozen steps."""
    rng = np.random.default_rng(0)
    successors = rng.integers(0, VOCAB, size=(VOCAB, 4))
    tokens = np.zeros(44_000, dtype=np.uint16)
    for i in range(1, len(tokens)):
        tokens[i] = successors[tokens[i - 1], rng.integers(0, 4)]
    np.save(folder / "train.npy", tokens[:40_000])
    np.save(folder / "heldout.npy", tokens[40_000:])
    return str(folder / "train.npy"), str(folder / "heldout.npy")


def _run(config: WorkerConfig, nproc: int) -> int:
    path = Path(config.stage_dir).parent / f"config-{time.monotonic_ns()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.to_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    done = subprocess.run(worker_command(path, nproc), env=env, capture_output=True, text=True)
    expected = 0 if config.stop_after_step is None else 1  # a planned stop exits EXIT_STOPPED: torchrun says 1
    if done.returncode != expected:
        print(done.stderr[-3000:], file=sys.stderr)
    return done.returncode


def _losses(stage_dir: str) -> dict[int, float]:
    return {e.step: e.loss for e in events.read(Path(stage_dir)) if e.kind is events.EventKind.STEP}


def _final(stage_dir: str, step: int) -> dict[str, torch.Tensor]:
    folder = markers.checkpoint_dir(Path(stage_dir), step)
    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in metadata.state_dict_metadata.items()
             if isinstance(m, TensorStorageMetadata) and k.split(".")[0] in ("model", "optim")}
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--model", default="micro")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ito-resume-bench-"))
    try:
        print(json.dumps(_measure(work, args), indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(work: Path, args: argparse.Namespace) -> dict:
    train, heldout = _tokens(work)
    base = WorkerConfig(run_key="bench", stage="pretraining", model=args.model, vocab_size=VOCAB, tokens_path=train,
                        heldout_path=heldout, stage_dir=str(work / "straight" / "pretraining"),
                        heartbeat_dir=str(work / "hb"), metrics_path=str(work / "metrics.jsonl"),
                        num_steps=args.steps, batch_size=8, sequence_length=64, interval_steps=8, keep_last=3,
                        eval_windows=4, launched_at=time.time(), deterministic=True,
                        # fp32, eager, DDP over every rank: the layout whose resume is compared bit for bit
                        layout=Layout(dp_replicate=args.nproc, precision="fp32", compile=False, micro_batch_size=8))
    halves = replace(base, stage_dir=str(work / "halves" / "pretraining"), stop_after_step=args.steps // 2)
    started = time.perf_counter()
    codes = [_run(base, args.nproc), _run(halves, args.nproc), _run(replace(halves, stop_after_step=None, attempt=1),
                                                                      args.nproc)]
    straight, resumed = _losses(base.stage_dir), _losses(halves.stage_dir)
    a, b = _final(base.stage_dir, args.steps), _final(halves.stage_dir, args.steps)
    return {
        "device": "cuda" if torch.cuda.is_available() else "cpu", "torch": torch.__version__, "nproc": args.nproc,
        "model": args.model, "exit_codes": codes, "steps_compared": len(straight),
        "resumed_at_step": args.steps // 2, "max_abs_loss_difference": max(abs(straight[s] - resumed[s]) for s in straight),
        "identical_losses": straight == resumed, "num_tensors": len(a),
        "identical_tensors": a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    main()
