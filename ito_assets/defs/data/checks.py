"""Checks on the data stage: the face of the core's gates in the UI. The blocking ones stop the
rest of the run; the gates themselves are enforced again inside the stages. Each check is
partitioned like its asset, so that it loads the run's own manifest partition only."""


import dagster as dg

from ito_assets.data import stages
from ito_assets.data.config import ScaleConfig
from ito_assets.data.sources import source_digest
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.data.assets import clean_shards, contamination_report, deduplicated_documents, source_documents
from ito_assets.defs.metadata_values import json_value
from ito_assets.defs.resources import ItoSettingsResource
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import EvalSuite
from ito_assets.manifest.discovery import ManifestVerdict
from ito_assets.manifest.verify import eval_suite_mismatches, provenance_problems

_MANIFEST = {"training_manifest": dg.AssetIn("training_manifest")}
_NOT_VERIFIED = dg.AssetCheckResult(passed=False, description="the manifest did not verify")
PROVENANCE_COLUMNS = ["doc_id", "source_uri", "source_sha256", "license", "row"]


def _refused(error: ItoError) -> dg.AssetCheckResult:
    """A check whose input no longer verifies fails, with the code, rather than erroring."""
    return dg.AssetCheckResult(passed=False, metadata={"error_code": error.code.value, "problems": error.message})


@dg.asset_check(partitions_def=manifests_partitions, asset=source_documents, blocking=True, additional_ins=_MANIFEST, description="Each source file, hashed again now, equals the manifest's sha256.")
def source_digests_match(ito: ItoSettingsResource, source_documents: stages.SourceStage, training_manifest: ManifestVerdict) -> dg.AssetCheckResult:
    if not training_manifest.ok:
        return _NOT_VERIFIED
    refs = training_manifest.verified.manifest.data
    bad = [ref.uri for ref in refs if source_digest(ref, ito.settings().data_root) != ref.sha256]
    recorded = [c.sha256 for c in source_documents.sources] == [ref.sha256 for ref in refs]
    return dg.AssetCheckResult(
        passed=not bad and recorded,
        metadata={"error_code": ErrorCode.SOURCE_DIGEST_MISMATCH.value if bad or not recorded else "", "mismatched": ", ".join(bad), "num_sources": len(refs)},
    )


@dg.asset_check(partitions_def=manifests_partitions, asset=source_documents, blocking=True, additional_ins=_MANIFEST, description="Every data reference has decontamination provenance and every document its provenance columns.")
def document_provenance_present(source_documents: stages.SourceStage, training_manifest: ManifestVerdict) -> dg.AssetCheckResult:
    if not training_manifest.ok:
        return _NOT_VERIFIED
    missing_refs = provenance_problems(training_manifest.verified.manifest)
    try:
        docs = source_documents.shards.read(columns=PROVENANCE_COLUMNS)
    except ItoError as error:
        return _refused(error)
    nulls = {c: int(n) for c, n in docs.null_count().row(0, named=True).items() if n}
    return dg.AssetCheckResult(
        passed=not missing_refs and not nulls and docs["doc_id"].n_unique() == docs.height,
        metadata={"error_code": ErrorCode.PROVENANCE_MISSING.value if missing_refs or nulls else "", "references_without_provenance": ", ".join(missing_refs), "null_columns": json_value(nulls)},
    )


@dg.asset_check(partitions_def=manifests_partitions, asset=deduplicated_documents, blocking=False, description="WARN when more documents are removed as duplicates than the configured rate.")
def duplicate_rate_plausible(deduplicated_documents: stages.DedupStage) -> dg.AssetCheckResult:
    rate = deduplicated_documents.counts.duplicate_rate
    limit = deduplicated_documents.config["warn_duplicate_rate"]
    return dg.AssetCheckResult(
        passed=rate <= limit,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"duplicate_rate": round(rate, 6), "warn_above": limit},
        description=None if rate <= limit else "a duplicate rate this high often means a source listed twice",
    )


@dg.asset_check(partitions_def=manifests_partitions, asset=contamination_report, blocking=True, additional_ins=_MANIFEST, description="The eval suite digest recorded in the report equals every data reference's provenance.")
def eval_suite_digest_recorded(contamination_report: stages.DecontamStage, training_manifest: ManifestVerdict) -> dg.AssetCheckResult:
    if not training_manifest.ok:
        return _NOT_VERIFIED
    bad = eval_suite_mismatches(training_manifest.verified.manifest, contamination_report.eval_suite_id, contamination_report.eval_suite_digest)
    return dg.AssetCheckResult(
        passed=not bad,
        metadata={"error_code": ErrorCode.EVAL_SUITE_MISMATCH.value if bad else "", "eval_suite_digest": contamination_report.eval_suite_digest, "mismatched": ", ".join(bad)},
    )


@dg.asset_check(partitions_def=manifests_partitions, asset=clean_shards, blocking=True, description="Every input document is kept, a duplicate or contaminated, exactly once; the clean rows match.")
def conservation_holds(clean_shards: stages.CleanStage) -> dg.AssetCheckResult:
    c = clean_shards.conservation
    tampered = clean_shards.shards.verify()
    return dg.AssetCheckResult(
        passed=c.holds and not tampered,
        metadata={
            "error_code": ErrorCode.SHARD_CORRUPT.value if tampered else "",
            "num_input": c.num_input,
            "num_kept": c.num_kept,
            "num_duplicate": c.num_duplicate,
            "num_contaminated": c.num_contaminated,
            "sum": c.num_kept + c.num_duplicate + c.num_contaminated,
            "problems": "; ".join(c.problems + tuple(f"shard changed: {p}" for p in tampered)),
        },
    )


@dg.asset_check(
    partitions_def=manifests_partitions,
    asset=clean_shards,
    blocking=True,
    additional_ins={"eval_suite": dg.AssetIn("eval_suite"), "contamination_report": dg.AssetIn("contamination_report")},
    description="An independent re-scan of the clean shards against the eval suite, under the decontamination's rule (its common seeds stay ignored), finds nothing.",
)
def zero_residual_contamination(clean_shards: stages.CleanStage, eval_suite: EvalSuite, contamination_report: stages.DecontamStage) -> dg.AssetCheckResult:
    if contamination_report.ignored_seeds.changed():  # the rule the re-scan applies is the stage's, as recorded
        return dg.AssetCheckResult(passed=False, metadata={"error_code": ErrorCode.SHARD_CORRUPT.value, "problems": "the decontamination's ignored seeds changed since they were written"})
    suite = {"eval_suite_id": eval_suite.suite_id, "eval_suite_digest": eval_suite.digest}
    try:
        hits = stages.residual_contamination(clean_shards.shards, eval_suite, contamination_report, ScaleConfig())
    except ItoError as error:
        return dg.AssetCheckResult(passed=False, metadata={"error_code": error.code.value, "problems": error.message, **suite})
    sample = hits.select("doc_id", "eval_item_id").head(10).to_dicts() if hits.height else []
    return dg.AssetCheckResult(
        passed=hits.height == 0,
        metadata={"num_residual_hits": hits.height, "num_rows_scanned": clean_shards.shards.num_rows,
                  "sample": json_value(sample), **suite},
    )


DATA_CHECKS = [source_digests_match, document_provenance_present, duplicate_rate_plausible, eval_suite_digest_recorded, conservation_holds, zero_residual_contamination]
