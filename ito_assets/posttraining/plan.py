"""The plan of a recipe's post-training stages on the booked hardware: how long each takes as the
runtime executes it, so that the window a run must fit holds its post-training too, and what that
time costs on the booking.

Where each part runs (on_worker.py, dpo.py, generation.py, rollout_source.py, pipeline.py):
- SFT and DPO train on the stage worker in fp32, eager, each batch split over the data-parallel
  ranks `data_parallel_ranks` gives them (FSDP2 over several): one micro-batch per rank and
  step, every row at the padded width of the longest row.
- DPO's reference log-probabilities are computed once at the worker's start, each rank taking
  every n-th pass of pairs in turn (`reference_pass.py`): a forward over every pair's two answers,
  as long as the rank with the most pairs takes, with no collective but a sum at its end.
- The evaluation battery, in the asset's process on its CPU, after each stage's training and, for
  the recipe's first stage, before it: every held-out prompt sampled `EVAL_SAMPLES_PER_PROMPT` times
  and once greedily, and after training sampled again for the KL to the stage's start, whose
  completions each take a forward of the policy and of the reference.
- RLVR trains on one rank: each step a forward and backward of its groups' rows and two forwards
  (the proximal and the reference log-probabilities). Its groups are sampled by a generator
  process on one CPU core.
- Sampling (decoding.py) reads each prompt once into the model's KV cache, then feeds one token a
  step for every sample of it: a completion of n tokens costs n - 1 forwards of one position (its
  last token needs none), each reading the cache.

Each part's FLOPs (`flops_per_token`: 6 N + 12 L D T for a forward and backward, a third of it for
a forward) at the fp32 peak of what runs it (the host's parts on one core of the catalogue's
nominal host: the stage's process runs with the `posttraining` resource's `num_threads`, 1 unless
set, and the generator with one thread), times the planner's matmul efficiency
(`throughput.matmul_efficiency`, the same assumption as the curriculum's); the worker's FSDP
collectives (fp32: an all-gather forward and backward and a reduce-scatter, 12 bytes a parameter a
step) count where they exceed the compute they overlap, as the planner counts them. On the host, a
forward also has a fixed cost a block whatever its size (`HOST_SECONDS_PER_BLOCK_FORWARD`), which
decides a small model's decoding: the sampling's forwards are counted. The parts are
added: RLVR's generator runs beside its trainer, so the sum is the time without that overlap.

An upper bound where the runtime may do less: every completion at its `max_new_tokens` (a sampled
one often ends sooner), the host at its nominal core, idle, and RLVR's generation at its draw
bound: a group whose rewards are all equal, or that is too stale, is drawn again, and the stage
draws at most `max_draws_per_group` groups for each group its steps train on (`sampling.DrawBudget`),
all of them priced, and the groups its generator may have run ahead when the trainer stops (a full
queue and the one in hand). Not in the price: the steps a restarted attempt draws again (and its
generator's run-ahead); a stage records the groups it drew against its draw bound
(`generation_calibration`).
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DpoStep, PostTrainingEval, PostTrainingStep, RlvrStep, SftStep
from ito_assets.posttraining.eval_gate import EVAL_BATCH_PROMPTS, EVAL_SAMPLES_PER_PROMPT
from ito_assets.posttraining.reference_pass import busiest_rank_pairs
from ito_assets.posttraining.staleness import run_ahead_groups
from ito_assets.posttraining.tasks import (held_out_refusal, largest_digit_tasks, prefers_itself,
                                           self_preference_refusal, trains_held_out)
from ito_assets.runtime.stage.calibration import FLAG_FRACTION, RATIO_DIGITS
from ito_assets.training.cost import cost_cents
from ito_assets.training.hardware import GPUS
from ito_assets.training.model_config import ModelConfig, flops_per_token, parameter_count
from ito_assets.training.planner import Hardware
from ito_assets.training.throughput import matmul_efficiency, ring_seconds

# The asset's process and the generator run on the host: one core each of the catalogue's
# nominal host (2 cores), the threads they are given by default.
HOST = GPUS["CPU"]
HOST_CORES = 2
# A forward's fixed cost on the host, whatever its size: a block's two dozen operator calls (norms,
# projections, rotary, attention, MLP). Measured with one thread on this project's 2-core Xeon VM
# (2026-12-06): a decoding step of 8 rows (a one-token forward through the KV cache, then the
# sampling of its token) took 0.75 ms for `micro` (2 blocks) and 1.8 ms for `tiny` (4 blocks),
# where their FLOPs take under 0.1 ms.
HOST_SECONDS_PER_BLOCK_FORWARD = 0.5e-3
FSDP_FP32_BYTES_PER_PARAMETER = 4 + 4 + 4  # all-gather forward, all-gather backward, reduce-scatter


@dataclass(frozen=True, kw_only=True)
class PairShape:
    """What a recipe step's pair file holds, as its compute depends on it."""

    num_pairs: int
    # bos + prompt + the longest answer, counted in UTF-8 bytes: a byte-level BPE token and a
    # character each hold at least one byte, so the rows are never wider than this.
    longest_positions: int


