"""A changed eval suite -> decontaminate again every manifest whose data was decontaminated
against another digest. The run key is the manifest digest plus the eval suite digest, so each
(manifest, suite) pair is decontaminated once, whatever the daemon restarts.

A pair launched already is launched again only when a contamination report made after its last
launch names another digest (the suite went to another version and came back, another run made a
report against another suite, or the run read the suite after it changed again). That run's key
adds the report's event storage id (`<manifest>+<suite>+<id>`): one run per report replaced, the
same key however often the daemon restarts. The order is the event log's storage ids, never a
clock. A run the daemon created but never submitted (NOT_STARTED) is asked for again under its own
key, which lets the daemon submit it; a run still in flight, or one that failed without a newer
report since, is left alone."""

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
_QUERY_CHUNK = 500  # partitions a query names at once (an IN list; SQLite bounds its parameters)
_FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def run_key(manifest_digest: str, suite_digest: str, replaces: int | None = None) -> str:
    """The pair's first run: `<manifest>+<suite>`; a later one adds the storage id of the report it replaces."""
    key = f"{manifest_digest}+{suite_digest}"
    return key if replaces is None else f"{key}+{replaces}"


def _used_run_keys(instance: dg.DagsterInstance, suite_digest: str) -> dict[str, list[str]]:
    """The run keys of this sensor's runs for the suite, by manifest digest, in one query (not one per manifest)."""
    tagged = instance.get_run_tags([_RUN_KEY_TAG], value_prefix="sha256:")
    used: dict[str, list[str]] = {}
    for _, values in tagged:
        for key in values:
            parts = key.split("+")  # a digest holds no "+"
            if len(parts) in (2, 3) and parts[1] == suite_digest:
                used.setdefault(parts[0], []).append(key)
    return used


def _digest_of(record) -> str | None:
    materialization = record.asset_materialization
    value = materialization.metadata.get("eval_suite_digest") if materialization else None
    return getattr(value, "value", None)


def _latest_reports(instance: dg.DagsterInstance, partitions: set[str]) -> dict[str, tuple[int, str | None]]:
    """(storage id, suite digest) of each partition's latest contamination report: two queries for
    every `_QUERY_CHUNK` partitions, not one per partition."""
    found: dict[str, tuple[int, str | None]] = {}
    ordered = sorted(partitions)
    for start in range(0, len(ordered), _QUERY_CHUNK):
        latest = instance.get_latest_storage_id_by_partition(
            REPORT, dg.DagsterEventType.ASSET_MATERIALIZATION, partitions=set(ordered[start:start + _QUERY_CHUNK]))
        if not latest:
            continue
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=REPORT, storage_ids=list(latest.values())), limit=len(latest)).records
        digests = {record.storage_id: _digest_of(record) for record in records}
        found |= {partition: (storage_id, digests.get(storage_id)) for partition, storage_id in latest.items()}
    return found


def _first_event(instance: dg.DagsterInstance, run_id: str) -> int | None:
    records = instance.get_records_for_run(run_id, limit=1).records
    return records[0].storage_id if records else None


def _again(instance: dg.DagsterInstance, manifest, suite_digest: str, keys: list[str], report_id: int) -> dg.RunRequest | None:
    """The request, if any, for a launched pair whose latest report (`report_id`) names another digest."""
    runs = instance.get_runs(dg.RunsFilter(tags={_RUN_KEY_TAG: keys}))
    stranded = sorted(run.tags[_RUN_KEY_TAG] for run in runs if run.status == dg.DagsterRunStatus.NOT_STARTED)
    if stranded:  # created, never submitted (the daemon stopped between the two): asked for again, submitted
        return _request(manifest, suite_digest, stranded[0])
    if not runs or any(run.status not in _FINISHED for run in runs):
        return None  # still in flight, or not visible yet
    launched = [_first_event(instance, run.run_id) for run in runs]
    if None in launched or report_id < max(launched):
        return None  # no report since the last launch: a failed run is not launched again each tick
    return _request(manifest, suite_digest, run_key(manifest.digest, suite_digest, report_id))


def _request(manifest, suite_digest: str, key: str) -> dg.RunRequest:
    return dg.RunRequest(run_key=key, partition_key=manifest.key, tags=run_tags.for_preparation(manifest.digest, suite_digest))


@dg.sensor(
    job=decontamination_job,
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=60,
    description="When the eval suite's digest changes, decontaminates again each manifest whose report "
    "names another digest (run key: manifest digest + eval suite digest; + the replaced report's storage id "
    "when the pair was launched before).",
)
def eval_suite_changed(context: dg.SensorEvaluationContext, ito: ItoSettingsResource) -> dg.SensorResult:
    settings = ito.settings()
    try:
        suite = load_suite(settings.eval_suite_path)
    except ItoError as error:
        return dg.SensorResult(skip_reason=f"the eval suite cannot be read: {error.code.value}")
    try:
        found, _ = discovery.discover(settings.manifests_dir, max_bytes=settings.max_manifest_bytes)
    except OSError as error:  # the folder unreadable, or gone between its check and its listing
        context.log.warning(f"the manifests folder could not be listed ({type(error).__name__}); tried again on the next tick")
        return dg.SensorResult(skip_reason="the manifests folder could not be listed")
    known = set(context.instance.get_dynamic_partitions(manifests_partitions.name))
    used = _used_run_keys(context.instance, suite.digest)
    # Two different manifests under one key are refused by the manifest sensor: which of them a
    # decontamination run would read could not be told from its partition, so neither runs here.
    clashes = discovery.colliding(found)
    manifests = sorted({m.key: m for m in found if m.key in known and m.key not in clashes}.values(),
                       key=lambda m: m.key)
    launched = [m for m in manifests if m.digest in used]
    # Every manifest's latest report at once: most never ran for this sensor (the preparation job
    # decontaminated them), and one look-up each cost a query per manifest on every tick.
    reports = _latest_reports(context.instance, {m.key for m in manifests})
    requests = []
    for manifest in launched:  # no report look-up each, and a run query only for those not up to date
        if len(requests) == MAX_REQUESTS_PER_TICK:
            break
        report_id, recorded = reports.get(manifest.key, (None, None))
        if report_id is None or recorded is None or recorded == suite.digest:
            continue
        request = _again(context.instance, manifest, suite.digest, used[manifest.digest], report_id)
        if request is not None:
            requests.append(request)
    for manifest in manifests:
        if len(requests) == MAX_REQUESTS_PER_TICK:
            break  # the rest on the next ticks, as these runs are launched
        if manifest.digest in used:
            continue  # launched for this suite already: looked at above
        recorded = reports.get(manifest.key, (None, None))[1]
        if recorded is None or recorded == suite.digest:
            continue
        requests.append(_request(manifest, suite.digest, run_key(manifest.digest, suite.digest)))
    return dg.SensorResult(run_requests=requests, skip_reason=None if requests else "every decontaminated manifest is up to date with the eval suite")
