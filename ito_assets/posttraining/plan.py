"""The plan of a recipe's post-training stages on the booked hardware: how long each takes as the
runtime executes it, so that the window a run must fit holds its post-training too, and what that
time costs on the booking.

Where each part runs (on_worker.py, dpo.py, generation.py, rollout_source.py):
- SFT and DPO train on the stage worker in fp32, eager, each batch split over the data-parallel
  ranks `stage.data_parallel_ranks` gives them (FSDP2 over several): one micro-batch per rank and
  step, every row at the padded width of the longest row.
- DPO's reference log-probabilities are computed once before launch, in the asset's process, on
  its CPU: a forward over every pair's two answers.
- RLVR trains on one rank: each step a forward and backward of its groups' rows and two forwards
  (the proximal and the reference log-probabilities). Its groups are sampled by a generator
  process on one CPU core, a token at a time without a KV cache: each new token is a forward over
  the whole prefix of the group's completions.

Each part's FLOPs (`flops_per_token`: 6 N + 12 L D T for a forward and backward, a third of it for
a forward) at the fp32 peak of what runs it, times the planner's matmul efficiency
(`throughput.matmul_efficiency`, the same assumption as the curriculum's); the worker's FSDP
collectives (fp32: an all-gather forward and backward and a reduce-scatter, 12 bytes a parameter a
step) count where they exceed the compute they overlap, as the planner counts them. The parts are
added: RLVR's generator runs beside its trainer, so the sum is the time without that overlap.

Not in the price: the evaluation battery each stage runs before and after training (its size is the
`posttraining` resource's, not the recipe's) and RLVR's redrawn groups (a group whose rewards are
all equal, or that is too stale, is drawn again, up to 10 a wanted group: `sampling.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DpoStep, PostTrainingStep, RlvrStep, SftStep
from ito_assets.posttraining.tasks import largest_digit_tasks
from ito_assets.training.cost import cost_cents
from ito_assets.training.hardware import GPUS
from ito_assets.training.model_config import ModelConfig, flops_per_token, parameter_count
from ito_assets.training.planner import Hardware
from ito_assets.training.throughput import matmul_efficiency, ring_seconds

# The asset's process and the generator run on the host, priced as the catalogue's nominal host
# (2 cores); the generator takes one of them (generation.py sets one thread).
HOST = GPUS["CPU"]
GENERATOR_CORES_SHARE = 0.5
FSDP_FP32_BYTES_PER_PARAMETER = 4 + 4 + 4  # all-gather forward, all-gather backward, reduce-scatter


@dataclass(frozen=True, kw_only=True)
class PairShape:
    """What a recipe step's pair file holds, as its compute depends on it."""

    num_pairs: int
    # bos + prompt + the longest answer, counted in UTF-8 bytes: a byte-level BPE token and a
    # character each hold at least one byte, so the rows are never wider than this.
    longest_positions: int

    def to_dict(self) -> dict:
        return dict(vars(self))


@dataclass(frozen=True, kw_only=True)
class PostTrainingStagePlan:
    stage: str  # sft, dpo or rlvr
    num_ranks: int  # of the booking's GPUs, the ones the stage trains on; the rest wait, and are paid
    num_steps: int
    sequence_length: int  # the rows' width
    worker_flops: float
    host_flops: float
    worker_seconds: float
    host_seconds: float
    cost_cents: int  # the booking's every GPU for the stage's wall time

    @property
    def wall_seconds(self) -> float:
        return self.worker_seconds + self.host_seconds

    def to_dict(self) -> dict:
        return {"stage": self.stage, "num_ranks": self.num_ranks, "num_steps": self.num_steps,
                "sequence_length": self.sequence_length, "worker_flops": self.worker_flops,
                "host_flops": self.host_flops, "worker_seconds": round(self.worker_seconds, 3),
                "host_seconds": round(self.host_seconds, 3), "wall_seconds": round(self.wall_seconds, 3),
                "cost_cents": self.cost_cents}


def _positions(pair) -> int:
    """bos + prompt + the longest answer, in UTF-8 bytes; of a `fixtures.InstructionPair` or `PreferencePair`."""
    answers = (pair.response,) if hasattr(pair, "response") else (pair.chosen, pair.rejected)
    return 1 + len(pair.prompt.encode("utf-8")) + max(len(a.encode("utf-8")) for a in answers)


def pair_shape(pairs: Sequence) -> PairShape:
    return PairShape(num_pairs=len(pairs), longest_positions=max(_positions(p) for p in pairs))


