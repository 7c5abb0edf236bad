"""Reading a finished Dagster run's verdict and writing it to the ledger: one function for the
run-status sensors (daemon) and for `make run` (in process)."""

import dagster as dg

from ito_assets.errors import ErrorCode
from ito_assets.gates.ledger import Ledger
from ito_assets.gates.outcome import record_outcome
from ito_assets.gates.runs import Run

AUTHORIZATION_CHECK = "run_still_authorized"
EVAL_GATE_SUFFIX = "_gate"  # eval-gate checks are named <stage>_gate


def failed_gate_code(instance: dg.DagsterInstance, dagster_run_id: str) -> str | None:
    """The code of the first gate whose blocking check failed in this run, if any."""
    records = instance.get_records_for_run(dagster_run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records
    for record in records:
        evaluation = record.event_log_entry.dagster_event.event_specific_data
        if evaluation.passed:
            continue
        if evaluation.check_name == AUTHORIZATION_CHECK:
            code = evaluation.metadata.get("error_code")
            return code.value if code is not None and code.value else ErrorCode.CONFIRMATION_INVALID.value
        if evaluation.check_name.endswith(EVAL_GATE_SUFFIX):
            return ErrorCode.EVAL_GATE_FAILED.value
    return None


def report_outcome(ledger: Ledger, instance: dg.DagsterInstance, dagster_run: dg.DagsterRun, run_id: str) -> Run:
    succeeded = dagster_run.status == dg.DagsterRunStatus.SUCCESS
    gate_code = None if succeeded else failed_gate_code(instance, dagster_run.run_id)
    return record_outcome(ledger, run_id, succeeded=succeeded, gate_code=gate_code)