@dataclass(frozen=True, kw_only=True)
class PostTrainingStagePlan:
    stage: str  # sft, dpo or rlvr
    num_ranks: int  # of the booking's GPUs, the ones the stage trains on; the rest wait, and are paid
    num_steps: int
    sequence_length: int  # the rows' width
    worker_flops: float  # training and, for DPO, its reference pass
    host_flops: float
    evaluation_flops: float  # the battery's, on the host
    host_forwards: int  # RLVR's generation's, each a fixed cost besides its FLOPs
    evaluation_forwards: int
    worker_seconds: float
    host_seconds: float  # RLVR's generation
    evaluation_seconds: float
    cost_cents: int  # the booking's every GPU for the stage's wall time

    @property
    def wall_seconds(self) -> float:
        return self.worker_seconds + self.host_seconds + self.evaluation_seconds

    def to_dict(self) -> dict:
        return {"stage": self.stage, "num_ranks": self.num_ranks, "num_steps": self.num_steps,
                "sequence_length": self.sequence_length, "worker_flops": float(self.worker_flops),
                "host_flops": float(self.host_flops), "evaluation_flops": float(self.evaluation_flops),
                "host_forwards": self.host_forwards, "evaluation_forwards": self.evaluation_forwards,
                "worker_seconds": round(self.worker_seconds, 3), "host_seconds": round(self.host_seconds, 3),
                "evaluation_seconds": round(self.evaluation_seconds, 3), "wall_seconds": round(self.wall_seconds, 3),
                "cost_cents": self.cost_cents}


def _answers(pair) -> tuple[str, ...]:
    """`fixtures.pair_answers` of a `fixtures.InstructionPair` or `PreferencePair`, without importing
    the data plane's reader into client verbs."""
    return (pair.response,) if hasattr(pair, "response") else (pair.chosen, pair.rejected)


def _positions(pair) -> int:
    """bos + prompt + the longest answer, in UTF-8 bytes."""
    return 1 + len(pair.prompt.encode("utf-8")) + max(len(a.encode("utf-8")) for a in _answers(pair))


def read_pair_shapes(recipe: Sequence[PostTrainingStep], data_root: Path, *,
                     allowed: Callable[[Path], bool] | None = None,
                     held_out_fraction: float = PostTrainingEval().held_out_fraction) -> dict[str, PairShape]:
    """The shape of each SFT and DPO step's pair file, read as the stage reads it (its bytes against
    the step's sha256; SOURCE_NOT_FOUND, SOURCE_DIGEST_MISMATCH, PROVENANCE_MISSING and
    POSTTRAINING_DATA_INVALID as the stage would refuse them: fewer pairs than one batch, a pair
    that holds a prompt the eval battery holds out at the manifest's `held_out_fraction`, by the
    stage's own rule `tasks.trains_held_out`) but a line at a time, in bounded memory. What needs
    the run's tokenizer is left to the stage (`fixtures.check_pairs`).
    `allowed`: where an opened file may lie (gate 5's data roots)."""
    steps = [step for step in recipe if not isinstance(step, RlvrStep)]
    if not steps:
        return {}
    from ito_assets.posttraining.fixtures import stream_bound_pairs  # the data plane's reader: not for client verbs

    shapes = {}
    for step in steps:
        shape = _read_shape(step, data_root, allowed, stream_bound_pairs, held_out_fraction)
        if shape.num_pairs < step.batch_size:
            raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID,
                           f"{step.data.uri} holds {shape.num_pairs} pairs, fewer than one batch of {step.batch_size}")
        shapes[step.kind] = shape
    return shapes


# Gate 5 plans every quote and confirmation with its pair files' shapes, and reading one is a pass
# over all its bytes (1.8 s of CPU for 100 MB here, `benchmarks/pair_shapes.py`). A shape read and
# verified once is kept under the file's identity (`fixtures.file_identity`), for as many files as
# a busy server binds at once.
KNOWN_SHAPES_MAX = 256
_known_shapes: OrderedDict[tuple, PairShape] = OrderedDict()
_known_lock = threading.Lock()


