"""The jobs that span domains, one manifest partition per run.

`preparation_job`: what a reviewed manifest needs before any compute is booked: verification,
data preparation, the decision run and the plan (launched by the reviewed-manifest sensor).
`data_preparation_job`: the data alone, from a data manifest or a training manifest: verification,
the eval suite, sources, decontamination, deduplication, clean shards; no decision proxies, no
training (launched by `ito data prepare`).
`training_job`: what a confirmed ledger run spends the booking on: its re-authorization, the
training stages, post-training and desk telemetry (launched by the confirmed-run sensor, once per ledger run).
A domain joins a job through its group; a group that does not exist yet selects nothing.
"""

from typing import Mapping

import dagster as dg

from ito_assets.defs.manifest.partitions import manifests_partitions

PREPARATION_GROUPS = ("manifest", "data", "decision")
TRAINING_GROUPS = ("workload", "training", "posttraining", "telemetry")

PREPARATION_JOB = "preparation_job"
DATA_PREPARATION_JOB = "data_preparation_job"
# By key, not by group: the decision group would bring its proxies' training with it.
DATA_PREPARATION_ASSETS = ("training_manifest", "eval_suite", "source_documents", "deduplicated_documents",
                           "contamination_report", "clean_shards")


def preparation_job(decision_run_config: Mapping | None = None):
    """`decision_run_config`, when given, is the job's default config of `decision_run` (shown in
    the launchpad); the embedded default uses the asset's own defaults."""
    config = {"ops": {"decision_run": {"config": dict(decision_run_config)}}} if decision_run_config else None
    return dg.define_asset_job(
        PREPARATION_JOB,
        selection=dg.AssetSelection.groups(*PREPARATION_GROUPS),
        partitions_def=manifests_partitions,
        config=config,
        description="Verify one reviewed manifest, prepare its data (dedup, decontamination), decide and plan.",
    )

training_job = dg.define_asset_job(
    "training_job",
    selection=dg.AssetSelection.groups(*TRAINING_GROUPS),
    partitions_def=manifests_partitions,
    description="Launched by the confirmed-run sensor, once per ledger run (run key = run id).",
)


def data_preparation_job(executor: dg.ExecutorDefinition | None = None):
    """`executor`: the job's own executor, where it should not be the code location's (see
    definitions.py for the one it runs with, and why)."""
    return dg.define_asset_job(
        DATA_PREPARATION_JOB,
        selection=dg.AssetSelection.assets(*DATA_PREPARATION_ASSETS),  # partitioned like its assets
        executor_def=executor,
        description="Prepare one manifest's data alone: verify it, decontaminate and deduplicate its sources against "
        "the eval suite, write the clean shards. No decision proxies, no training.",
    )
