"""Workload domain: a run created by the canonical API, re-authorized before its first step."""

import dagster as dg

from ito_assets.defs.workload.assets import run_authorization
from ito_assets.defs.workload.checks import run_still_authorized


def defs() -> dg.Definitions:
    return dg.Definitions(assets=[run_authorization], asset_checks=[run_still_authorized])
