"""Chosen plans as real DeviceMeshes and placements, on torch's fake process group.

The fake backend accepts every collective without moving data, so a single CPU process can be
rank r of a world of any size: the mesh, the DTensor placements of FSDP2 and tensor parallelism,
and a forward/backward through them are real torch code paths.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from ito_assets.training.hardware import gpu_spec, network_spec
from ito_assets.training.layout import Layout
from ito_assets.training.memory import BYTES_PER_LOGIT, BYTES_PER_PARAMETER_STATES, estimate_memory
from ito_assets.training.mesh import build_device_mesh, keep_stage, mesh_dims, parallelize, stage_layer_range
from ito_assets.training.model import build_model, config_by_name
from ito_assets.training.planner import Hardware, PlanRequest, default_global_batch_sequences, plan

BOOKINGS = [
    # model, gpu, nodes, network, sequence length
    ("proxy-150m", "H100-SXM", 1, "infiniband", 2048),
    ("llama3-8b", "H100-SXM", 2, "ethernet", 8192),
    ("llama3-70b", "H100-SXM", 8, "infiniband", 8192),
    ("llama3-70b", "H200", 4, "ethernet", 8192),
]


def _chosen(model: str, gpu: str, nodes: int, network: str, seq: int) -> Layout:
    hw = Hardware(gpu=gpu_spec(gpu), network=network_spec(network), num_nodes=nodes, gpus_per_node=8, price_cents_per_gpu_hour=250)
    config = config_by_name(model)
    req = PlanRequest(model=config, sequence_length=seq, num_training_tokens=10**9, hardware=hw,
                      global_batch_sequences=default_global_batch_sequences(config, seq, hw.world_size))
    return plan(req).layout


@pytest.fixture
def fake_world():
    def start(world_size: int, rank: int = 1) -> None:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


def _stand_in(layout: Layout):
    """A small model with the plan's divisibility (heads, d_ff, layers) so that tensors are tiny."""
    heads = max(4, layout.tp)
    config = replace(config_by_name("micro"), num_heads=heads, num_kv_heads=heads, d_model=8 * heads,
                     d_ff=16 * heads, num_layers=2 * layout.pp, vocab_size=64 * layout.tp)
    return build_model(config, seed=0)


@pytest.mark.parametrize("booking", BOOKINGS, ids=[f"{b[0]}-{b[1]}x{b[2]}-{b[3]}" for b in BOOKINGS])
def test_chosen_plan_builds_its_mesh_and_placements(booking, fake_world):
    layout = _chosen(*booking)
    fake_world(layout.world_size)
    mesh = build_device_mesh(layout, "cpu")
    assert mesh.size() == layout.world_size
    dims = dict(zip(mesh.mesh_dim_names, mesh.shape))
    assert dims == mesh_dims(layout) and all(dims.get(name, 1) == d for name, d in layout.degrees().items())
    model = parallelize(keep_stage(_stand_in(layout), layout, stage=0), mesh, layout)
    q = model.blocks[0].attention.q.weight
    o = model.blocks[0].attention.o.weight
    if layout.tp > 1:
        assert isinstance(q, DTensor) and q.placements[-1] == Shard(0) and o.placements[-1] == Shard(1)
        norm = model.blocks[0].attention_norm.weight  # sequence parallel: the norms' weights replicated over tp
        assert isinstance(norm, DTensor) and norm.placements[-1] == Replicate()
    if layout.shard_group > 1 or layout.dp_replicate > 1:
        assert isinstance(q, DTensor)
        if layout.dp_replicate > 1:
            assert q.placements[0] == Replicate()
    tokens = torch.randint(0, model.config.vocab_size, (1, 16))
    model.loss(tokens, tokens).backward()  # collectives are accepted by the fake group
    assert all(p.grad is not None for p in model.parameters())


def test_fsdp_shards_hold_one_shard_group_share(fake_world):
    layout = Layout(dp_shard=8)
    fake_world(8, rank=3)
    model = build_model(config_by_name("micro"), seed=0)
    total = model.num_parameters()
    parallelize(model, build_device_mesh(layout, "cpu"), layout)
    local = sum(p.to_local().numel() for p in model.parameters())
    assert local == pytest.approx(total / 8, rel=0.05)  # the planner's 16 bytes x N / shard group


def test_the_planner_prices_what_a_tensor_parallel_rank_holds(fake_world):
    # The blocks are split over tp; the embedding, the head and the final norm, and so the logits,
    # are whole on every tensor-parallel rank (the planner divided them by tp, and approved layouts
    # that ran out of memory). A vocabulary large beside the blocks makes the difference plain.
    layout = Layout(tp=2, dp_shard=2, compile=False, micro_batch_size=1)
    fake_world(4, rank=3)
    config = replace(config_by_name("micro"), num_heads=4, num_kv_heads=4, d_model=32, d_ff=64, num_layers=2,
                     vocab_size=4096)
    model = parallelize(build_model(config, seed=0), build_device_mesh(layout, "cpu"), layout)
    held = sum(p.to_local().numel() for p in model.parameters())
    priced = estimate_memory(config, layout, 16, gpu_spec("H100-SXM"))
    assert priced.model_states == BYTES_PER_PARAMETER_STATES * held
    logits = model(torch.randint(0, config.vocab_size, (1, 16)))
    assert logits.shape == (1, 16, config.vocab_size)  # all of them, on a tensor-parallel rank
    assert priced.logits == BYTES_PER_LOGIT * logits.numel()


@pytest.mark.parametrize(("layout", "names", "shape"), [
    (Layout(dp_shard=4), ("dp_shard",), (4,)),  # the runtime's FSDP2 mesh over all ranks
    (Layout(dp_replicate=2, dp_shard=2), ("dp_replicate", "dp_shard"), (2, 2)),  # HSDP
    (Layout(dp_replicate=4), ("dp_replicate", "dp_shard"), (4, 1)),  # replicas: a shard group of one
    (Layout(dp_shard=2, tp=2), ("dp_shard", "tp"), (2, 2)),
    (Layout(), ("dp_shard",), (1,)),
])
def test_the_mesh_has_the_dimensions_the_layout_splits(layout, names, shape, fake_world):
    fake_world(layout.world_size, rank=0)
    mesh = build_device_mesh(layout, "cpu")
    assert (mesh.mesh_dim_names, tuple(mesh.shape)) == (names, shape)


def test_replicas_hold_whole_parameters(fake_world):
    layout = Layout(dp_replicate=4)
    fake_world(4, rank=2)
    model = parallelize(build_model(config_by_name("micro"), seed=0), build_device_mesh(layout, "cpu"), layout)
    q = model.blocks[0].attention.q.weight
    assert q.placements[0] == Replicate() and q.to_local().shape == q.shape


def test_pipeline_stages_split_the_layers():
    assert list(stage_layer_range(12, 4, 2)) == [6, 7, 8]
    with pytest.raises(ValueError, match="stage"):
        stage_layer_range(12, 5, 0)
