"""The state enums of the ledger: one word per concept, shared by server, client and Dagster.

Stdlib only: `ito status --watch` needs the terminal states at client start.
"""

from __future__ import annotations

import enum


class BookingState(str, enum.Enum):
    PENDING = "pending"  # created by the desk, not yet paid/complete: no eligibility
    COMPLETED = "completed"  # the only state that grants training eligibility
    EXPIRED = "expired"
    REVOKED = "revoked"
    RELEASED = "released"


class RunState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    GATE_FAILED = "gate_failed"


TERMINAL_RUN_STATES = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.GATE_FAILED}
)
# Runs that hold a booking's capacity.
ACTIVE_RUN_STATES = frozenset({RunState.QUEUED, RunState.RUNNING, RunState.CANCELLING})

# The transitions the Dagster shell and the server may make; anything else is a bug upstream.
RUN_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.QUEUED: frozenset({RunState.RUNNING, RunState.CANCELLING, RunState.CANCELLED,
                                RunState.GATE_FAILED, RunState.FAILED}),
    RunState.RUNNING: frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLING,
                                 RunState.GATE_FAILED}),
    RunState.CANCELLING: frozenset({RunState.CANCELLED, RunState.FAILED, RunState.SUCCEEDED,
                                    RunState.GATE_FAILED}),
    RunState.SUCCEEDED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.CANCELLED: frozenset(),
    RunState.GATE_FAILED: frozenset(),
}


class Action(str, enum.Enum):
    """What a confirmation authorizes; each mutation needs its own."""

    TRAIN = "train"
    CANCEL = "cancel"
    CLEANUP = "cleanup"
    # Releasing a booking is an economic action: only with cleanup, and only with its own
    # confirmation.
    RELEASE = "release"


class Role(str, enum.Enum):
    DESK = "desk"  # the booking desk: accounts, tokens, bookings, approvals
    ACCOUNT = "account"  # a tenant: confirmation requests, runs, lifecycle
