"""Training domain: token shards and the curriculum stages (each a checkpoint asset with a blocking
eval gate); workers run out of process through Dagster Pipes. The assets run
in the workload domain's `training_job` (group `training`), after `run_authorization`."""

import dagster as dg

from ito_assets.defs.training.assets import TRAINING_ASSETS
from ito_assets.defs.training.checks import TRAINING_CHECKS
from ito_assets.defs.training.launcher import TrainingLauncherResource
from ito_assets.defs.training.resources import TrainingRuntimeResource


def defs() -> dg.Definitions:
    return dg.Definitions(
        assets=TRAINING_ASSETS,
        asset_checks=TRAINING_CHECKS,
        resources={"training_runtime": TrainingRuntimeResource(), "training_launcher": TrainingLauncherResource(),
                   "pipes_subprocess_client": pipes_client()},
    )


def pipes_client() -> dg.PipesSubprocessClient:
    # SIGINT to the supervisor on termination, then this long for the workers to flush a checkpoint.
    grace = TrainingRuntimeResource().grace_s
    return dg.PipesSubprocessClient(forward_termination=True, termination_timeout_seconds=grace + 30)
