"""Resume is bit-exact: N steps straight equal N/2 steps, a checkpoint, and N/2 more in a fresh
process group (world size 2 on gloo, DDP replicas, FSDP2 shards, and FSDP2 in bf16 with gradient
accumulation: per-rank RNG state, the data-loader position, sharded parameters and optimizer state
through DCP). The checkpoint resumed from lost its registry record (a kill between its marker and
the record): the resumed attempt lists it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ito_assets.runtime.record import events
from ito_assets.runtime.record.goodput import summarize
from ito_assets.runtime.checkpoint import markers, registry
from ito_assets.runtime.stage.config import RESULT_NAME
from ito_assets.training.layout import Layout
from runtime_helpers import EXACT_DDP, EXACT_FSDP, drive_in_turn, final_weights, finish, run_worker, step_losses, worker_config

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def _num_shards(stage_dir: Path, step: int) -> set[int]:
    """How many chunks each saved parameter has: 1 for DDP's replicas, one per rank for FSDP2's."""
    metadata = dcp.FileSystemReader(str(markers.checkpoint_dir(stage_dir, step))).read_metadata()
    return {len(meta.chunks) for key, meta in metadata.state_dict_metadata.items()
            if key.startswith("model.") and hasattr(meta, "chunks")}


def _drop_the_last_record(stage_dir: Path, *, step: int) -> None:
    """As a kill after the marker of `step` (written on the save's thread) and before its record
    (appended at the training thread's next poll) leaves the registry."""
    path = stage_dir / registry.REGISTRY_NAME
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1])["step"] == step
    path.write_text("".join(line + "\n" for line in lines[:-1]))


LAYOUTS = {
    "ddp": EXACT_DDP, "fsdp2": EXACT_FSDP,
    # bf16 under FSDP2's mixed precision, each rank's rows as 2 micro-batches: the data position and
    # the generators still resume exactly
    "fsdp2_bf16_accumulating": Layout(dp_shard=2, compile=False, micro_batch_size=2),
}


# `make test` runs the bf16, accumulating FSDP2 variant (sharded state, micro-batches and mixed
# precision all resume bit for bit); plain FSDP2 and DDP run in `make test-long`. DDP's resume is in
# `make test` through the SFT and preference rows' tests (alike to one rank, not bit for bit).
@pytest.mark.parametrize("data_parallel", [pytest.param(name, marks=pytest.mark.long) if name in ("fsdp2", "ddp") else name
                                           for name in sorted(LAYOUTS)])
def test_straight_and_resumed_runs_are_identical(tmp_path, tokens, data_parallel):
    layout = LAYOUTS[data_parallel]
    straight = worker_config(tmp_path / "straight", tokens, layout=layout)
    halves = worker_config(tmp_path / "halves", tokens, stop_after_step=12, layout=layout)
    # The straight run, then the first half, in one launch (start-up dominates on CPU); the second
    # half in a fresh process group.
    first = finish(drive_in_turn(tmp_path / "first", [straight, halves], nproc=2))
    assert first.returncode == 0, first.stderr[-3000:]
    assert max(step_losses(Path(halves.stage_dir))) == 12  # it stopped after its step-12 checkpoint
    _drop_the_last_record(Path(halves.stage_dir), step=12)
    second = run_worker(worker_config(tmp_path / "halves", tokens, attempt=1, layout=layout), nproc=2)
    assert second.returncode == 0, second.stderr[-3000:]
    # Listed again by the attempt that resumed from it, before its own saves.
    assert [r.step for r in registry.read(Path(halves.stage_dir))] == [8, 12, 16, 24]

    log = events.read(Path(halves.stage_dir))
    resumed = [e for e in log if e.kind is events.EventKind.RESUME]
    assert [(e.attempt, e.step) for e in resumed] == [(0, -1), (1, 12)]
    # No supervisor wrote an allocation: each start-up says its attempt's devices, which count.
    assert [(e.attempt, e.num_devices) for e in log if e.kind is events.EventKind.STARTUP] == [(0, 2), (1, 2)]
    figures = summarize(log)
    assert figures.device_hours * 3600 == pytest.approx(figures.allocated_seconds * 2, rel=1e-12)
    expected, got = step_losses(Path(straight.stage_dir)), step_losses(Path(halves.stage_dir))
    assert sorted(got) == list(range(1, 25))
    assert got == expected  # exact float equality, step by step, including steps 13-24
    a, b = final_weights(Path(straight.stage_dir), 24), final_weights(Path(halves.stage_dir), 24)
    assert a.keys() == b.keys() and len(a) > 10
    assert all(torch.equal(a[key], b[key]) for key in a)
    assert _num_shards(Path(straight.stage_dir), 24) == ({2} if layout.dp_shard == 2 else {1})
    results = [json.loads((Path(c.stage_dir) / RESULT_NAME).read_text()) for c in (straight, halves)]
    assert results[0]["eval"] == results[1]["eval"]  # the battery sees identical weights
