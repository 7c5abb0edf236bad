"""Sensors: one module per trigger. Each reacts only to reviewed inputs and uses deterministic
run keys, so a restarted daemon never launches the same work twice."""

from sensors.eval_suite import eval_suite_changed
from sensors.manifests import reviewed_manifest_sensor
from sensors.training_runs import (
    cancellation_sensor,
    confirmed_run_sensor,
    training_canceled_sensor,
    training_failed_sensor,
    training_succeeded_sensor,
)

# Evaluated in this order by `make run` (in process); the daemon runs them all on their own.
SENSORS = [reviewed_manifest_sensor, eval_suite_changed, confirmed_run_sensor, cancellation_sensor]
RUN_STATUS_SENSORS = [training_succeeded_sensor, training_failed_sensor, training_canceled_sensor]