def _read_shape(step: SftStep | DpoStep, data_root: Path, allowed, stream, held_out_fraction: float) -> PairShape:
    """The step's file's shape: kept from an earlier read of the same bytes (under the same split),
    else read. The file is opened either way, so a file gone, moved outside the allowed roots or
    changed is answered as the first read would answer it."""
    kept: list[PairShape] = []
    seen = [0, 0, 0, 0]  # pairs, longest positions, the first pair holding a held-out prompt, preferring itself

    def key(identity) -> tuple:  # called once the step is known to bind a file
        return step.kind, step.data.uri, step.data.sha256, held_out_fraction, identity

    def known(identity) -> bool:
        with _known_lock:
            if key(identity) in _known_shapes:
                _known_shapes.move_to_end(key(identity))
                kept.append(_known_shapes[key(identity)])
        return bool(kept)

    def visit(pair) -> None:
        seen[0], seen[1] = seen[0] + 1, max(seen[1], _positions(pair))
        if not seen[2] and trains_held_out(pair.prompt, _answers(pair), held_out_fraction):
            seen[2] = seen[0]
        if not seen[3] and hasattr(pair, "chosen") and prefers_itself(pair.chosen, pair.rejected):
            seen[3] = seen[0]

    identity = stream(step, data_root, visit, allowed=allowed, known=known)
    if kept:
        return kept[0]
    if seen[2]:  # refused after the whole file verified: a file that is not the bound one says so first
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, held_out_refusal(step.data.uri, seen[2], held_out_fraction))
    if seen[3]:
        raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID, self_preference_refusal(f"{step.data.uri}: line {seen[3]}"))
    shape = PairShape(num_pairs=seen[0], longest_positions=seen[1])
    if identity is not None:
        with _known_lock:
            _known_shapes[key(identity)] = shape
            while len(_known_shapes) > KNOWN_SHAPES_MAX:
                _known_shapes.popitem(last=False)
    return shape


@functools.cache
def battery_prompt_positions() -> int:
    """bos + the longest prompt of the task battery (RLVR samples from it, the evaluation holds some
    of it out), in UTF-8 bytes, as pairs' are counted. Computed once: every plan prices it, and
    building the battery's thousand tasks took a planning call's 3 ms."""
    return 1 + max(len(task.prompt.encode("utf-8")) for task in largest_digit_tasks())


def data_parallel_ranks(kind: str, batch_size: int, nnodes: int, nproc_per_node: int) -> tuple[int, int, str | None]:
    """(nodes, ranks per node) a post-training stage trains on, out of what the training launcher
    gives a stage of the run's booking, and why it takes fewer (None: all of them). SFT and DPO split
    each batch evenly over data-parallel ranks, so they take every rank when the batch divides over
    them, else the most ranks of one node that divide it. RLVR takes one: its generator process
    serves one trainer."""
    if kind == "rlvr":
        return 1, 1, None if nnodes * nproc_per_node == 1 else "RLVR's generator serves one trainer"
    if batch_size % (nnodes * nproc_per_node) == 0:
        return nnodes, nproc_per_node, None
    ranks = max(r for r in range(1, min(nproc_per_node, batch_size) + 1) if batch_size % r == 0)
    return 1, ranks, f"the batch of {batch_size} does not divide over {nnodes * nproc_per_node} ranks"


def _worker_seconds(flops: float, config: ModelConfig, hardware: Hardware, ranks: int, num_steps: int) -> float:
    compute = flops / (ranks * hardware.gpu.peak_fp32_flops * matmul_efficiency(config))
    link = (hardware.gpu.intra_node_bandwidth if ranks <= hardware.gpus_per_node
            else min(hardware.network.bandwidth, hardware.gpu.intra_node_bandwidth))
    collectives = num_steps * ring_seconds(FSDP_FP32_BYTES_PER_PARAMETER * parameter_count(config), ranks, link)
    return compute + max(0.0, collectives - compute)


def host_seconds(flops: float, forwards: int, config: ModelConfig) -> float:
    """Seconds of `flops` in `forwards` forwards on one core of the nominal host: the FLOPs at the
    planner's matmul efficiency, and each forward's fixed cost."""
    compute = flops / (HOST.peak_fp32_flops / HOST_CORES * matmul_efficiency(config))
    return compute + forwards * config.num_layers * HOST_SECONDS_PER_BLOCK_FORWARD


def _generation_flops(prompts: float, samples: int, prompt: int, new: int, per_position: float) -> float:
    """`samples` completions of each of `prompts` prompts, through the KV cache: the prompt's
    positions once, then one position for each token of each completion but its last."""
    return prompts * (prompt + samples * (new - 1)) * per_position / 3


