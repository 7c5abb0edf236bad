"""A plan's layout as a real torch DeviceMesh, and the model parallelized over it: tensor
parallelism (Megatron column/row split with `parallelize_module`) inside, FSDP2 (`fully_shard`)
over dp_shard x cp, HSDP when dp_replicate > 1; pipeline stages hold a slice of the layers.

The stage worker builds its mesh and parallelizes its model here (`ito_assets.runtime.worker.execution`),
and the tests validate chosen plans' placements on torch's fake process group without GPUs
(`init_process_group("fake", ...)`). Context parallelism is represented in the mesh and in FSDP's
shard group; ring attention itself (torch's experimental `context_parallel`) is applied nowhere
yet, so the planner does not offer it (`ito_assets.training.capabilities`).
"""

from __future__ import annotations

import warnings

from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from ito_assets.training.layout import Layout
from ito_assets.training.model import DecoderLM

# Megatron-LM's split (Shoeybi et al. 2019): q, k, v and the MLP inputs by output columns, the
# attention output and MLP down projection by input rows. With sequence parallelism (Korthikanti et
# al. 2022) the norms and the residual stream between them hold a slice of the sequence: each
# sub-layer all-gathers its input and reduce-scatters its output (torchtitan's Llama plan), so the
# norms' activations are split tp ways too.
TENSOR_PARALLEL_PLAN = {
    "attention_norm": SequenceParallel(),
    "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)),
    "attention.q": ColwiseParallel(),
    "attention.k": ColwiseParallel(),
    "attention.v": ColwiseParallel(),
    "attention.o": RowwiseParallel(output_layouts=Shard(1)),
    "mlp_norm": SequenceParallel(),
    "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
    "mlp.up": ColwiseParallel(),
    "mlp.gate": ColwiseParallel(),
    "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
}


def mesh_dims(layout: Layout) -> dict[str, int]:
    """The mesh's dimensions, outermost first: those the layout splits (degree > 1), and dp_shard
    always, so that FSDP has a shard dimension (of size 1 under pure replication, HSDP's 2-D mesh).
    A dimension of size 1 would only add process groups, so a plan that only shards is the 1-D
    mesh ("dp_shard",) over every rank, as torchtitan builds it."""
    return {name: degree for name, degree in layout.degrees().items() if degree > 1 or name == "dp_shard"}


def build_device_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The mesh of `mesh_dims`, with the flattened `dp_shard_cp` dimension FSDP shards over when
    context parallelism splits. The process group must have `world_size` ranks."""
    dims = mesh_dims(layout)
    mesh = init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))
    if layout.cp > 1:
        mesh[("dp_shard", "cp")]._flatten("dp_shard_cp")
    return mesh


def data_mesh(mesh: DeviceMesh, layout: Layout) -> DeviceMesh:
    """FSDP's mesh: the shard group (dp_shard x cp), behind dp_replicate's replicas for HSDP."""
    shard = "dp_shard_cp" if layout.cp > 1 else "dp_shard"
    with warnings.catch_warnings():
        # torch 2.13 warns that slicing a flattened dimension from the root mesh will change;
        # torchtitan 0.2 slices it the same way. Revisit with the torch pin.
        warnings.simplefilter("ignore", UserWarning)
        return mesh[("dp_replicate", shard)] if layout.dp_replicate > 1 else mesh[shard]


def stage_layer_range(num_layers: int, pp: int, stage: int) -> range:
    """Layers of pipeline stage `stage` (equal slices; the planner refuses uneven ones)."""
    if num_layers % pp or not 0 <= stage < pp:
        raise ValueError("stage must be a valid stage of pp equal slices of the layers")
    size = num_layers // pp
    return range(stage * size, (stage + 1) * size)


def _tensor_parallel_plan(model: DecoderLM) -> dict:
    return {k: v for k, v in TENSOR_PARALLEL_PLAN.items() if k != "mlp.gate" or model.config.mlp == "swiglu"}


def parallelize(model: DecoderLM, mesh: DeviceMesh, layout: Layout,
                mixed_precision: MixedPrecisionPolicy | None = None) -> DecoderLM:
    """Apply tensor parallelism, then FSDP2 per block and at the root (torchtitan's order), each
    block its own unit (gathered just before its forward, freed after); the root holds the
    embedding and the output head (tied weights must share a unit)."""
    if layout.tp > 1:
        plan = _tensor_parallel_plan(model)
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], plan)
        # The embedding, the final norm and the tied head stay whole on every rank: the first block
        # takes its slice of the sequence, the last one gives the whole sequence back.
        parallelize_module(model.blocks[0], mesh["tp"], PrepareModuleInput(
            input_layouts=(Replicate(), None, None), desired_input_layouts=(Shard(1), None, None), use_local_output=True))
        parallelize_module(model.blocks[-1], mesh["tp"], PrepareModuleOutput(
            output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=True))
    if layout.shard_group > 1 or layout.dp_replicate > 1:
        fsdp_mesh = data_mesh(mesh, layout)
        policy = mixed_precision or MixedPrecisionPolicy()
        for block in model.blocks:
            fully_shard(block, mesh=fsdp_mesh, mp_policy=policy)
        fully_shard(model, mesh=fsdp_mesh, mp_policy=policy)
    return model


def keep_stage(model: DecoderLM, layout: Layout, stage: int) -> DecoderLM:
    """Drop the layers that other pipeline stages hold (the embedding and head stay, so that the
    stage runs alone in a test; a pipeline schedule drops them on inner stages)."""
    if layout.pp == 1:
        return model
    keep = stage_layer_range(model.config.num_layers, layout.pp, stage)
    model.blocks = nn.ModuleList(model.blocks[i] for i in keep)
    return model
