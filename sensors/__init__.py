"""Sensors: one module per trigger. Each reacts only to reviewed inputs and uses deterministic
run keys, so a restarted daemon never launches the same work twice."""

from sensors.manifests import reviewed_manifest_sensor

SENSORS = [reviewed_manifest_sensor]
