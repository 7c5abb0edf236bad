"""The job the manifest sensor launches: the manifest group for one manifest partition."""

import dagster as dg

from ito_assets.defs.manifest.partitions import manifests_partitions

manifest_job = dg.define_asset_job(
    "manifest_job",
    selection=dg.AssetSelection.groups("manifest"),
    partitions_def=manifests_partitions,
    description="Verify one reviewed manifest against the eval suite (registered by the manifest sensor).",
)
