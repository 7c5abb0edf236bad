"""Data domain: source documents, deduplication, decontamination, clean shards, their checks and jobs."""

import dagster as dg

from ito_assets.defs.data.assets import DATA_ASSETS
from ito_assets.defs.data.checks import DATA_CHECKS
from ito_assets.defs.data.jobs import decontamination_job


def defs() -> dg.Definitions:
    return dg.Definitions(assets=DATA_ASSETS, asset_checks=DATA_CHECKS, jobs=[decontamination_job])
