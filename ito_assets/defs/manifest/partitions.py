"""Manifests are dynamic partitions keyed by their short digest (registered by the sensor)."""

import dagster as dg

manifests_partitions = dg.DynamicPartitionsDefinition(name="manifests")

# The line every asset of a training run (workload, training, post-training) adds to its
# description: `make run` prepares both fixture manifests and trains one, so the UI's partial fill
# on those assets is expected, and a reader should not take it for a failed run.
TRAINED_ONE_OF_TWO = (
    " After `make run` the UI shows it 50% filled / 1 missing: `make run` prepares two manifests (two "
    "partitions) and trains one; the missing partition is the manifest prepared but never trained."
)
