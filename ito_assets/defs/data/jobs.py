"""The data stage's own job: decontamination again after the eval suite changed (the whole path
from a manifest to clean shards is `preparation_job` in ito_assets/defs/jobs.py)."""

import dagster as dg

from ito_assets.defs.manifest.partitions import manifests_partitions

# What a changed eval suite invalidates: the suite itself, the report, the deduplication (its keep
# order puts contaminated documents last) and the clean shards.
decontamination_job = dg.define_asset_job(
    "decontamination_job",
    selection=dg.AssetSelection.assets("eval_suite", "contamination_report", "deduplicated_documents", "clean_shards"),
    partitions_def=manifests_partitions,
    description="Decontaminate one manifest's data again, and deduplicate it under the new contamination (launched when the eval suite changes).",
)
