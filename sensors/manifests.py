"""A new reviewed manifest in the manifests folder -> register its partition and prepare it: a
training manifest with `preparation_job` (data, decision, plan), a data manifest with
`data_preparation_job` (the data alone: it names no model to decide or plan for)."""

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg

from ito_assets.control import run_tags
from ito_assets.defs.jobs import DATA_PREPARATION_JOB, PREPARATION_JOB
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.defs.resources import ItoSettingsResource
from ito_assets.errors import ErrorCode
from ito_assets.manifest import discovery
from ito_assets.manifest.schema import DATA_KIND

if TYPE_CHECKING:  # the type define_asset_job returns, not exported at the top level
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

REVIEWED_MANIFEST_SENSOR = "reviewed_manifest_sensor"
# The daemon stores a tick's every request in its tick record and looks each run key up: an inbox
# of thousands, asked for whole, would cost that on every tick for as long as the files stay.
MAX_REQUESTS_PER_TICK = 50
_RUN_KEY_TAG = "dagster/run_key"  # Dagster's own tag for a run's key
# A refused file is logged once, not on every tick for as long as it stays: the sensor's cursor
# remembers which (name, code) pairs were logged, each as 12 hex digits of a sha256 (the cursor is
# shown in the UI: a name itself, which may be a credential, is never kept there). A tick logs at
# most this many new ones, and says how many more the following ticks will log.
MAX_REPORTS_PER_TICK = 50
_MARK_HEX_DIGITS = 12  # 48 bits: no two of an inbox's thousands of files collide in practice


def _to_request(instance: dg.DagsterInstance, manifests: list[discovery.DiscoveredManifest],
                requested: set[str]) -> list:
    """Manifests no run was launched for first (their digest is the run key), then the others, so
    that a bounded tick never starves a new one; asking again for a used key costs nothing and lets
    the daemon launch a run it created but never started. A manifest asked for before (`requested`,
    its mark in the cursor) whose run is gone was deleted by a person tidying the UI: asked for
    again, it would be prepared a second time, its proxies trained again. One query for every key."""
    used = set().union(*(values for _, values in instance.get_run_tags([_RUN_KEY_TAG], value_prefix="sha256:")))
    wanted = [m for m in manifests if m.digest in used or _digest_mark(m.digest) not in requested]
    return sorted(wanted, key=lambda m: (m.digest in used, m.digest))


def _digest_mark(digest: str) -> str:
    return digest.removeprefix("sha256:")[:_MARK_HEX_DIGITS]


def shown_name(file_name: str) -> str:
    """A file name as the sensor's log may show it. Whoever drops a file chooses its name: a token
    saved as its own file name must not reach the log, nor terminal controls an operator's screen;
    a name that looks like a credential is withheld whole (a prefix of one is already too much)."""
    if discovery.name_looks_secret(file_name):
        return discovery.WITHHELD_NAME
    return ascii(file_name)


def _mark(item: discovery.Rejected) -> str:
    named = os.fsencode(item.file_name) + b"\0" + item.code.encode()
    return hashlib.sha256(named).hexdigest()[:_MARK_HEX_DIGITS]


def _marks(cursor: str | None, field: str) -> set[str]:
    """The marks a previous tick kept under `field` ("reported": refused files it logged;
    "requested": manifests it asked a run for); a cursor of another form (an older release's, none,
    one nested past the parser's depth) holds none."""
    try:
        marks = json.loads(cursor or "{}").get(field, [])
    except (ValueError, AttributeError, RecursionError):
        return set()
    return {m for m in marks if isinstance(m, str)} if isinstance(marks, list) else set()


def report_refused(log, cursor: str | None, rejected: list[discovery.Rejected]) -> set[str]:
    """Log each refused file by its code once while it stays refused (a file fixed and refused again,
    or removed and put back, is logged again); the marks for the next tick's cursor."""
    logged = _marks(cursor, "reported")
    current = {_mark(item): item for item in rejected}
    new = [(mark, item) for mark, item in current.items() if mark not in logged]
    for _mark_of, item in new[:MAX_REPORTS_PER_TICK]:
        why = f" ({item.detail})" if item.detail else ""
        log.warning(f"manifest file {shown_name(item.file_name)} was not registered: {item.code}{why}")
    later = new[MAX_REPORTS_PER_TICK:]
    if later:
        codes = ", ".join(f"{code} x{count}" for code, count in sorted(Counter(i.code for _, i in later).items()))
        log.warning(f"{len(later)} more manifest files were not registered ({codes}); named on the next ticks")
    return (logged & current.keys()) | {mark for mark, _ in new[:MAX_REPORTS_PER_TICK]}


