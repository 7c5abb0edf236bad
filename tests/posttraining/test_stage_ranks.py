"""How many data-parallel ranks a post-training stage takes of what the training launcher gives a
stage of the run's booking, and the layout that splits its batch over them."""

from __future__ import annotations

import pytest

from ito_assets.posttraining.plan import data_parallel_ranks


@pytest.mark.parametrize(("kind", "batch", "given", "taken", "fewer"), [
    ("sft", 8, (1, 1), (1, 1), False),
    ("sft", 8, (1, 8), (1, 8), False),  # the batch divides over every rank
    ("dpo", 8, (2, 4), (2, 4), False),  # over two nodes too
    ("sft", 8, (2, 8), (1, 8), True),  # 16 ranks: one node's 8 divide it
    ("sft", 8, (1, 6), (1, 4), True),  # the most ranks of one node that divide it
    ("dpo", 7, (1, 8), (1, 7), True),  # a batch smaller than the node: one rank a row
    ("sft", 5, (1, 4), (1, 1), True),  # a prime batch above the node's ranks: one rank
    ("rlvr", 8, (1, 8), (1, 1), True),  # its generator serves one trainer
    ("rlvr", 8, (1, 1), (1, 1), False),
])
def test_a_stage_takes_every_rank_its_batch_divides_over(kind, batch, given, taken, fewer) -> None:
    nnodes, nproc, why = data_parallel_ranks(kind, batch, *given)
    assert (nnodes, nproc) == taken and (why is not None) == fewer
    assert batch % (nnodes * nproc) == 0


def test_the_layout_splits_the_batch_evenly_or_refuses() -> None:
    pytest.importorskip("torch")
    from ito_assets.posttraining.on_worker import layout

    assert layout(8).describe() == {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1, "precision": "fp32",
                                    "checkpointing": "none", "micro_batch_size": 8, "compile": False}
    assert (layout(8, 2).dp_shard, layout(8, 2).micro_batch_size) == (2, 4)
    assert (layout(8, 8).dp_shard, layout(8, 8).micro_batch_size) == (8, 1)
    for ranks in (3, 16):
        with pytest.raises(ValueError, match="does not split evenly"):
            layout(8, ranks)


@pytest.mark.parametrize(("kind", "launcher", "world"), [("sft", {"nproc_per_node": 2}, 2), ("dpo", {"nproc_per_node": 2}, 2),
                                                        ("rlvr", {"nproc_per_node": 2}, 1), ("sft", {}, 1)])
def test_the_asset_launches_the_ranks_the_launcher_gives_for_the_booking(kind, launcher, world) -> None:
    """On this CPU host the launcher gives one rank unless told more (as for the pretraining
    stages); the stage's supervisor is then set for the ranks the stage takes."""
    pytest.importorskip("torch")
    import dagster as dg
    from types import SimpleNamespace

    from ito_assets.defs.posttraining.assets import _Worker
    from ito_assets.defs.training.launcher import TrainingLauncherResource
    from ito_assets.defs.training.resources import TrainingRuntimeResource
    from ito_assets.training.run_plan import PlanOutcome, booked_hardware

    hardware = booked_hardware(gpu_type="H100", topology="1x8-nvlink", network="ib-400g", num_nodes=1, num_gpus=8, price_per_gpu_hour_cents=100)
    live = SimpleNamespace(booked_plan=lambda data_root: PlanOutcome(run_plan=SimpleNamespace(hardware=hardware)))
    worker = _Worker(TrainingRuntimeResource(), TrainingLauncherResource(**launcher), dg.PipesSubprocessClient())
    context = dg.build_asset_context()
    ranks = worker.ranks(context, live, kind, batch_size=8)
    assert ranks[0] * ranks[1] == world
    assert worker.launch(context, "run_x", ranks).supervisor.world_size == world
