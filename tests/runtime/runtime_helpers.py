"""Builders for the runtime tests: learnable token shards, worker configs, and torchrun launches."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.record import events
from ito_assets.runtime.stage.config import WorkerConfig
from ito_assets.runtime.supervision.launch import worker_command
from ito_assets.runtime.record.storage import write_atomic
from ito_assets.training.layout import Layout

VOCAB = 512
# The fault matrix: every injected fault once in `make test`, four times more in `make test-long`
# (a recovery that holds one time in five is not a recovery).
TRIALS = [0, *(pytest.param(trial, marks=pytest.mark.long) for trial in range(1, 5))]
# fp32, eager, each rank's rows in one micro-batch: the layouts whose runs compare bit for bit.
EXACT_DDP = Layout(dp_replicate=2, precision="fp32", compile=False, micro_batch_size=8)  # DDP on any ranks
EXACT_FSDP = Layout(dp_shard=2, precision="fp32", compile=False, micro_batch_size=8)  # FSDP2 on 2 ranks


def write_tokens(folder: Path, *, num_tokens: int = 40_000, seed: int = 0) -> tuple[Path, Path]:
    """A Markov chain over VOCAB states with four successors each: learnable in a few dozen steps."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, VOCAB, size=(VOCAB, 4))
    choices = rng.integers(0, 4, size=num_tokens + 4_000)
    tokens = np.empty(num_tokens + 4_000, dtype=np.uint16)
    tokens[0] = 0
    for i in range(1, len(tokens)):
        tokens[i] = successors[tokens[i - 1], choices[i]]
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "train.npy", tokens[:num_tokens])
    np.save(folder / "heldout.npy", tokens[num_tokens:])
    return folder / "train.npy", folder / "heldout.npy"


def worker_config(root: Path, tokens: tuple[Path, Path], **changes) -> WorkerConfig:
    base = WorkerConfig(
        run_key="run-test", stage="pretraining", model="micro", vocab_size=VOCAB,
        tokens_path=str(tokens[0]), heldout_path=str(tokens[1]),
        stage_dir=str(root / "checkpoints" / "pretraining"), heartbeat_dir=str(root / "heartbeats"),
        metrics_path=str(root / "metrics.jsonl"), num_steps=24, batch_size=8, sequence_length=32,
        interval_steps=8, keep_last=3, eval_windows=8, eval_sequence_length=32, launched_at=time.time(),
        layout=EXACT_DDP, deterministic=True,
    )
    return replace(base, **changes)


def start_worker(config: WorkerConfig, *, nproc: int) -> subprocess.Popen:
    """One attempt under torchrun (no supervisor); output captured as text."""
    path = Path(config.stage_dir).parent / f"config-{time.monotonic_ns()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, config.to_json().encode())
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    return subprocess.Popen(worker_command(path, nproc), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def drive_in_turn(folder: Path, configs: list, nproc: int) -> subprocess.Popen:
    """The configs one after another in one torchrun of `nproc` ranks (`layout_driver.py`)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, config in enumerate(configs):
        paths.append(folder / f"config-{index}.json")
        write_atomic(paths[-1], config.to_json().encode())
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(Path(__file__).with_name("layout_driver.py")), *map(str, paths)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")})


def finish(process: subprocess.Popen, timeout: float = 180) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def run_worker(config: WorkerConfig, *, nproc: int, timeout: float = 180) -> subprocess.CompletedProcess:
    return finish(start_worker(config, nproc=nproc), timeout)


def step_losses(stage_dir: Path) -> dict[int, float]:
    """step -> loss of the last attempt that ran it."""
    found: dict[int, float] = {}
    for event in events.read(stage_dir):
        if event.kind is events.EventKind.STEP:
            found[event.step] = event.loss
    return found


# fp32 on CPU: the rank count changes only the order of the reductions (tests/runtime/test_layouts.py).
ROWS_FP32_TOLERANCE = 1e-4


def assert_trained_as_one_rank(one: WorkerConfig, other: WorkerConfig) -> None:
    """`other` took `one`'s losses at every step and ended at its weights, within ROWS_FP32_TOLERANCE:
    each target of the global batch counted once, however the layout split the rows."""
    expected, got = step_losses(Path(one.stage_dir)), step_losses(Path(other.stage_dir))
    assert sorted(got) == sorted(expected) == list(range(1, one.num_steps + 1)), other.stage_dir
    assert max(abs(got[s] - expected[s]) for s in got) <= ROWS_FP32_TOLERANCE, other.stage_dir
    reference, trained = final_weights(Path(one.stage_dir), one.num_steps), final_weights(Path(other.stage_dir), one.num_steps)
    for key in reference:
        torch.testing.assert_close(trained[key], reference[key], atol=ROWS_FP32_TOLERANCE, rtol=0, msg=key)


def final_weights(stage_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """The model and optimizer tensors of a checkpoint, whatever layout saved it (DCP reshards)."""
    folder = markers.checkpoint_dir(stage_dir, step)
    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in metadata.state_dict_metadata.items()
             if isinstance(meta, TensorStorageMetadata) and (key.startswith("model.") or key.startswith("optim."))}
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    return state


class Recorder:
    """A Pipes session's stand-in for the metrics relay: what it was sent, in order."""

    def __init__(self) -> None:
        self.metrics_seen: list[tuple[int, dict]] = []
        self.logs: list[str] = []

    def metrics(self, step: int, values: dict) -> None:
        self.metrics_seen.append((step, values))

    def log(self, message: str) -> None:
        self.logs.append(message)


# --- a newer checkpoint folder whose completion marker lies about it (step 10 beside a whole step 5) ---


def copied_under_a_newer_step(stage: Path) -> None:
    shutil.copytree(markers.checkpoint_dir(stage, 5), markers.checkpoint_dir(stage, 10))


def shard_removed(stage: Path) -> None:
    next(markers.checkpoint_dir(stage, 10).glob("*.distcp")).unlink()


def shard_cut_short(stage: Path) -> None:
    shard = next(markers.checkpoint_dir(stage, 10).glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-1])


def shard_added(stage: Path) -> None:
    (markers.checkpoint_dir(stage, 10) / "__9_0.distcp").write_bytes(b"not written by this save")