# What a manifest sharing its partition key with another is refused as: the key is 48 bits of the
# digest, and the partition, the run and the files found again for it go by the key alone.
KEY_COLLISION_CODE = ErrorCode.MANIFEST_DIGEST_MISMATCH.value


def split_colliding(found: list[discovery.DiscoveredManifest]) -> tuple[list[discovery.DiscoveredManifest], list[discovery.Rejected]]:
    """(the manifests to register, the files refused because another manifest shares their key).
    Neither of two manifests under one key is registered or prepared: which one a run trained
    could not be told from its partition."""
    clashes = discovery.colliding(found)
    clashing = {m.digest for same in clashes.values() for m in same}
    kept = [m for m in found if m.digest not in clashing]
    refused = [discovery.Rejected(Path(m.path).name, KEY_COLLISION_CODE, f"another manifest shares its partition key {m.key}")
               for m in found if m.digest in clashing]
    return kept, refused


def job_for(manifest: discovery.DiscoveredManifest) -> str:
    return DATA_PREPARATION_JOB if manifest.kind == DATA_KIND else PREPARATION_JOB


def reviewed_manifest_sensor(preparation: "UnresolvedAssetJobDefinition",
                             data_preparation: "UnresolvedAssetJobDefinition") -> dg.SensorDefinition:
    """The sensor over the two jobs the code location defines (their config is the location's)."""

    @dg.sensor(
        name=REVIEWED_MANIFEST_SENSOR,
        jobs=[preparation, data_preparation],
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
        description="Registers each reviewed manifest (keyed by its short digest) and prepares it once, by its "
        "kind: a training manifest with preparation_job, a data manifest with data_preparation_job; the run key "
        "is the manifest's full digest.",
    )
    def evaluate(context: dg.SensorEvaluationContext, ito: ItoSettingsResource) -> dg.SensorResult:
        settings = ito.settings()
        try:
            inbox = discovery.scan(settings.manifests_dir, max_bytes=settings.max_manifest_bytes)
        except OSError as error:  # the folder unreadable, or gone between its check and its listing
            context.log.warning(f"the manifests folder could not be listed ({type(error).__name__}); "
                                "tried again on the next tick")
            return dg.SensorResult(skip_reason="the manifests folder could not be listed", cursor=context.cursor)
        for name in inbox.waiting:
            context.log.info(f"manifest file {shown_name(name)} is still being written (modified under "
                             f"{discovery.SETTLE_SECONDS:g} s ago, not yet whole JSON); it waits for the next tick")
        found, clashing = split_colliding(inbox.found)
        reported = report_refused(context.log, context.cursor, inbox.rejected + clashing)
        known = set(context.instance.get_dynamic_partitions(manifests_partitions.name))
        new_keys = sorted({m.key for m in found} - known)
        requested = _marks(context.cursor, "requested")
        waiting = _to_request(context.instance, list({m.key: m for m in found}.values()), requested)
        requests = [
            dg.RunRequest(run_key=m.digest, job_name=job_for(m), partition_key=m.key,
                          tags=run_tags.for_preparation(m.digest))
            for m in waiting[:MAX_REQUESTS_PER_TICK]
        ]
        # Kept while the manifest stays in the inbox: one removed and put back is prepared again. A
        # file being rewritten has no digest yet: every mark is kept until it settles.
        in_inbox = {_digest_mark(m.digest) for m in inbox.found}
        if not inbox.waiting:
            requested &= in_inbox
        requested |= {_digest_mark(r.run_key) for r in requests}
        cursor = json.dumps({"reported": sorted(reported), "requested": sorted(requested)}, separators=(",", ":"))
        return dg.SensorResult(
            run_requests=requests,
            dynamic_partitions_requests=[manifests_partitions.build_add_request(new_keys)] if new_keys else [],
            skip_reason=None if requests else "no reviewed manifests in the manifests folder",
            cursor=cursor,
        )

    return evaluate
