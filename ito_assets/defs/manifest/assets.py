"""The root of the lineage: the reviewed training manifest and the eval suite it is bound to."""


import json
from pathlib import Path

import dagster as dg

from ito_assets.defs.failures import failure
from ito_assets.defs import owners
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.metadata_values import json_value, table
from ito_assets.defs.resources import ItoSettingsResource
from ito_assets.control.run_tags import EVAL_SUITE_DIGEST, MANIFEST_DIGEST
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import EvalSuite, load_suite
from ito_assets.manifest import discovery
from ito_assets.manifest.discovery import ManifestVerdict
from ito_assets.manifest.verify import parameters_phrase

GROUP = "manifest"


class EvalSuiteSource(dg.Config):
    """Which eval suite file to read: `path`, or, left empty, the configured one (ITO_EVAL_SUITE).
    `ito data prepare` names its suite here, so that one run's suite is in its run config."""

    path: str = ""


@dg.asset(
    group_name=GROUP,
    owners=[owners.DATA],
    kinds={"json"},
    description="The eval suite (id, benchmark, question, answer) that data is decontaminated against, "
    "read from the configured suite file (ITO_EVAL_SUITE) or the run config's `path`; its digest is "
    "sha256 over the suite file's bytes.",
)
def eval_suite(context: dg.AssetExecutionContext, config: EvalSuiteSource, ito: ItoSettingsResource) -> EvalSuite:
    path = Path(config.path) if config.path else ito.settings().eval_suite_path
    try:
        suite = load_suite(path)
    except ItoError as error:
        raise failure(error) from None
    require_run_suite(context, suite)
    context.add_output_metadata(
        {
            "suite_id": suite.suite_id,
            "digest": suite.digest,
            "num_items": len(suite.items),
            "items_by_benchmark": json_value(suite.by_benchmark()),
            "suite_path": dg.MetadataValue.path(str(path)),  # not "path": the IO manager's key
        }
    )
    return suite


def require_run_suite(context: dg.AssetExecutionContext, suite: EvalSuite) -> None:
    """EVAL_SUITE_MISMATCH where the run was asked for against another suite (its tag, set by the
    eval-suite sensor) than the one in hand: the file changed between the sensor's look and the
    read, or a concurrent run stored another suite since. A report made against it would run
    under the other suite's key and tag."""
    wanted = context.run.tags.get(EVAL_SUITE_DIGEST)
    if wanted is not None and wanted != suite.digest:
        raise failure(ItoError(ErrorCode.EVAL_SUITE_MISMATCH,
                               f"the run was asked for against eval suite {wanted}, and the suite read is {suite.digest}: "
                               "the file changed since; the sensor asks for a run against the new one"))


@dg.asset(
    group_name=GROUP,
    owners=[owners.DATA],
    kinds={"json"},
    partitions_def=manifests_partitions,
    description="A reviewed training manifest (or a data manifest, for data preparation alone), read "
    "securely from the manifests folder (or the data manifests folder) by its digest, one partition "
    "per manifest, and verified (schema, no secrets). The blocking checks stop the run when "
    "verification or provenance fails.",
)
def training_manifest(context: dg.AssetExecutionContext, ito: ItoSettingsResource) -> ManifestVerdict:
    settings = ito.settings()
    key = context.partition_key
    limit = settings.max_manifest_bytes
    # The full digest the run was asked for (the sensors and `ito data prepare` tag it): the key is
    # 48 bits of it, which another manifest can share, or a file swapped in since can have.
    digest = context.run.tags.get(MANIFEST_DIGEST)
    path = discovery.locate((settings.manifests_dir, settings.data_manifests_dir), key, max_bytes=limit, digest=digest)
    if path is None:
        raise dg.Failure(description="no manifest with this digest is in the manifests folder (or the data manifests folder) any more")
    verdict = discovery.judge(path, key, max_bytes=limit, digest=digest)
    context.add_output_metadata(_verdict_metadata(verdict))
    return verdict


def _verdict_metadata(verdict: ManifestVerdict) -> dict:
    # Not "path": the IO manager records its own under that key, where it stores the output.
    path = Path(verdict.path)
    withheld = discovery.name_looks_secret(path.name)
    metadata: dict = {
        "manifest_path": dg.MetadataValue.path(str(path.parent / discovery.WITHHELD_NAME) if withheld else str(path)),
        "file_name": discovery.WITHHELD_NAME if withheld else path.name,
        "verified": verdict.ok,
        "digest": verdict.digest or "",
        "size_bytes": verdict.size_bytes or 0,
    }
    if verdict.ok:
        summary = verdict.summary()
        metadata["summary"] = json_value(summary)
        metadata["overview"] = dg.MetadataValue.md(_summary_markdown(summary))
        metadata["data_references"] = _references_table(summary["data_references"])
    else:
        metadata["error_code"] = verdict.error_code
        metadata["error_message"] = verdict.error_message
    return metadata


REFERENCE_COLUMNS = [("data reference", "string"), ("licence", "string"), ("format", "string"),
                     ("provenance", "bool")]


def _references_table(references: list[dict]) -> dg.TableMetadataValue:
    rows = [{"data reference": r["uri"], "licence": r["license"], "format": r["format"],
             "provenance": bool(r["has_provenance"])} for r in references]
    return table(REFERENCE_COLUMNS, rows)


def _summary_markdown(summary: dict) -> str:
    """The manifest in a sentence; its data references are the `data_references` table."""
    if summary["kind"] == "data":
        return f"**{summary['name']}**: a data manifest (data preparation only, never trained)."
    budget = summary["budget"]
    return (
        f"**{summary['name']}**: model {summary['model']['size']} "
        f"({parameters_phrase(summary['model'])}), {summary['num_training_tokens']:,} tokens "
        f"over {', '.join(summary['stages'])}; budget cap {budget['cap_cents'] / 100:,.2f} USD.\n\n"
        f"post-training: {json.dumps(summary['post_training'])}"
    )
