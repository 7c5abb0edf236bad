"""Manifest domain: the verified manifest, the eval suite and their blocking checks."""

import dagster as dg

from ito_assets.defs.manifest.assets import eval_suite, training_manifest
from ito_assets.defs.manifest.checks import MANIFEST_CHECKS


def defs() -> dg.Definitions:
    return dg.Definitions(assets=[eval_suite, training_manifest], asset_checks=MANIFEST_CHECKS)
