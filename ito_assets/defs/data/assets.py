"""The data stage: source documents -> deduplicated documents -> contamination report -> clean
shards, one partition per reviewed manifest. Each body fetches the settings, refuses to work on
an unverified manifest, calls the core stage, and reports metadata."""


import dagster as dg

from ito_assets.data import stages
from ito_assets.data.config import DataPrepConfig
from ito_assets.defs.data import metadata
from ito_assets.defs.data.params import DecontamParams, DedupParams
from ito_assets.defs.failures import failure, verified_or_fail
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.resources import ItoSettingsResource
from ito_assets.errors import ItoError
from ito_assets.evals.suite import EvalSuite
from ito_assets.manifest.discovery import ManifestVerdict

GROUP = "data"
POOL = "duckdb_writer"  # DuckDB has one writer at a time (DESIGN.md)


@dg.asset(
    group_name=GROUP,
    kinds={"parquet", "duckdb"},
    partitions_def=manifests_partitions,
    pool=POOL,
    description="Every document of the manifest's data references, digest-verified, NFC-normalised, "
    "with a stable id and provenance (source uri, sha256, licence, row), as Parquet shards.",
)
def source_documents(context: dg.AssetExecutionContext, ito: ItoSettingsResource, training_manifest: ManifestVerdict) -> stages.SourceStage:
    settings = ito.settings()
    verified = verified_or_fail(training_manifest, "the data stage")
    try:
        stage = stages.run_sources(verified, settings.data_root, settings.state_dir, settings.warehouse_path, DataPrepConfig())
    except ItoError as error:
        raise failure(error) from None
    context.add_output_metadata(metadata.source_metadata(stage))
    return stage


@dg.asset(
    group_name=GROUP,
    kinds={"parquet", "duckdb"},
    partitions_def=manifests_partitions,
    pool=POOL,
    description="Exact copies and near-duplicates (MinHash LSH, Jaccard verified on shingle sets) removed; "
    "each removal recorded against the kept document it duplicates.",
)
def deduplicated_documents(context: dg.AssetExecutionContext, config: DedupParams, ito: ItoSettingsResource, source_documents: stages.SourceStage) -> stages.DedupStage:
    settings = ito.settings()
    stage = stages.run_dedup(source_documents, settings.state_dir, settings.warehouse_path, config.to_config())
    context.add_output_metadata(metadata.dedup_metadata(stage))
    return stage


@dg.asset(
    group_name=GROUP,
    kinds={"parquet", "duckdb"},
    partitions_def=manifests_partitions,
    pool=POOL,
    description="N-gram decontamination of the deduplicated documents against the eval suite: each hit "
    "with its eval item, matched n-gram, offsets, overlap and action.",
)
def contamination_report(
    context: dg.AssetExecutionContext,
    config: DecontamParams,
    ito: ItoSettingsResource,
    training_manifest: ManifestVerdict,
    eval_suite: EvalSuite,
    deduplicated_documents: stages.DedupStage,
) -> stages.DecontamStage:
    settings = ito.settings()
    verified = verified_or_fail(training_manifest, "the data stage")
    stage = stages.run_decontam(verified, eval_suite, deduplicated_documents, settings.state_dir, settings.warehouse_path, config.to_config())
    context.add_output_metadata(metadata.decontam_metadata(stage))
    return stage


@dg.asset(
    group_name=GROUP,
    kinds={"parquet", "duckdb"},
    partitions_def=manifests_partitions,
    pool=POOL,
    description="What remains: kept documents and the pieces of cut ones, with a digest per shard; "
    "every input document accounted for (kept, duplicate, contaminated).",
)
def clean_shards(
    context: dg.AssetExecutionContext,
    ito: ItoSettingsResource,
    training_manifest: ManifestVerdict,
    source_documents: stages.SourceStage,
    deduplicated_documents: stages.DedupStage,
    contamination_report: stages.DecontamStage,
) -> stages.CleanStage:
    settings = ito.settings()
    verified = verified_or_fail(training_manifest, "the data stage")
    try:
        stage = stages.run_clean(verified, source_documents, deduplicated_documents, contamination_report, settings.state_dir, settings.warehouse_path, DataPrepConfig())
    except ItoError as error:
        raise failure(error) from None
    context.add_output_metadata(metadata.clean_metadata(stage))
    return stage


DATA_ASSETS = [source_documents, deduplicated_documents, contamination_report, clean_shards]
