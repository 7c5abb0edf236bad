"""`ito data prepare`'s Dagster side: the data manifest's partition registered in the instance (so
that `make ui` shows the run and the assets), `data_preparation_job` materialised for it in this
process with the eval suite named in the run config, and the outcome as plain values for the
command to print. A refusal is the ItoError of the step or blocking check that refused."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from ito_assets.control import run_tags
from ito_assets.data.stages import CleanStage, DecontamStage
from ito_assets.defs.in_process_runs import process_tags, wait_for_pool
from ito_assets.defs.jobs import DATA_PREPARATION_JOB
from ito_assets.defs.resources import WAREHOUSE_POOL
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.settings import Settings

# What `make run` and `make ui` copy into a DAGSTER_HOME that has no configuration yet.
INSTANCE_TEMPLATE = Path("deploy") / "local" / "dagster.yaml"
# Our summary is the command's output; every event stays in the instance for `make ui`.
_SILENT_CONSOLE = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


@dataclass(frozen=True)
class Prepared:
    run_id: str
    clean: CleanStage
    num_checks_passed: int
    warnings: tuple[str, ...]  # failed WARN checks (a duplicate rate above its threshold)
    decontam: DecontamStage | None = None  # what the scan looked for (its items, its rule)


def open_instance(settings: Settings, home: Path) -> dg.DagsterInstance:
    """The instance at `home`, first configured as `make run` configures it when it has no
    dagster.yaml (no telemetry, the pools the data steps queue on)."""
    home.mkdir(parents=True, exist_ok=True)
    config, template = home / "dagster.yaml", settings.project_root / INSTANCE_TEMPLATE
    if not config.exists() and template.is_file():
        shutil.copyfile(template, config)
    return dg.DagsterInstance.from_config(str(home))


def prepare(settings: Settings, instance: dg.DagsterInstance, manifest_digest: str, suite_path: Path,
            suite_digest: str) -> Prepared:
    """Materialise `data_preparation_job` for the manifest (stored where the training_manifest
    asset finds it, `settings.data_manifests_dir`) against the suite at `suite_path`."""
    from definitions import build_definitions  # the code location, its warning filter included

    key = manifest_digest.removeprefix("sha256:")[:12]
    defs = build_definitions(settings, domains=("manifest", "data"))
    if not instance.has_dynamic_partition(manifests_partitions.name, key):
        instance.add_dynamic_partitions(manifests_partitions.name, [key])
    # A killed earlier run's slot is freed; a live one's is waited for where Ctrl-C still works.
    # The wait goes to stderr: stdout is the command's one document.
    wait_for_pool(instance, WAREHOUSE_POOL, say=lambda line: print(line, file=sys.stderr, flush=True))
    result = defs.resolve_job_def(DATA_PREPARATION_JOB).execute_in_process(
        instance=instance,
        partition_key=key,
        run_config={"ops": {"eval_suite": {"config": {"path": str(suite_path)}}}, **_SILENT_CONSOLE},
        tags=run_tags.for_preparation(manifest_digest, suite_digest) | process_tags(),
        raise_on_error=False,
    )
    evaluations = result.get_asset_check_evaluations()
    blocking = [e for e in evaluations if not e.passed and e.severity == dg.AssetCheckSeverity.ERROR]
    if blocking:
        raise _check_refusal(blocking[0], result.run_id)
    if not result.success:
        raise _step_refusal(result)
    return Prepared(
        run_id=result.run_id,
        clean=result.output_for_node("clean_shards"),
        decontam=result.output_for_node("contamination_report"),
        num_checks_passed=sum(e.passed for e in evaluations),
        warnings=tuple(f"{e.asset_key.to_user_string()}:{e.check_name}" for e in evaluations if not e.passed),
    )


def _check_refusal(evaluation: dg.AssetCheckEvaluation, run_id: str) -> ItoError:
    """A failed blocking check: its own code where it names one, DATA_CHECK_FAILED otherwise."""
    recorded = evaluation.metadata.get("error_code")
    code = getattr(recorded, "value", "") or ErrorCode.DATA_CHECK_FAILED.value
    name = f"{evaluation.asset_key.to_user_string()}:{evaluation.check_name}"
    return ItoError(ErrorCode(code), f"the blocking check {name} failed (Dagster run {run_id}); the clean shards must not be used")


def _step_refusal(result: dg.ExecuteInProcessResult) -> ItoError:
    """The first failed step's code and message, as the step's Failure carries them (failures.py)."""
    for event in result.get_step_failure_events():
        data = event.step_failure_data
        metadata = data.user_failure_data.metadata if data and data.user_failure_data else {}
        recorded = metadata.get("error_code")
        code = getattr(recorded, "value", None)
        if code in ErrorCode.__members__:
            description = data.user_failure_data.description or ""
            return ItoError(ErrorCode(code), description.removeprefix(f"{code}: "))
    failed = ", ".join(result.get_failed_step_keys()) or "the run"
    return ItoError(ErrorCode.INTERNAL_ERROR, f"{failed} failed (Dagster run {result.run_id}); see it with `make ui`")
