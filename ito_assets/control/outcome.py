"""How a finished Dagster run is written back to the ledger, so that `ito status` tells the truth.

A run stopped by a gate (its authorization no longer holds, or an eval gate failed) ends
`gate_failed` with that gate's code (even when a cancellation was requested meanwhile); a success
ends `succeeded`; any other end of a run whose cancellation was confirmed is `cancelled`, and of
any other run `failed`. A run already in a terminal state is left as it is, so a
repeated report (a retried sensor tick, `make run` and the daemon both seeing it) is harmless.
A `gate_failed` run whose training had started keeps its cost spent in the budget (control/budget.py).
"""

from __future__ import annotations

from ito_assets.control import runs
from ito_assets.control.ledger import Ledger
from ito_assets.control.states import TERMINAL_RUN_STATES, RunState


def record_outcome(ledger: Ledger, run_id: str, *, succeeded: bool, gate_code: str | None = None,
                   reason: str | None = None) -> runs.Run:
    run = runs.get(ledger, run_id)
    if run.state in TERMINAL_RUN_STATES:
        return run
    # What the run did comes first: a gate that failed is never reported as a cancellation.
    if succeeded:
        if run.state is RunState.QUEUED:
            runs.set_state(ledger, run_id, RunState.RUNNING)
        return runs.set_state(ledger, run_id, RunState.SUCCEEDED)
    if gate_code is not None:
        return runs.set_state(ledger, run_id, RunState.GATE_FAILED, reason=gate_code)
    if run.state is RunState.CANCELLING:
        return runs.set_state(ledger, run_id, RunState.CANCELLED, reason="cancelled by request")
    return runs.set_state(ledger, run_id, RunState.FAILED, reason=reason or "the Dagster run failed")
