"""A run's configuration checked before its first step does any work.

Dagster checks a step's config against its types when the run is launched; the ranges are the
core's, which refused a value only when that step ran, after the steps before it had spent their
time (a deduplication threshold of 0 after decontamination, a decision's empty seed list after
the whole data stage). The core's messages name the field, never the value.
"""

from __future__ import annotations

from typing import Any, Mapping

import dagster as dg

from ito_assets.defs.data.params import DecontamParams, DedupParams, ScaleParams
from ito_assets.defs.decision.params import DataDecisionParams, DecisionRunParams
from ito_assets.defs.failures import core_config

# The steps whose config the core judges, by step name.
STEP_PARAMS: dict[str, type[dg.Config]] = {
    "source_documents": ScaleParams, "contamination_report": DecontamParams,
    "deduplicated_documents": DedupParams, "clean_shards": ScaleParams,
    "decision_run": DecisionRunParams, "data_decision": DataDecisionParams,
}


def check_run_config(run_config: Mapping[str, Any]) -> None:
    """Every step's config in `run_config` that the core judges, each as its step would build it:
    the run's first step calls this, so a bad value later in the run stops it before any work."""
    steps = run_config.get("ops") or {}
    for step, params in STEP_PARAMS.items():
        fields = (steps.get(step) or {}).get("config")
        if fields:
            core_config(step, lambda: params(**fields).to_config())  # type: ignore[attr-defined]
