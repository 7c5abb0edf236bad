"""The face of the authorization gate: a blocking check that stops every training step."""

import dagster as dg

from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.workload.assets import run_authorization


@dg.asset_check(
    asset=run_authorization,
    blocking=True,
    partitions_def=manifests_partitions,
    description="The run's booking still entitles it and its confirmation was consumed by it.",
)
def run_still_authorized(run_authorization: dict) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=bool(run_authorization["authorized"]),
        metadata={"run_id": run_authorization["run_id"], "error_code": run_authorization.get("error_code", "")},
    )
