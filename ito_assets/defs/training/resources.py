"""The training runtime's knobs as a Dagster resource (key `training_runtime`): an optional batch
override, the supervisor's bounds, the gates' measured noise bands and their default thresholds.
Defaults are the embedded CPU installation's; where the ranks run is `training_launcher`'s.

The plan decides the model, the global batch and the layout of every stage
(`ito_assets.runtime.stage.curriculum`); the manifest's `training_target.eval_gate`, when set, decides the
gate thresholds over the defaults here."""

from typing import Optional

from pydantic import model_validator

from ito_assets.defs.resources import StrictResource
from ito_assets.manifest.schema import EvalGate
from ito_assets.runtime.stage.config import MAX_SEED
from ito_assets.runtime.stage.eval_gate import MAX_REGRESSION_BANDS, MIN_IMPROVEMENT_BANDS, Direction, GatedMetric, EvalGatePolicy
from ito_assets.runtime.supervision.supervisor import SupervisorConfig

# Seed-to-seed sample standard deviations (seeds 0, 1, 2) of the tiny model's battery after
# fixture-small's pretraining stage at the plan's global batch (13 steps of 128 x 128 tokens, FSDP2,
# world size 2 on gloo): held-out loss 6.581 / 6.600 / 6.615 nats per token, sd 0.0169; answer loss
# 6.591 / 6.623 / 6.617 nats per answer token, sd 0.0173. Measured by `benchmarks/fault_recovery.py`
# on the 2-core CPU machine (torch 2.13; docs/performance.md), in fp32. In bf16 with 4 micro-batches
# per rank (on a CPU with AVX512-BF16): sd 0.0150 and 0.0154 (2026-12-02); the larger band is kept.
HELDOUT_LOSS_NOISE_BAND = 0.017
ANSWER_LOSS_NOISE_BAND = 0.017


class TrainingRuntimeResource(StrictResource):
    # None: every stage trains the plan's global batch. Set it on a host that cannot hold that
    # batch: the stage then takes more, smaller steps over the same reviewed tokens.
    batch_size: Optional[int] = None
    seed: int = 0
    # True: a plan that replicates (dp_replicate > 1) trains as torchft replica groups that heal each
    # other (`ito_assets.runtime.supervision.replicas`); False: one DDP/FSDP2 group over all ranks.
    replica_groups: bool = True
    # torch.compile of the blocks, as every plan asks. None: on GPU hosts only. On the 2-core CPU
    # host, compiling the tiny model's blocks took 16-31 s per rank for a steady step 0.96-1.17x
    # as fast (docs/performance.md): the embedded default's stages of a few dozen sub-second steps
    # never pay it back, so a CPU stage runs eager.
    compile: Optional[bool] = None
    # bf16, as every plan asks. None: where the host has it natively (a GPU, or a CPU with
    # AVX512-BF16 or AMX). On the 2-core CPU host, which has neither, the tiny model's forward and
    # backward over 16 x 128 tokens took 3.0 s under bf16 autocast against 0.31-0.40 s in fp32
    # (docs/performance.md): the embedded default's stages then train in fp32, named as a fallback.
    cpu_bf16: Optional[bool] = None
    # Deterministic kernels (a bit-exact resume on GPUs, at some speed).
    deterministic: bool = False
    hang_timeout_s: float = SupervisorConfig.hang_timeout_s
    startup_timeout_s: float = SupervisorConfig.startup_timeout_s
    poll_interval_s: float = SupervisorConfig.poll_interval_s
    grace_s: float = SupervisorConfig.grace_s
    max_restarts: int = SupervisorConfig.max_restarts
    heldout_loss_noise_band: float = HELDOUT_LOSS_NOISE_BAND
    answer_loss_noise_band: float = ANSWER_LOSS_NOISE_BAND
    # Used when the manifest sets no `eval_gate`.
    min_improvement_bands: float = MIN_IMPROVEMENT_BANDS
    max_regression_bands: float = MAX_REGRESSION_BANDS

    @model_validator(mode="after")
    def _within_the_runtimes_rules(self) -> "TrainingRuntimeResource":
        """The gates' and the supervisor's rules, applied where the resource is built (at the
        start of the run, or of the first step that uses it), not after a stage has started
        training and its cost is spent."""
        try:
            self.gate_policy()
            self.supervisor(nnodes=1, nproc_per_node=1)
        except ValueError as error:
            raise ValueError(f"training_runtime: {error}") from None
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError("training_runtime: batch_size must be positive (or unset)")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"training_runtime: seed must lie in [0, {MAX_SEED}]")
        return self

    def eager_reason(self, *, has_cuda: bool) -> str | None:
        """Why this host's stages run without torch.compile, or None when they compile."""
        if self.compile is False:
            return "turned off in the training runtime resource (compile: false)"
        if self.compile is None and not has_cuda:
            return "a CPU host: compiling costs more than it saves here (training_runtime.compile unset)"
        return None

    def fp32_reason(self, *, has_cuda: bool, native_cpu_bf16: bool) -> str | None:
        """Why this host's stages train the plan's bf16 in fp32, or None when they train bf16."""
        if has_cuda or self.cpu_bf16 is True:
            return None
        if self.cpu_bf16 is False:
            return "bf16 on CPU turned off in the training runtime resource (cpu_bf16: false)"
        if native_cpu_bf16:
            return None
        return ("a CPU without native bf16 (no AVX512-BF16 or AMX): emulated bf16 is several times slower "
                "than fp32 (training_runtime.cpu_bf16 unset)")

    def supervisor(self, *, nnodes: int, nproc_per_node: int) -> SupervisorConfig:
        """The supervisor's bounds for an attempt of `nnodes` x `nproc_per_node` ranks (`training_launcher`)."""
        return SupervisorConfig(nnodes=nnodes, nproc_per_node=nproc_per_node, hang_timeout_s=self.hang_timeout_s,
                                startup_timeout_s=self.startup_timeout_s, poll_interval_s=self.poll_interval_s,
                                grace_s=self.grace_s, max_restarts=self.max_restarts)

    def gate_policy(self, reviewed: EvalGate | None = None) -> EvalGatePolicy:
        """Every metric of the stage battery (`ito_assets.runtime.stage.battery`), with the manifest's
        thresholds when it sets them, else this resource's."""
        metrics = (
            GatedMetric(name="heldout_loss", direction=Direction.LOWER_IS_BETTER, noise_band=self.heldout_loss_noise_band),
            GatedMetric(name="answer_loss", direction=Direction.LOWER_IS_BETTER, noise_band=self.answer_loss_noise_band),
        )
        if reviewed is not None:
            return EvalGatePolicy(metrics=metrics, min_improvement_bands=reviewed.min_improvement_bands,
                              max_regression_bands=reviewed.max_regression_bands)
        return EvalGatePolicy(metrics=metrics, min_improvement_bands=self.min_improvement_bands,
                          max_regression_bands=self.max_regression_bands)
