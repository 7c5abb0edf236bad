"""The training runtime (SPEC.md stages 3 and 4, desk telemetry): asynchronous DCP checkpoints,
worker heartbeats and the supervisor that restarts a stage after a fault, loss-spike proposals,
stage eval gates and goodput telemetry. Pure core: no Dagster import; the worker reports through
Dagster Pipes only when it was launched under Pipes."""
