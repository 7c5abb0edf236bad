"""Stable error codes and the one exception type the core raises for user-facing failures.

Codes are part of the public contract (scripts branch on them without parsing messages): add, never rename.
Messages are safe text: they never echo caller-supplied values that could be secrets.
"""

from __future__ import annotations

import enum
import errno


class ErrorCode(str, enum.Enum):
    MANIFEST_PATH_NOT_CANONICAL = "MANIFEST_PATH_NOT_CANONICAL"
    MANIFEST_NOT_FOUND = "MANIFEST_NOT_FOUND"
    MANIFEST_SYMLINK = "MANIFEST_SYMLINK"
    MANIFEST_NOT_REGULAR = "MANIFEST_NOT_REGULAR"
    MANIFEST_HARD_LINKED = "MANIFEST_HARD_LINKED"
    MANIFEST_UNSAFE_OWNER = "MANIFEST_UNSAFE_OWNER"
    MANIFEST_UNSAFE_PERMISSIONS = "MANIFEST_UNSAFE_PERMISSIONS"
    MANIFEST_TOO_LARGE = "MANIFEST_TOO_LARGE"
    MANIFEST_CHANGED = "MANIFEST_CHANGED"
    MANIFEST_INVALID = "MANIFEST_INVALID"
    MANIFEST_CONTAINS_SECRET = "MANIFEST_CONTAINS_SECRET"
    MANIFEST_DIGEST_MISMATCH = "MANIFEST_DIGEST_MISMATCH"
    PROVENANCE_MISSING = "PROVENANCE_MISSING"
    EVAL_SUITE_INVALID = "EVAL_SUITE_INVALID"
    EVAL_SUITE_MISMATCH = "EVAL_SUITE_MISMATCH"
    SOURCE_NOT_FOUND = "SOURCE_NOT_FOUND"
    SOURCE_DIGEST_MISMATCH = "SOURCE_DIGEST_MISMATCH"
    SOURCE_INVALID = "SOURCE_INVALID"
    WAREHOUSE_NOT_FOUND = "WAREHOUSE_NOT_FOUND"
    WAREHOUSE_BUSY = "WAREHOUSE_BUSY"
    AUDIT_NOT_FOUND = "AUDIT_NOT_FOUND"
    BOOKING_NOT_FOUND = "BOOKING_NOT_FOUND"
    BOOKING_EXPIRED = "BOOKING_EXPIRED"
    BOOKING_REVOKED = "BOOKING_REVOKED"
    BOOKING_RELEASED = "BOOKING_RELEASED"
    BOOKING_INCOMPLETE = "BOOKING_INCOMPLETE"
    BOOKING_MISMATCH = "BOOKING_MISMATCH"
    CONFIRMATION_INVALID = "CONFIRMATION_INVALID"
    CONFIRMATION_NOT_APPROVED = "CONFIRMATION_NOT_APPROVED"
    CONFIRMATION_EXPIRED = "CONFIRMATION_EXPIRED"
    CONFIRMATION_CONSUMED = "CONFIRMATION_CONSUMED"
    CONFIRMATION_MISMATCH = "CONFIRMATION_MISMATCH"
    IDEMPOTENCY_KEY_INVALID = "IDEMPOTENCY_KEY_INVALID"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    IDEMPOTENCY_KEY_IN_FLIGHT = "IDEMPOTENCY_KEY_IN_FLIGHT"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    CAPACITY_UNAVAILABLE = "CAPACITY_UNAVAILABLE"
    NETWORK_MISMATCH = "NETWORK_MISMATCH"
    DATA_POLICY_VIOLATION = "DATA_POLICY_VIOLATION"
    CHECKPOINT_STORAGE_INVALID = "CHECKPOINT_STORAGE_INVALID"
    PLAN_REFUSED = "PLAN_REFUSED"
    AUTH_REQUIRED = "AUTH_REQUIRED"
    CREDENTIAL_REVOKED = "CREDENTIAL_REVOKED"
    API_UNREACHABLE = "API_UNREACHABLE"
    TIMEOUT = "TIMEOUT"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    EVAL_GATE_FAILED = "EVAL_GATE_FAILED"
    CAPABILITY_MISSING = "CAPABILITY_MISSING"
    USAGE_ERROR = "USAGE_ERROR"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    # Cancelling a run that already ended: nothing is left to stop.
    RUN_FINISHED = "RUN_FINISHED"
    # Loss-spike proposals the desk decides.
    PROPOSAL_NOT_FOUND = "PROPOSAL_NOT_FOUND"
    PROPOSAL_ALREADY_DECIDED = "PROPOSAL_ALREADY_DECIDED"
    # Post-training: the generator process died or stopped producing samples;
    # a post-training fixture file (instruction or preference pairs) is malformed.
    GENERATION_FAILED = "GENERATION_FAILED"
    # RLVR: a step found no group to learn from within the draws the plan priced; drawing more
    # (a restart's) would pass the price, so the stage ends.
    GENERATION_DRAWS_SPENT = "GENERATION_DRAWS_SPENT"
    POSTTRAINING_DATA_INVALID = "POSTTRAINING_DATA_INVALID"
    # A post-training checkpoint's bytes differ from the digest it was recorded with.
    CHECKPOINT_DIGEST_MISMATCH = "CHECKPOINT_DIGEST_MISMATCH"
    # A known identity asking for an operation its role does not allow (a tenant on a desk route).
    PERMISSION_DENIED = "PERMISSION_DENIED"
    # A request body above the server's limit, refused while it streams in.
    REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE"
    # The disk under the ledger (or a data store) is full: nothing was written, retry once space returns.
    STORAGE_FULL = "STORAGE_FULL"
    # The API server holds as many connections, or requests in flight, as it takes: it answered
    # before the request reached any route, so nothing of it was done.
    SERVER_BUSY = "SERVER_BUSY"
    # A shard's bytes no longer hash to the sha256 recorded when it was written.
    SHARD_CORRUPT = "SHARD_CORRUPT"
    # The DuckDB warehouse cannot be opened or read; it is derived from the Parquet lineage.
    WAREHOUSE_CORRUPT = "WAREHOUSE_CORRUPT"
    # A write into the warehouse needed more than its fixed memory cap; it was rolled back.
    WAREHOUSE_OUT_OF_MEMORY = "WAREHOUSE_OUT_OF_MEMORY"
    # The ledger was migrated by a newer release than this one knows.
    LEDGER_SCHEMA_TOO_NEW = "LEDGER_SCHEMA_TOO_NEW"
    # The data decision found the candidate data worse, or could not tell, and no reviewer accepted it.
    DATA_DECISION_NO_GO = "DATA_DECISION_NO_GO"
    DATA_DECISION_INCONCLUSIVE = "DATA_DECISION_INCONCLUSIVE"
    # The candidate data is better beyond noise, but the gain does not pay for the full run (the
    # manifest's cost per point of improvement, or the desk's minimum improvement), and no reviewer accepted that.
    DATA_DECISION_NOT_WORTH_IT = "DATA_DECISION_NOT_WORTH_IT"
    # The data decision judged other clean shards than those training would read (they were
    # prepared again since): its verdict says nothing about these.
    DATA_DECISION_STALE = "DATA_DECISION_STALE"
    # An arm of the decision run did not finish on the stage worker (its restarts spent), or left
    # no usable final checkpoint: no verdict is drawn from the arms that did.
    DECISION_ARM_FAILED = "DECISION_ARM_FAILED"
    # A data step's work unit failed on every attempt (a Ray task retried until its limit): the step
    # fails naming the phase and the unit, and nothing it would have written is used.
    DATA_WORK_UNIT_FAILED = "DATA_WORK_UNIT_FAILED"
    # A blocking check of the data stage failed (conservation, residual contamination): the clean
    # shards it judged must not be used.
    DATA_CHECK_FAILED = "DATA_CHECK_FAILED"
    # The booking's window has not begun: its GPUs are not the account's yet, so nothing trains on them.
    BOOKING_NOT_STARTED = "BOOKING_NOT_STARTED"
    # A training stage's folder is held by another supervisor or launch of that stage (a second run of
    # it while the first runs): this one wrote and started nothing there.
    STAGE_BUSY = "STAGE_BUSY"
    # A desk listing filtered by an account id that names no account (a typo would otherwise read
    # as an account with nothing).
    ACCOUNT_NOT_FOUND = "ACCOUNT_NOT_FOUND"


