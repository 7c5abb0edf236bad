"""A new reviewed manifest in the manifests folder -> register its partition and prepare it."""


import dagster as dg

from ito_assets.defs.jobs import PREPARATION_JOB
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.resources import ItoSettingsResource
from ito_assets.control import run_tags
from ito_assets.manifest import discovery



@dg.sensor(
    job_name=PREPARATION_JOB,
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    description="Registers each reviewed manifest (keyed by its short digest) and prepares it once; "
    "the run key is the manifest's full digest.",
)
def reviewed_manifest_sensor(context: dg.SensorEvaluationContext, ito: ItoSettingsResource) -> dg.SensorResult:
    settings = ito.settings()
    found, rejected = discovery.discover(settings.manifests_dir, max_bytes=settings.max_manifest_bytes)
    for item in rejected:
        context.log.warning(f"manifest file {item.file_name} was not registered: {item.code}")
    known = set(context.instance.get_dynamic_partitions(manifests_partitions.name))
    new_keys = sorted({m.key for m in found} - known)
    requests = [
        dg.RunRequest(run_key=m.digest, partition_key=m.key, tags=run_tags.for_preparation(m.digest))
        for m in {m.key: m for m in found}.values()
    ]
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[manifests_partitions.build_add_request(new_keys)] if new_keys else [],
        skip_reason=None if requests else "no reviewed manifests in the manifests folder",
    )
