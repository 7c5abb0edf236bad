"""The training runtime's knobs as a Dagster resource (key `training_runtime`): how many ranks,
how stages are sized on this machine, the supervisor's bounds and the gates' noise bands.
Defaults are the embedded CPU installation's."""

import dagster as dg

from ito_assets.runtime.gates import MAX_REGRESSION_BANDS, MIN_IMPROVEMENT_BANDS, Direction, GatedMetric, GatePolicy
from ito_assets.runtime.supervisor import SupervisorConfig

# Seed-to-seed standard deviation of the tiny model's held-out loss (nats/token) after a
# fixture-small-sized pretraining stage (196 steps of 8 x 128 tokens), seeds 0-2: 0.190, measured by
# `benchmarks/fault_recovery.py` on the 2-core CPU machine (2026-11-30; README "Training runtime").
HELDOUT_LOSS_NOISE_BAND = 0.19


class TrainingRuntimeResource(dg.ConfigurableResource):
    nproc_per_node: int = 1
    # 8 sequences: the fixture stages then take ~200, ~50 and ~10 steps on a CPU in about a minute.
    batch_size: int = 8
    seed: int = 0
    hang_timeout_s: float = SupervisorConfig.hang_timeout_s
    startup_timeout_s: float = SupervisorConfig.startup_timeout_s
    poll_interval_s: float = SupervisorConfig.poll_interval_s
    grace_s: float = SupervisorConfig.grace_s
    max_restarts: int = SupervisorConfig.max_restarts
    heldout_loss_noise_band: float = HELDOUT_LOSS_NOISE_BAND
    min_improvement_bands: float = MIN_IMPROVEMENT_BANDS
    max_regression_bands: float = MAX_REGRESSION_BANDS

    def supervisor(self) -> SupervisorConfig:
        return SupervisorConfig(nproc_per_node=self.nproc_per_node, hang_timeout_s=self.hang_timeout_s,
                                startup_timeout_s=self.startup_timeout_s, poll_interval_s=self.poll_interval_s,
                                grace_s=self.grace_s, max_restarts=self.max_restarts)

    def gate_policy(self) -> GatePolicy:
        metric = GatedMetric(name="heldout_loss", direction=Direction.LOWER_IS_BETTER,
                             noise_band=self.heldout_loss_noise_band)
        return GatePolicy(metrics=(metric,), min_improvement_bands=self.min_improvement_bands,
                          max_regression_bands=self.max_regression_bands)