def evaluation_flops(config: ModelConfig, battery, *, first: bool) -> float:
    """The battery after a stage's training (and before it, for the recipe's first stage):
    `battery` holds `num_prompts` and `max_new_tokens` (the manifest's `post_training_eval`)."""
    prompt, new = battery_prompt_positions(), battery.max_new_tokens
    per_position = flops_per_token(config, prompt + new)
    sampled = _generation_flops(1, EVAL_SAMPLES_PER_PROMPT, prompt, new, per_position)
    rewards = (sampled + _generation_flops(1, 1, prompt, new, per_position)) * (2 if first else 1)  # and greedy
    # The KL's samples, then a forward of each through the policy and the reference.
    kl = sampled + 2 * EVAL_SAMPLES_PER_PROMPT * (prompt + new) * per_position / 3
    return battery.num_prompts * (rewards + kl)


def evaluation_forwards(battery, *, first: bool) -> int:
    """The battery's forwards: its prompts go in batches of one length (at most
    `EVAL_BATCH_PROMPTS`; a prompt's length is 2 to `battery_prompt_positions()` positions, so at
    most that many - 2 more batches than the prompts fill); a batch's sampling and greedy decoding
    each take `max_new_tokens` forwards, before and after for the first stage, the KL's sampling as
    many and its two scoring forwards."""
    prompts, new = battery.num_prompts, battery.max_new_tokens
    batches = min(prompts, math.ceil(prompts / EVAL_BATCH_PROMPTS) + battery_prompt_positions() - 2)
    return batches * (2 * new * (2 if first else 1) + new + 2)


def evaluation_seconds(config: ModelConfig, battery, *, first: bool) -> float:
    """The battery's planned seconds after a stage (and before it, `first`), on one host core."""
    return host_seconds(evaluation_flops(config, battery, first=first), evaluation_forwards(battery, first=first),
                        config)


def evaluation_calibration(config: ModelConfig, battery, *, first: bool, cpu_s: float, wall_s: float) -> dict:
    """The stage's evaluations as planned and as measured. Judged on CPU seconds, what one core's
    price is comparable with whatever the threads (a second thread's work counts, a busy host's
    waiting does not); the wall seconds beside them. The plan is an upper bound here, so only the
    one side is flagged: more than `FLAG_FRACTION` above it (or no price to compare) means the
    window and cost the confirmation bound were short (`underpriced`)."""
    planned = evaluation_seconds(config, battery, first=first)
    ratio = cpu_s / planned if planned > 0 else math.nan  # judged before it is rounded for display
    return {"planned_s": round(planned, 3), "measured_cpu_s": round(cpu_s, 3), "measured_wall_s": round(wall_s, 3),
            "ratio": round(ratio, RATIO_DIGITS), "underpriced": not math.isfinite(ratio) or ratio > 1 + FLAG_FRACTION}


def priced_groups(step: RlvrStep) -> int:
    """The groups RLVR's steps may draw: its draw bound (`sampling.DrawBudget`)."""
    return step.num_steps * step.groups_per_step * step.max_draws_per_group


def generated_groups(step: RlvrStep) -> int:
    """The groups RLVR's generation is priced at: its draw bound, and those its generator may have
    made past them when training stops (`staleness.run_ahead_groups`)."""
    return priced_groups(step) + run_ahead_groups(step.groups_per_step)


def generation_calibration(step: RlvrStep, num_drawn: int) -> dict:
    """RLVR's groups as the plan priced them (its draw bound) and as the stage's steps drew them
    (redrawn ones included: all equal, or too stale). Each group is priced at its longest
    completions, so the ratio bounds the generation's compute against its price from above. The
    bound holds within an attempt; a stage that drew more (a restarted attempt draws its steps
    again) is flagged (`overdrawn`): its generation may have run past the window and cost the
    confirmation bound."""
    planned = priced_groups(step)
    return {"planned_groups": planned, "drawn_groups": num_drawn, "ratio": round(num_drawn / planned, RATIO_DIGITS),
            "overdrawn": num_drawn > planned}


