"""Decision domain: the 150M-scale data decision (tiny on CPU by default), its gate and the plan."""

import dagster as dg

from ito_assets.defs.decision.assets import data_decision, decision_run, training_plan
from ito_assets.defs.decision.checks import DECISION_CHECKS
from ito_assets.defs.decision.jobs import decision_job
from ito_assets.defs.decision.resources import BookedHardwareResource


def defs() -> dg.Definitions:
    return dg.Definitions(
        assets=[decision_run, data_decision, training_plan],
        asset_checks=DECISION_CHECKS,
        jobs=[decision_job],
        resources={"booked_hardware": BookedHardwareResource()},
    )
