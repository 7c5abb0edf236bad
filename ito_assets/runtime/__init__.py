"""The training runtime (the training stages and what the desk sees of them): asynchronous DCP
checkpoints, worker heartbeats and the supervisor that restarts a stage after a fault, loss-spike
proposals, stage eval gates and goodput telemetry. Pure core: no Dagster import; the worker
reports through Dagster Pipes only when it was launched under Pipes."""
