"""Resume is bit-exact: N steps straight equal N/2 steps, a checkpoint, and N/2 more in a fresh
process group (world size 2 on gloo: DDP, per-rank RNG state, the data-loader position)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ito_assets.runtime import events, markers
from ito_assets.runtime.worker import EXIT_STOPPED
from runtime_helpers import finish, run_worker, start_worker, step_losses, worker_config

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def _final_weights(stage_dir: Path, step: int) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    folder = markers.checkpoint_dir(stage_dir, step)
    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in metadata.state_dict_metadata.items()
             if isinstance(meta, TensorStorageMetadata) and (key.startswith("model.") or key.startswith("optim."))}
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    return state


def test_straight_and_resumed_runs_are_identical(tmp_path, tokens):
    straight = worker_config(tmp_path / "straight", tokens)
    halves = worker_config(tmp_path / "halves", tokens, stop_after_step=12)
    running = start_worker(straight, nproc=2)  # two launches at once: start-up dominates on CPU
    first = run_worker(halves, nproc=2)
    done = finish(running)
    assert done.returncode == 0, done.stderr[-3000:]
    assert first.returncode != 0 and f"exitcode  : {EXIT_STOPPED}" in first.stderr, first.stderr[-3000:]
    second = run_worker(worker_config(tmp_path / "halves", tokens, attempt=1), nproc=2)
    assert second.returncode == 0, second.stderr[-3000:]

    resumed = [e for e in events.read(Path(halves.stage_dir)) if e.kind is events.EventKind.RESUME]
    assert [(e.attempt, e.step) for e in resumed] == [(0, -1), (1, 12)]
    expected, got = step_losses(Path(straight.stage_dir)), step_losses(Path(halves.stage_dir))
    assert sorted(got) == list(range(1, 25))
    assert got == expected  # exact float equality, step by step, including steps 13-24
    a, b = _final_weights(Path(straight.stage_dir), 24), _final_weights(Path(halves.stage_dir), 24)
    assert a.keys() == b.keys() and len(a) > 10
    assert all(torch.equal(a[key], b[key]) for key in a)
