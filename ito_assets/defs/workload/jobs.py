"""The job a confirmed run launches: its authorization, then whatever training stages exist."""

import dagster as dg

from ito_assets.defs.manifest.partitions import manifests_partitions

# Training and post-training stages join this selection through their groups as they land.
TRAINING_GROUPS = ("workload", "training", "posttraining")

training_job = dg.define_asset_job(
    "training_job",
    selection=dg.AssetSelection.groups(*TRAINING_GROUPS),
    partitions_def=manifests_partitions,
    description="Launched by the confirmed-run sensor, once per ledger run (run key = run id).",
)