# Codes a caller may retry unchanged; everything else needs a different request.
RETRYABLE = frozenset(
    {
        ErrorCode.API_UNREACHABLE,
        ErrorCode.TIMEOUT,
        ErrorCode.OUTCOME_UNKNOWN,
        ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT,
        ErrorCode.CAPACITY_UNAVAILABLE,
        ErrorCode.STORAGE_FULL,
        ErrorCode.SERVER_BUSY,
    }
)


class ItoError(Exception):
    """A user-facing failure with a stable code and a message that is safe to print."""

    def __init__(self, code: ErrorCode, message: str, *, retryable: bool | None = None):
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.retryable = code in RETRYABLE if retryable is None else retryable

    def to_dict(self) -> dict:
        return {"code": self.code.value, "message": self.message, "retryable": self.retryable}

    def __reduce__(self):
        # A worker process sends its exception to the step pickled; the default rebuilds it as
        # cls(*args), which an __init__ of (code, message) cannot take, and the pool breaks.
        return _rebuilt, (type(self), self.args), self.__dict__


def _rebuilt(cls: type[ItoError], args: tuple) -> ItoError:
    """An ItoError (or subclass) with its args, before its attributes are set back."""
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    return error


def disk_full(error: BaseException) -> bool:
    """A write that failed for want of space: an OSError with its errno (Python, pyarrow, and
    polars writing through `_Sink`), or DuckDB's (or polars') error whose text carries the OS's."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)
    return "No space left on device" in text or "Disk quota exceeded" in text


def storage_full(what: str) -> ItoError:
    return ItoError(ErrorCode.STORAGE_FULL, f"the disk is full while writing {what}; nothing of it was kept: retry once space returns")
