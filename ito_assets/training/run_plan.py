"""The plan of a manifest's whole training run: one planner call per curriculum stage (each has its
own sequence length and token count), the recipe's post-training stages as the runtime executes
them (`posttraining.plan`), their summed time and cost, and the budget verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ito_assets.manifest.schema import Budget, Manifest
from ito_assets.posttraining.plan import PairShape, PostTrainingStagePlan, plan_post_training, total_wall_seconds
from ito_assets.training.layout import PlanRefused, Refusal, RefusalReason
from ito_assets.training.model_config import CONFIGS, ModelConfig, config_by_name, parameter_count
from ito_assets.training.planner import Hardware, Plan, PlanRequest, default_global_batch_sequences, plan


@dataclass(frozen=True, kw_only=True)
class StagePlan:
    stage: str
    plan: Plan


@dataclass(frozen=True, kw_only=True)
class BudgetVerdict:
    cost_cents: int
    cap_cents: int
    max_incremental_cents: int

    @property
    def within_cap(self) -> bool:
        return self.cost_cents <= self.cap_cents

    @property
    def within_max_incremental(self) -> bool:
        return self.cost_cents <= self.max_incremental_cents

    def to_dict(self) -> dict:
        return {**vars(self), "within_cap": self.within_cap, "within_max_incremental": self.within_max_incremental}


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    model: ModelConfig
    manifest_num_parameters: int
    hardware: Hardware
    stages: tuple[StagePlan, ...]
    # The recipe's stages; None where its pair files were not read (an offline `ito plan` without
    # them, the data decision's economics): the time and cost below are then the curriculum's alone.
    post_training: tuple[PostTrainingStagePlan, ...] | None
    budget: BudgetVerdict

    @property
    def post_training_included(self) -> bool:
        return self.post_training is not None

    @property
    def curriculum_cost_cents(self) -> int:
        return sum(s.plan.cost_cents for s in self.stages)

    @property
    def cost_cents(self) -> int:
        return self.curriculum_cost_cents + sum(p.cost_cents for p in self.post_training or ())

    @property
    def wall_seconds(self) -> float:
        # Correctly rounded: sum() of floats rounds differently from Python 3.12 on (compensated
        # summation), and gate 5, the training job and `ito plan` must agree on the last bit.
        return math.fsum([*(s.plan.wall_seconds for s in self.stages), total_wall_seconds(self.post_training or ())])

    def to_dict(self) -> dict:
        return {
            "model": {"name": self.model.name, "num_parameters": parameter_count(self.model),
                      "manifest_num_parameters": self.manifest_num_parameters, "vocab_size": self.model.vocab_size},
            "hardware": self.hardware.describe(),
            "stages": [{"stage": s.stage, **s.plan.to_dict()} for s in self.stages],
            "post_training": None if self.post_training is None else [p.to_dict() for p in self.post_training],
            "post_training_included": self.post_training_included,
            "cost_cents": self.cost_cents, "wall_seconds": round(self.wall_seconds, 3), "budget": self.budget.to_dict(),
        }


def manifest_model(manifest: Manifest) -> ModelConfig:
    """The named shape the manifest's `model.size` refers to; an unknown size cannot be planned."""
    if manifest.model.size not in CONFIGS:
        refusal = Refusal(reason=RefusalReason.UNKNOWN_MODEL_SIZE, detail=f"known sizes: {', '.join(sorted(CONFIGS))}")
        raise PlanRefused((refusal,), "the manifest's model size is not one the planner knows")
    return config_by_name(manifest.model.size)


def plan_run(manifest: Manifest, hardware: Hardware, *, pair_shapes: Mapping[str, PairShape] | None) -> RunPlan:
    """Plan every stage of the manifest's training target and its post-training recipe on
    `hardware` (raises PlanRefused). `pair_shapes`: the recipe's pair files as
    `posttraining.plan.read_pair_shapes` reads them; None leaves post-training unplanned."""
    model = manifest_model(manifest)
    stages = []
    for stage in manifest.training_target.stages:
        request = PlanRequest(
            model=model, sequence_length=stage.sequence_length, num_training_tokens=stage.num_tokens, hardware=hardware,
            global_batch_sequences=default_global_batch_sequences(model, stage.sequence_length, hardware.world_size),
        )
        stages.append(StagePlan(stage=stage.name, plan=plan(request)))
    post = (None if pair_shapes is None
            else plan_post_training(manifest.post_training, model, hardware, pair_shapes, manifest.post_training_eval))
    cost = sum(s.plan.cost_cents for s in stages) + sum(p.cost_cents for p in post or ())  # as cost_cents
    return RunPlan(model=model, manifest_num_parameters=manifest.model.num_parameters, hardware=hardware,
                   stages=tuple(stages), post_training=post, budget=budget_verdict(cost, manifest.budget))


def budget_verdict(cost_cents: int, budget: Budget) -> BudgetVerdict:
    return BudgetVerdict(cost_cents=cost_cents, cap_cents=budget.cap_cents, max_incremental_cents=budget.max_incremental_cents)



@dataclass(frozen=True, kw_only=True)
class PlanOutcome:
    """A plan or the refusal of one, as data (the `training_plan` asset's value)."""

    run_plan: RunPlan | None
    refusal_reasons: tuple[str, ...] = ()
    refusal_message: str | None = None

    @property
    def refused(self) -> bool:
        return self.run_plan is None

    def to_dict(self) -> dict:
        if self.run_plan is None:
            return {"refused": True, "reasons": list(self.refusal_reasons), "message": self.refusal_message}
        return {"refused": False, **self.run_plan.to_dict()}


def plan_outcome(manifest: Manifest, hardware: Hardware, *, pair_shapes: Mapping[str, PairShape] | None) -> PlanOutcome:
    try:
        return PlanOutcome(run_plan=plan_run(manifest, hardware, pair_shapes=pair_shapes))
    except PlanRefused as refused:
        return PlanOutcome(run_plan=None, refusal_reasons=refused.reasons, refusal_message=refused.message)


def booked_hardware(*, gpu_type: str, topology: str, network: str, num_nodes: int, num_gpus: int,
                    price_per_gpu_hour_cents: int) -> Hardware:
    """The planner's hardware for a booking's terms (a model name is read with the topology:
    `H100` on `1x8-nvlink` is the planner's `H100-SXM`, elsewhere `H100-PCIe`; `ib-`, `roce-` and
    `eth-` networks are InfiniBand, RoCE and Ethernet): what `ito plan --booking` plans for and
    what the training job then executes. PLAN_REFUSED when the planner cannot price the booking's
    GPU or network."""
    from ito_assets.errors import ErrorCode, ItoError
    from ito_assets.training.hardware import booked_gpu, booked_network

    try:
        gpu, fabric = booked_gpu(gpu_type, topology), booked_network(network)
    except ValueError as exc:
        raise ItoError(ErrorCode.PLAN_REFUSED, f"the booking's hardware cannot be planned: {exc}") from None
    return Hardware(gpu=gpu, network=fabric, num_nodes=num_nodes, gpus_per_node=num_gpus // num_nodes,
                    price_cents_per_gpu_hour=price_per_gpu_hour_cents)
