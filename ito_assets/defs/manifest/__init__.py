"""Manifest domain: the verified manifest, the eval suite, their blocking checks and job."""

import dagster as dg

from ito_assets.defs.manifest.assets import eval_suite, training_manifest
from ito_assets.defs.manifest.checks import MANIFEST_CHECKS
from ito_assets.defs.manifest.jobs import manifest_job


def defs() -> dg.Definitions:
    return dg.Definitions(assets=[eval_suite, training_manifest], asset_checks=MANIFEST_CHECKS, jobs=[manifest_job])
