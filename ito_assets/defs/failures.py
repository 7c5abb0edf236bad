"""How a Dagster step refuses: a core error or an unverified manifest becomes a `dg.Failure` that
carries the stable error code as metadata (the UI shows it; the ledger outcome can read it)."""

from typing import Callable, TypeVar

import dagster as dg
from pydantic import ValidationError

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.discovery import ManifestVerdict
from ito_assets.manifest.verify import VerifiedManifest


def failure(error: ItoError) -> dg.Failure:
    return dg.Failure(description=f"{error.code.value}: {error.message}", metadata={"error_code": error.code.value})


def verified_or_fail(verdict: ManifestVerdict, step: str) -> VerifiedManifest:
    """The manifest gate, enforced again by every step that acts on a manifest's content."""
    if not verdict.ok or verdict.verified is None:
        code = verdict.error_code or ErrorCode.MANIFEST_INVALID.value
        raise dg.Failure(description=f"{code}: the manifest did not verify; {step} refuses to run",
                         metadata={"error_code": code})
    return verdict.verified


def training_manifest_or_fail(verdict: ManifestVerdict, step: str) -> VerifiedManifest:
    """The gate of a step that needs a training manifest: a data manifest verifies (the data stage
    takes it) but names no model, target or budget."""
    verified = verified_or_fail(verdict, step)
    if not verified.is_training:
        code = ErrorCode.MANIFEST_INVALID.value
        raise dg.Failure(description=f"{code}: a data manifest prepares data only; {step} needs a training manifest",
                         metadata={"error_code": code})
    return verified


T = TypeVar("T")


def core_config(step: str, build: Callable[[], T]) -> T:
    """`build()`, the core's configuration from a step's run config; a value the core refuses fails
    the step with USAGE_ERROR before it does any work."""
    try:
        return build()
    except ValueError as error:
        raise failure(ItoError(ErrorCode.USAGE_ERROR, f"the run config of {step}: {_reason(error)}")) from None


def _reason(error: ValueError) -> str:
    if isinstance(error, ValidationError):  # its own text quotes the input
        first = error.errors()[0]
        return f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"
    return str(error)
