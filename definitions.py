"""The code location: merges each domain's definitions with the sensors, the shared resources and
the jobs that span domains. Wiring only; settings are read once here, at the edge."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import dagster as dg

from ito_assets.defs import data, decision, manifest, posttraining, telemetry, training, workload
from ito_assets.defs.decision.params import DecisionRunParams, checked_defaults
from ito_assets.defs.executors import executor_for
from ito_assets.defs.jobs import data_preparation_job, preparation_job, training_job
from ito_assets.defs.resources import ItoSettingsResource, LedgerResource
from ito_assets.settings import Settings, load_settings
from sensors import sensors

# The lineage, in order: manifest -> data -> decision and plan -> workload -> training -> post-training
# -> desk telemetry.
DOMAINS: dict[str, Callable[[], dg.Definitions]] = {
    "manifest": manifest.defs,
    "data": data.defs,
    "decision": decision.defs,
    "workload": workload.defs,
    "training": training.defs,
    "posttraining": posttraining.defs,
    "telemetry": telemetry.defs,
}


def build_definitions(
    settings: Settings,
    *,
    decision_run_config: Mapping | None = None,
    domains: Sequence[str] = tuple(DOMAINS),
) -> dg.Definitions:
    """`decision_run_config` overrides the decision run's defaults (tests use a tiny one); `domains`
    loads a prefix of the lineage only (tests of one domain), the whole of it by default."""
    # The location's decision defaults: ITO_DECISION_TRAINER, then ITO_DECISION_CONFIG's fields,
    # then the caller's; the launchpad overrides any of them per run.
    defaults = {}
    if settings.decision_trainer != DecisionRunParams.model_fields["trainer"].default:
        defaults["trainer"] = settings.decision_trainer
    defaults |= checked_defaults(settings.decision_config, "ITO_DECISION_CONFIG")
    preparation = preparation_job({**defaults, **(decision_run_config or {})} or None)
    # The data job runs its steps in one process, whatever the location's executor: its steps
    # share no state, and a process per step costs more than the steps do
    # (docs/performance.md#the-data-job-and-its-executor).
    data_preparation = data_preparation_job(dg.in_process_executor)
    shell = dg.Definitions(
        sensors=sensors(preparation, data_preparation),
        jobs=[preparation, training_job, data_preparation],
        resources={"ito": ItoSettingsResource.from_settings(settings), "ledger": LedgerResource.from_settings(settings)},
        executor=executor_for(settings.executor),
    )
    return dg.Definitions.merge(*(DOMAINS[name]() for name in domains), shell)


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions(load_settings())
