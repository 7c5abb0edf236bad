"""The authorization gate as every training step enforces it: the stored `run_authorization` is
only a record (Dagster keeps one per manifest partition, shared by every run and every re-execution),
so a step that spends compute asks the ledger again, now, for the run it was launched for."""

from pathlib import Path

import dagster as dg

from ito_assets.defs.failures import failure
from ito_assets.defs.resources import LedgerResource
from ito_assets.defs.workload.assets import RUN_ID_TAG
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.gates import authorization, runs


def _refuse(code: ErrorCode, why: str, step: str) -> dg.Failure:
    return dg.Failure(description=f"{code.value}: {why}; {step} refuses to run", metadata={"error_code": code.value})


def require_live_authorization(context: dg.AssetExecutionContext, ledger: LedgerResource, recorded: dict,
                               step: str, *, manifest_digest: str | None = None) -> tuple[str, Path]:
    """(ledger run id, the run's checkpoint folder), or a Failure with the gate's code when the
    record is not this run's, the ledger no longer authorizes it, another Dagster run holds it, or
    the manifest this step read is not the one the confirmation was bound to."""
    if not recorded.get("authorized"):
        code = ErrorCode(recorded.get("error_code") or ErrorCode.CONFIRMATION_INVALID.value)
        raise _refuse(code, "the run is not authorized", step)
    run_id = context.run.tags.get(RUN_ID_TAG)
    if not run_id or recorded.get("run_id") != run_id:
        raise _refuse(ErrorCode.CONFIRMATION_INVALID, "the authorization on record belongs to another run", step)
    with ledger.open() as opened:
        try:
            if runs.get(opened, run_id).dagster_run_id != context.run_id:
                raise _refuse(ErrorCode.CONFIRMATION_INVALID, "another Dagster run holds this ledger run", step)
            granted = authorization.reverify(opened, run_id)
        except ItoError as error:
            raise failure(error) from None
    if manifest_digest is not None and manifest_digest != granted.manifest_digest:
        raise _refuse(ErrorCode.MANIFEST_DIGEST_MISMATCH, "the manifest read is not the one confirmed", step)
    return run_id, Path(granted.checkpoint_dir)
