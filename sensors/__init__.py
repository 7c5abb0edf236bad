"""Sensors: one module per trigger. Each reacts only to reviewed inputs and uses deterministic
run keys, so a restarted daemon never launches the same work twice."""

from typing import TYPE_CHECKING

import dagster as dg

from sensors.eval_suite import eval_suite_changed
from sensors.manifests import REVIEWED_MANIFEST_SENSOR, reviewed_manifest_sensor
from sensors.training_runs import (
    cancellation_sensor,
    confirmed_run_sensor,
    training_canceled_sensor,
    training_failed_sensor,
    training_succeeded_sensor,
)

if TYPE_CHECKING:  # the type define_asset_job returns, not exported at the top level
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

# Evaluated in this order by `make run` (in process); the daemon runs them all on their own.
SENSOR_ORDER = (REVIEWED_MANIFEST_SENSOR, eval_suite_changed.name, confirmed_run_sensor.name, cancellation_sensor.name)
RUN_STATUS_SENSORS = [training_succeeded_sensor, training_failed_sensor, training_canceled_sensor]


def sensors(preparation: "UnresolvedAssetJobDefinition",
            data_preparation: "UnresolvedAssetJobDefinition") -> list[dg.SensorDefinition]:
    """Every sensor, the reviewed-manifest one targeting the location's own preparation jobs."""
    return [reviewed_manifest_sensor(preparation, data_preparation), eval_suite_changed, confirmed_run_sensor,
            cancellation_sensor, *RUN_STATUS_SENSORS]
