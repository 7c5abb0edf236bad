"""Manifests are dynamic partitions keyed by their short digest (registered by the sensor)."""

import dagster as dg

manifests_partitions = dg.DynamicPartitionsDefinition(name="manifests")
