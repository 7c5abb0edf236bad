"""The data stage: source documents -> contamination report (every document) -> deduplicated
documents (survivors chosen knowing contamination) -> clean shards, one partition per reviewed
manifest. Each body fetches the settings, refuses to work on
an unverified manifest, calls the core stage, and reports metadata. A core refusal (a shard that
no longer verifies: SHARD_CORRUPT; a full disk: STORAGE_FULL; a warehouse that cannot be rebuilt:
WAREHOUSE_CORRUPT) fails the step with its code; a warehouse rebuilt from its lineage on the way
is a warning in the run's log and in the materialisation's metadata."""

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from ito_assets.data import stages, warehouse
from ito_assets.defs import owners
from ito_assets.defs.data import metadata
from ito_assets.defs.data.params import DecontamParams, DedupParams, ScaleParams
from ito_assets.defs.failures import core_config, failure, verified_or_fail
from ito_assets.defs.manifest.assets import require_run_suite
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.resources import ItoSettingsResource, WAREHOUSE_POOL
from ito_assets.defs.run_config import check_run_config
from ito_assets.errors import ItoError
from ito_assets.evals.suite import EvalSuite
from ito_assets.manifest.discovery import ManifestVerdict

GROUP = "data"


class _Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def core_stage(context: dg.AssetExecutionContext) -> Iterator[None]:
    """Runs a core stage: an ItoError becomes a Failure carrying its code; the warehouse's
    warnings (a rebuild from the lineage) go to the run's log and to the output's metadata."""
    collected = _Collected()
    warehouse.LOG.addHandler(collected)
    try:
        yield
    except ItoError as error:
        raise failure(error) from None
    finally:
        warehouse.LOG.removeHandler(collected)
        for message in collected.messages:
            context.log.warning(message)
    if collected.messages:
        context.add_output_metadata({"warehouse_rebuilt": True, "warehouse_warning": "\n".join(collected.messages)})


@dg.asset(
    group_name=GROUP,
    owners=[owners.DATA],
    kinds={"parquet", "duckdb"},
    partitions_def=manifests_partitions,
    pool=WAREHOUSE_POOL,
    description="Every document of the manifest's data references (read from the data root, each file "
    "digest-verified against the manifest), NFC-normalised, with a stable id and provenance (source "
    "uri, sha256, licence, row), as Parquet shards and the warehouse's `documents` table.",
)
def source_documents(context: dg.AssetExecutionContext, config: ScaleParams, ito: ItoSettingsResource, training_manifest: ManifestVerdict) -> stages.SourceStage:
    settings = ito.settings()
    verified = verified_or_fail(training_manifest, "the data stage")
    check_run_config(context.run.run_config)  # the first step: a later step's bad value stops the run here
    prep = core_config("source_documents", lambda: config.to_config(settings.data_engine))
    with core_stage(context):
        stage = stages.run_sources(verified, settings.data_root, settings.state_dir, settings.warehouse_path, prep)
    context.add_output_metadata(metadata.source_metadata(stage))
    return stage


@dg.asset(
    group_name=GROUP,
    owners=[owners.DATA],
    kinds={"parquet", "duckdb"},
    partitions_def=manifests_partitions,
    pool=WAREHOUSE_POOL,
    description="N-gram decontamination of every document of `source_documents` against `eval_suite` "
    "(duplicates too, so an auditor's answer covers every document): each hit with its eval item, the "
    "user's record id, matched n-gram, offsets, overlap and action; the warehouse's `contamination_hits`.",
)
def contamination_report(
    context: dg.AssetExecutionContext,
    config: DecontamParams,
    ito: ItoSettingsResource,
    training_manifest: ManifestVerdict,
    eval_suite: EvalSuite,
    source_documents: stages.SourceStage,
) -> stages.DecontamStage:
    settings = ito.settings()
    verified = verified_or_fail(training_manifest, "the data stage")
    require_run_suite(context, eval_suite)  # the stored suite may be a concurrent run's by now
    prep = core_config("contamination_report", lambda: config.to_config(settings.data_engine))
    with core_stage(context):
        stage = stages.run_decontam(verified, eval_suite, source_documents, settings.state_dir, settings.warehouse_path, prep)
    context.add_output_metadata(metadata.decontam_metadata(stage))
    return stage


@dg.asset(
    group_name=GROUP,
    owners=[owners.DATA],
    kinds={"parquet", "duckdb"},
    partitions_def=manifests_partitions,
    pool=WAREHOUSE_POOL,
    description="`source_documents` without exact copies and near-duplicates (MinHash LSH, Jaccard verified "
    "on shingle sets); each removal recorded in the warehouse's `duplicates` table against the kept "
    "document it duplicates, with its family (the connected component of verified pairs). "
    "Contaminated documents (from `contamination_report`) come last in the keep order, so a clean "
    "member of a duplicate cluster survives in preference to one decontamination removes.",
)
def deduplicated_documents(
    context: dg.AssetExecutionContext, config: DedupParams, ito: ItoSettingsResource, source_documents: stages.SourceStage, contamination_report: stages.DecontamStage
) -> stages.DedupStage:
    settings = ito.settings()
    prep = core_config("deduplicated_documents", lambda: config.to_config(settings.data_engine))
    with core_stage(context):
        stage = stages.run_dedup(source_documents, contamination_report.actions, settings.state_dir, settings.warehouse_path, prep)
    context.add_output_metadata(metadata.dedup_metadata(stage))
    return stage


@dg.asset(
    group_name=GROUP,
    owners=[owners.DATA],
    kinds={"parquet", "duckdb"},
    partitions_def=manifests_partitions,
    pool=WAREHOUSE_POOL,
    description="What remains of `deduplicated_documents` after `contamination_report`'s actions: kept "
    "documents and the pieces of cut ones, with a digest per shard; every input document accounted "
    "for (kept, duplicate, contaminated) in the warehouse's `decisions` table.",
)
def clean_shards(
    context: dg.AssetExecutionContext,
    config: ScaleParams,
    ito: ItoSettingsResource,
    training_manifest: ManifestVerdict,
    source_documents: stages.SourceStage,
    deduplicated_documents: stages.DedupStage,
    contamination_report: stages.DecontamStage,
) -> stages.CleanStage:
    settings = ito.settings()
    verified = verified_or_fail(training_manifest, "the data stage")
    prep = core_config("clean_shards", lambda: config.to_config(settings.data_engine))
    with core_stage(context):
        stage = stages.run_clean(verified, source_documents, deduplicated_documents, contamination_report, settings.state_dir, settings.warehouse_path, prep)
    context.add_output_metadata(metadata.clean_metadata(stage))
    return stage


DATA_ASSETS = [source_documents, contamination_report, deduplicated_documents, clean_shards]
