"""Desk telemetry domain: the run's goodput, badput by cause, interruptions and checkpoint
bandwidth from every stage's runtime event log, pretraining and post-training, as the last asset
of the lineage. It runs in the workload domain's `training_job` (group `telemetry`)."""

import dagster as dg

from ito_assets.defs.telemetry.assets import TELEMETRY_ASSETS


def defs() -> dg.Definitions:
    return dg.Definitions(assets=TELEMETRY_ASSETS)
