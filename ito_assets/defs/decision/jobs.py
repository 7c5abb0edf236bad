"""The decision job: the decision group for one manifest partition (after the data stage)."""

import dagster as dg

from ito_assets.defs.manifest.partitions import manifests_partitions

decision_job = dg.define_asset_job(
    "decision_job",
    selection=dg.AssetSelection.groups("decision"),
    partitions_def=manifests_partitions,
    description="Decide whether one manifest's clean data is worth training on, and plan the run.",
)