def _pairs_stage(step: SftStep | DpoStep, shape: PairShape, config: ModelConfig, hardware: Hardware,
                 evaluation: tuple[float, int]) -> PostTrainingStagePlan:
    nodes, per_node, _ = data_parallel_ranks(step.kind, step.batch_size, hardware.num_nodes, hardware.gpus_per_node)
    width = min(shape.longest_positions, config.max_seq_len)
    epochs = step.num_epochs if isinstance(step, SftStep) else 1
    num_steps = epochs * (shape.num_pairs // step.batch_size)  # full batches only (sft_batches, dpo_batches)
    answers = 1 if isinstance(step, SftStep) else 2  # DPO's chosen and rejected rows
    per_position = flops_per_token(config, width)
    ranks = nodes * per_node
    worker = (num_steps * step.batch_size * answers * width * per_position, 0.0, 0.0)
    if isinstance(step, DpoStep):
        pair = answers * width * per_position / 3  # a forward of its two answers
        busiest = busiest_rank_pairs(shape.num_pairs, width, config.vocab_size, ranks)
        worker = (worker[0], shape.num_pairs * pair, busiest * pair)
    return _stage_plan(step.kind, ranks, num_steps, width, worker, (0.0, 0), evaluation, config, hardware)


def _rlvr_stage(step: RlvrStep, config: ModelConfig, hardware: Hardware,
                evaluation: tuple[float, int]) -> PostTrainingStagePlan:
    prompt, new = battery_prompt_positions(), step.max_new_tokens
    width = prompt + new
    per_position = flops_per_token(config, width)
    groups, generated = step.num_steps * step.groups_per_step, generated_groups(step)
    worker = (groups * step.group_size * width * per_position * 5 / 3, 0.0, 0.0)  # and proximal and reference forwards
    generation = (_generation_flops(generated, step.group_size, prompt, new, per_position), generated * new)
    return _stage_plan("rlvr", 1, step.num_steps, width, worker, generation, evaluation, config, hardware)


def _stage_plan(stage: str, ranks: int, num_steps: int, width: int, worker: tuple[float, float, float],
                host: tuple[float, int], evaluation: tuple[float, int], config: ModelConfig,
                hardware: Hardware) -> PostTrainingStagePlan:
    """`worker`: (the training's FLOPs, the reference pass's, its busiest rank's); `host` and
    `evaluation`: (FLOPs, forwards) each."""
    training, reference, busiest = worker
    worker_s = (_worker_seconds(training, config, hardware, ranks, num_steps)
                + busiest / (hardware.gpu.peak_fp32_flops * matmul_efficiency(config)))
    host_s, evaluation_s = host_seconds(*host, config), host_seconds(*evaluation, config)
    return PostTrainingStagePlan(
        stage=stage, num_ranks=ranks, num_steps=num_steps, sequence_length=width, worker_flops=training + reference,
        host_flops=host[0], evaluation_flops=evaluation[0], host_forwards=host[1], evaluation_forwards=evaluation[1],
        worker_seconds=worker_s, host_seconds=host_s, evaluation_seconds=evaluation_s,
        cost_cents=cost_cents(hardware.world_size, worker_s + host_s + evaluation_s, hardware.price_cents_per_gpu_hour))


def check_completions_fit(recipe: Sequence[PostTrainingStep], config: ModelConfig, battery) -> None:
    """What the stage refuses of the recipe's completion lengths (`fixtures.check_completions`),
    where it is sure before the run's tokenizer exists: a prompt holds bos and a token at least, so
    a completion of `max_new_tokens` needs at least `max_new_tokens` + 1 positions."""
    lengths = [("the rlvr step's", step.max_new_tokens) for step in recipe if isinstance(step, RlvrStep)]
    if recipe:
        lengths.append(("the evaluation battery's", battery.max_new_tokens))
    for whose, new in lengths:
        if new + 1 > config.max_seq_len:
            raise ItoError(ErrorCode.POSTTRAINING_DATA_INVALID,
                           f"{whose} completions of up to {new} tokens (max_new_tokens) and a prompt need at least "
                           f"{new + 1} positions; the model holds {config.max_seq_len}")


def plan_post_training(recipe: Sequence[PostTrainingStep], config: ModelConfig, hardware: Hardware,
                       shapes: Mapping[str, PairShape], battery) -> tuple[PostTrainingStagePlan, ...]:
    """One plan per recipe step, in the recipe's order; `shapes` holds each SFT or DPO step's pair
    file shape by its kind (`read_pair_shapes`), `battery` the evaluation's sizes (the manifest's
    `post_training_eval`). POSTTRAINING_DATA_INVALID for completions the model cannot hold."""
    check_completions_fit(recipe, config, battery)
    plans = []
    for index, step in enumerate(recipe):
        first = index == 0
        evaluation = (evaluation_flops(config, battery, first=first), evaluation_forwards(battery, first=first))
        plans.append(_rlvr_stage(step, config, hardware, evaluation) if isinstance(step, RlvrStep)
                     else _pairs_stage(step, shapes[step.kind], config, hardware, evaluation))
    return tuple(plans)


def total_wall_seconds(plans: Sequence[PostTrainingStagePlan]) -> float:
    return math.fsum(p.wall_seconds for p in plans)
