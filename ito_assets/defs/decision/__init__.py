"""Decision domain: the data decision (proxy-150m on a booking, tiny on CPU by default), its gate,
and the parallelism/precision/cost plan. Jobs span domains (`ito_assets/defs/jobs.py`): this group
runs in `preparation_job`."""

import dagster as dg

from ito_assets.defs.decision.assets import data_decision, decision_run, training_plan
from ito_assets.defs.decision.checks import DECISION_CHECKS
from ito_assets.defs.decision.resources import BookedHardwareResource


def defs() -> dg.Definitions:
    return dg.Definitions(
        assets=[decision_run, data_decision, training_plan],
        asset_checks=DECISION_CHECKS,
        resources={"booked_hardware": BookedHardwareResource()},
    )
