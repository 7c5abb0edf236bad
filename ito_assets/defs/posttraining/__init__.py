"""Post-training domain: one checkpoint asset per recipe stage (SFT -> DPO -> RLVR), each with a
blocking eval-gate check. The assets run in the workload domain's `training_job` (group
`posttraining`), starting from the last pretraining-stage checkpoint and the run's tokenizer."""

import dagster as dg

from ito_assets.defs.posttraining.assets import POSTTRAINING_ASSETS
from ito_assets.defs.posttraining.checks import POSTTRAINING_CHECKS
from ito_assets.defs.posttraining.resources import PostTrainingResource


def defs(resource: PostTrainingResource | None = None) -> dg.Definitions:
    return dg.Definitions(
        assets=POSTTRAINING_ASSETS,
        asset_checks=POSTTRAINING_CHECKS,
        resources={"posttraining": resource or PostTrainingResource()},
    )