def read_pair_shapes(recipe: Sequence[PostTrainingStep], data_root: Path) -> dict[str, PairShape]:
    """The shape of each SFT and DPO step's pair file, read as the stage reads it (its bytes against
    the step's sha256; SOURCE_NOT_FOUND, SOURCE_DIGEST_MISMATCH, PROVENANCE_MISSING and
    POSTTRAINING_DATA_INVALID as the stage would refuse them, and fewer pairs than one batch) but a
    line at a time, in bounded memory. What needs the run's tokenizer is left to the stage
    (`fixtures.check_pairs`)."""
    from ito_assets.posttraining.fixtures import stream_bound_pairs  # the data plane's reader: not for client verbs

    shapes = {}
    for step in recipe:
        if isinstance(step, RlvrStep):
            continue
        seen = [0, 0]  # pairs, longest positions

        def visit(pair, seen=seen) -> None:
            seen[0], seen[1] = seen[0] + 1, max(seen[1], _positions(pair))

        stream_bound_pairs(step, data_root, visit)
        if seen[0] < step.batch_size:
            raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID,
                           f"{step.data.uri} holds {seen[0]} pairs, fewer than one batch of {step.batch_size}")
        shapes[step.kind] = PairShape(num_pairs=seen[0], longest_positions=seen[1])
    return shapes


def rlvr_prompt_positions() -> int:
    """bos + the longest prompt of the task battery RLVR samples from, in UTF-8 bytes (as pairs')."""
    return 1 + max(len(task.prompt.encode("utf-8")) for task in largest_digit_tasks())


def _worker_seconds(flops: float, config: ModelConfig, hardware: Hardware, ranks: int, num_steps: int) -> float:
    compute = flops / (ranks * hardware.gpu.peak_fp32_flops * matmul_efficiency(config))
    link = (hardware.gpu.intra_node_bandwidth if ranks <= hardware.gpus_per_node
            else min(hardware.network.bandwidth, hardware.gpu.intra_node_bandwidth))
    collectives = num_steps * ring_seconds(FSDP_FP32_BYTES_PER_PARAMETER * parameter_count(config), ranks, link)
    return compute + max(0.0, collectives - compute)


def _host_seconds(flops: float, config: ModelConfig, share: float = 1.0) -> float:
    return flops / (share * HOST.peak_fp32_flops * matmul_efficiency(config))


def _pairs_stage(step: SftStep | DpoStep, shape: PairShape, config: ModelConfig,
                 hardware: Hardware) -> PostTrainingStagePlan:
    from ito_assets.posttraining.stage import data_parallel_ranks  # stage.py loads the tokenizers: not at import

    nodes, per_node, _ = data_parallel_ranks(step.kind, step.batch_size, hardware.num_nodes, hardware.gpus_per_node)
    width = min(shape.longest_positions, config.max_seq_len)
    epochs = step.num_epochs if isinstance(step, SftStep) else 1
    num_steps = epochs * (shape.num_pairs // step.batch_size)  # full batches only (sft_batches, dpo_batches)
    answers = 1 if isinstance(step, SftStep) else 2  # DPO's chosen and rejected rows
    per_position = flops_per_token(config, width)
    worker = num_steps * step.batch_size * answers * width * per_position
    host = 0.0 if isinstance(step, SftStep) else shape.num_pairs * answers * width * per_position / 3
    return _stage_plan(step.kind, nodes * per_node, num_steps, width, worker, host,
                       _host_seconds(host, config), config, hardware)


def _rlvr_stage(step: RlvrStep, config: ModelConfig, hardware: Hardware) -> PostTrainingStagePlan:
    prompt, new = rlvr_prompt_positions(), step.max_new_tokens
    width = prompt + new
    per_position = flops_per_token(config, width)
    rows = step.num_steps * step.groups_per_step * step.group_size
    worker = rows * width * per_position * 5 / 3  # forward and backward, proximal and reference forwards
    # Token t of a completion is a forward over the prompt and the t tokens before it.
    host = rows * (new * prompt + new * (new - 1) / 2) * per_position / 3
    return _stage_plan("rlvr", 1, step.num_steps, width, worker, host,
                       _host_seconds(host, config, GENERATOR_CORES_SHARE), config, hardware)


def _stage_plan(stage: str, ranks: int, num_steps: int, width: int, worker: float, host: float, host_s: float,
                config: ModelConfig, hardware: Hardware) -> PostTrainingStagePlan:
    worker_s = _worker_seconds(worker, config, hardware, ranks, num_steps)
    return PostTrainingStagePlan(
        stage=stage, num_ranks=ranks, num_steps=num_steps, sequence_length=width, worker_flops=worker,
        host_flops=host, worker_seconds=worker_s, host_seconds=host_s,
        cost_cents=cost_cents(hardware.world_size, worker_s + host_s, hardware.price_cents_per_gpu_hour))


def plan_post_training(recipe: Sequence[PostTrainingStep], config: ModelConfig, hardware: Hardware,
                       shapes: Mapping[str, PairShape]) -> tuple[PostTrainingStagePlan, ...]:
    """One plan per recipe step, in the recipe's order; `shapes` holds each SFT or DPO step's pair
    file shape by its kind (`fixtures.bound_pair_shapes` reads them)."""
    plans = []
    for step in recipe:
        if isinstance(step, RlvrStep):
            plans.append(_rlvr_stage(step, config, hardware))
        else:
            plans.append(_pairs_stage(step, shapes[step.kind], config, hardware))
    return tuple(plans)


def total_wall_seconds(plans: Sequence[PostTrainingStagePlan]) -> float:
    return math.fsum(p.wall_seconds for p in plans)
