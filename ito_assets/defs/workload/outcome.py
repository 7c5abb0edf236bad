"""Reading a finished Dagster run's verdict and writing it to the ledger: one function for the
run-status sensors (daemon) and for `make run` (in process)."""

from collections import Counter

import dagster as dg

from ito_assets.errors import ErrorCode
from ito_assets.control import runs, telemetry
from ito_assets.control.ledger import Ledger
from ito_assets.control.outcome import record_outcome
from ito_assets.control.runs import Run
from ito_assets.control.states import TERMINAL_RUN_STATES

# The events a caller of `ito logs` wants to read: steps, materializations, checks, the run's end.
_LOGGED_EVENTS = frozenset({
    dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE,
    dg.DagsterEventType.STEP_SKIPPED, dg.DagsterEventType.ASSET_MATERIALIZATION,
    dg.DagsterEventType.ASSET_CHECK_EVALUATION, dg.DagsterEventType.RUN_SUCCESS,
    dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED,
})

AUTHORIZATION_CHECK = "run_still_authorized"
EVAL_GATE_SUFFIX = "_gate"  # eval-gate checks are named <stage>_gate


def _check_gate_code(instance: dg.DagsterInstance, dagster_run_id: str) -> str | None:
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


def _refusal_code(instance: dg.DagsterInstance, dagster_run_id: str) -> str | None:
    """The stable code a step refused with (`dg.Failure` metadata, see defs/failures.py)."""
    records = instance.get_records_for_run(dagster_run_id, of_type=dg.DagsterEventType.STEP_FAILURE).records
    for record in records:
        data = record.event_log_entry.dagster_event.event_specific_data
        user_failure = getattr(data, "user_failure_data", None)
        code = user_failure.metadata.get("error_code") if user_failure is not None else None
        if code is not None and code.value and code.value != ErrorCode.INTERNAL_ERROR.value:
            return code.value
    return None


def failed_gate_code(instance: dg.DagsterInstance, dagster_run_id: str) -> str | None:
    """The code of the gate that stopped this run: a failed blocking check, or a step's refusal."""
    return _check_gate_code(instance, dagster_run_id) or _refusal_code(instance, dagster_run_id)


def _copied_already(ledger: Ledger, run_id: str) -> Counter:
    """The (time, level, message) lines the ledger holds for the run, as many times as it holds them."""
    held, after = Counter(), 0
    while page := telemetry.logs(ledger, run_id, after=after, limit=telemetry.MAX_PAGE):
        held.update((line.at, line.level, line.message) for line in page)
        after = page[-1].seq
    return held


def copy_event_log(ledger: Ledger, instance: dg.DagsterInstance, dagster_run_id: str, run_id: str) -> int:
    """The run's Dagster events into the ledger's log (redacted there), for `ito logs`. A line the
    ledger already holds is not copied again: a report that failed after the copy (the ledger
    lost before the run's end was written) is retried by the sweep, and `ito logs` must not show
    the run's events twice."""
    held = _copied_already(ledger, run_id)
    count = 0
    for entry in instance.all_logs(dagster_run_id):
        event = entry.dagster_event
        if event is None or event.event_type not in _LOGGED_EVENTS:
            continue
        level = "error" if event.is_failure else "info"
        step = f"{event.step_key}: " if event.step_key else ""
        message = f"{event.event_type.name} {step}{event.message or ''}".strip()
        line = (int(entry.timestamp), level, telemetry.redact(telemetry.storable(message)))
        if held[line]:
            held[line] -= 1
            continue
        # The event's own time: the log is copied when the run ends, and that moment is no line's.
        telemetry.append_log(ledger, run_id, level, message, at=int(entry.timestamp))
        count += 1
    return count


def report_outcome(ledger: Ledger, instance: dg.DagsterInstance, dagster_run: dg.DagsterRun, run_id: str) -> Run:
    """Once per run: its event log and its end. A run already terminal is left as it is."""
    current = runs.get(ledger, run_id)
    # Only the Dagster run the ledger attached speaks for the run (a re-execution or a racing
    # launch that the authorization refused must not end the one that is training).
    if current.state in TERMINAL_RUN_STATES or current.dagster_run_id not in (None, dagster_run.run_id):
        return current
    copy_event_log(ledger, instance, dagster_run.run_id, run_id)
    succeeded = dagster_run.status == dg.DagsterRunStatus.SUCCESS
    gate_code = None if succeeded else failed_gate_code(instance, dagster_run.run_id)
    return record_outcome(ledger, run_id, succeeded=succeeded, gate_code=gate_code)
