"""The training runtime: what turns a stage of the plan into checkpoints, eval-gate verdicts and
telemetry. Pure core: no Dagster import; the worker reports through Dagster Pipes only when it was
launched under Pipes.

    stage/        one stage's inputs and its judgement: the curriculum, the worker config, the
                  token shards, the eval battery and the eval gate
    supervision/  the supervisor, replica groups, heartbeats, the launch of attempts, loss-spike
                  detection and the proposals a person approves
    worker/       one rank of one attempt: process groups, the data-parallel step, batches, the
                  state a bit-exact resume needs
    checkpoint/   asynchronous DCP saves, completion markers, the registry, resume and holds
    record/       what a run leaves behind: the event log, goodput, the ledger publisher, files
"""
