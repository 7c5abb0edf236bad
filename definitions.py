"""The code location: merges each domain's definitions with the sensors and shared resources.
Wiring only; settings are read once here, at the edge."""

from __future__ import annotations

from typing import Mapping

import dagster as dg

from ito_assets.defs import data, decision, manifest, workload
from ito_assets.defs.executors import executor_for
from ito_assets.defs.jobs import preparation_job, training_job
from ito_assets.defs.resources import ItoSettingsResource, LedgerResource
from ito_assets.settings import Settings, load_settings
from sensors import RUN_STATUS_SENSORS, SENSORS


def build_definitions(settings: Settings, *, decision_run_config: Mapping | None = None) -> dg.Definitions:
    shell = dg.Definitions(
        sensors=[*SENSORS, *RUN_STATUS_SENSORS],
        jobs=[preparation_job(decision_run_config), training_job],
        resources={"ito": ItoSettingsResource.from_settings(settings), "ledger": LedgerResource.from_settings(settings)},
        executor=executor_for(settings.executor),
    )
    return dg.Definitions.merge(manifest.defs(), data.defs(), decision.defs(), workload.defs(), shell)


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions(load_settings())
