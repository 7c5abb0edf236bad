"""The executor of every job, chosen by configuration (ITO_EXECUTOR): the laptop and the cluster
run the same definitions."""

import dagster as dg


def executor_for(name: str) -> dg.ExecutorDefinition:
    if name == "in_process":
        return dg.in_process_executor
    if name == "k8s":
        # Imported only here: the Kubernetes client is a cluster dependency (the `cluster` extra).
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    # Steps in subprocesses on this machine; DuckDB writers and GPUs are serialized by pools
    # (deploy/local/dagster.yaml), not by this limit.
    return dg.multiprocess_executor
