"""A changed eval suite -> decontaminate again every manifest whose data was decontaminated
against another digest. The run key is the manifest digest plus the eval suite digest, so each
(manifest, suite) pair is decontaminated once, whatever the daemon restarts."""

from __future__ import annotations

import dagster as dg

from ito_assets.defs.data.jobs import decontamination_job
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.resources import ItoSettingsResource
from ito_assets.errors import ItoError
from ito_assets.evals.suite import load_suite
from ito_assets.control import run_tags
from ito_assets.manifest import discovery
from sensors.manifests import MAX_REQUESTS_PER_TICK

REPORT = dg.AssetKey("contamination_report")
_RUN_KEY_TAG = "dagster/run_key"  # Dagster's own tag for a run's key


def run_key(manifest_digest: str, suite_digest: str) -> str:
    return f"{manifest_digest}+{suite_digest}"


def _used_run_keys(instance: dg.DagsterInstance, suite_digest: str) -> set[str]:
    """The run keys of this sensor's runs for the suite, in one query (not one per manifest)."""
    tagged = instance.get_run_tags([_RUN_KEY_TAG], value_prefix="sha256:")
    return {key for _, values in tagged for key in values if key.endswith(f"+{suite_digest}")}


def _decontaminated_with(instance: dg.DagsterInstance, partition: str) -> str | None:
    """The eval suite digest of the partition's latest contamination report, if there is one."""
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=REPORT, asset_partitions=[partition]), limit=1).records
    if not records:
        return None
    materialization = records[0].asset_materialization
    value = materialization.metadata.get("eval_suite_digest") if materialization else None
    return getattr(value, "value", None)


@dg.sensor(
    job=decontamination_job,
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=60,
    description="When the eval suite's digest changes, decontaminates again each manifest whose report "
    "names another digest (run key: manifest digest + eval suite digest).",
)
def eval_suite_changed(context: dg.SensorEvaluationContext, ito: ItoSettingsResource) -> dg.SensorResult:
    settings = ito.settings()
    try:
        suite = load_suite(settings.eval_suite_path)
    except ItoError as error:
        return dg.SensorResult(skip_reason=f"the eval suite cannot be read: {error.code.value}")
    found, _ = discovery.discover(settings.manifests_dir, max_bytes=settings.max_manifest_bytes)
    known = set(context.instance.get_dynamic_partitions(manifests_partitions.name))
    used = _used_run_keys(context.instance, suite.digest)
    requests = []
    for manifest in sorted({m.key: m for m in found if m.key in known}.values(), key=lambda m: m.key):
        if len(requests) == MAX_REQUESTS_PER_TICK:
            break  # the rest on the next ticks, as these runs are launched
        if run_key(manifest.digest, suite.digest) in used:
            continue  # launched for this suite already: the daemon would not launch the key again
        recorded = _decontaminated_with(context.instance, manifest.key)
        if recorded is None or recorded == suite.digest:
            continue
        requests.append(
            dg.RunRequest(
                run_key=run_key(manifest.digest, suite.digest),
                partition_key=manifest.key,
                tags=run_tags.for_preparation(manifest.digest, suite.digest),
            )
        )
    return dg.SensorResult(run_requests=requests, skip_reason=None if requests else "every decontaminated manifest is up to date with the eval suite")
