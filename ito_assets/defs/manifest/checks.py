"""Blocking checks on the manifest: the face of the core's gates in the UI. Each failure stops
the rest of the run; the gates themselves are enforced again where side effects happen."""


import dagster as dg

from ito_assets.defs.manifest.assets import training_manifest
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.errors import ErrorCode
from ito_assets.evals.suite import EvalSuite
from ito_assets.manifest.discovery import ManifestVerdict
from ito_assets.manifest.verify import eval_suite_mismatches, provenance_problems

_NOT_VERIFIED = "the manifest did not verify, so its content cannot be trusted"


@dg.asset_check(
    asset=training_manifest,
    blocking=True,
    partitions_def=manifests_partitions,
    description="Secure read, strict JSON and schema.",
)
def manifest_verified(training_manifest: ManifestVerdict) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=training_manifest.ok,
        metadata={"error_code": training_manifest.error_code or "", "digest": training_manifest.digest or ""},
        description=training_manifest.error_message,
    )


@dg.asset_check(
    asset=training_manifest,
    blocking=True,
    partitions_def=manifests_partitions,
    description="No credential anywhere in the manifest.",
)
def manifest_has_no_secrets(training_manifest: ManifestVerdict) -> dg.AssetCheckResult:
    # Passed only where the scan read the whole manifest and found nothing: a file that is not
    # strict JSON (half-written, a key twice) was never scanned, whatever it holds; one the
    # schema refuses was, and its own check says why it did not verify.
    secret = training_manifest.error_code == ErrorCode.MANIFEST_CONTAINS_SECRET.value
    if training_manifest.ok or (training_manifest.secrets_scanned and not secret):
        return dg.AssetCheckResult(passed=True)
    reason = ("secret material found" if secret else "not scanned whole: the manifest did not verify "
              f"({training_manifest.error_code})")
    return dg.AssetCheckResult(passed=False, description=reason,
                               metadata={"error_code": training_manifest.error_code or ""})


@dg.asset_check(
    asset=training_manifest,
    blocking=True,
    partitions_def=manifests_partitions,
    description="Every data reference carries decontamination provenance.",
)
def provenance_present(training_manifest: ManifestVerdict) -> dg.AssetCheckResult:
    if not training_manifest.ok:
        return dg.AssetCheckResult(passed=False, description=_NOT_VERIFIED)
    missing = provenance_problems(training_manifest.verified.manifest)
    return dg.AssetCheckResult(
        passed=not missing,
        metadata={"error_code": ErrorCode.PROVENANCE_MISSING.value if missing else "", "missing": ", ".join(missing)},
    )


@dg.asset_check(
    asset=training_manifest,
    blocking=True,
    partitions_def=manifests_partitions,
    additional_ins={"eval_suite": dg.AssetIn("eval_suite")},
    description="The provenance's eval suite id and digest equal the eval_suite asset's.",
)
def eval_suite_digest_matches(training_manifest: ManifestVerdict, eval_suite: EvalSuite) -> dg.AssetCheckResult:
    if not training_manifest.ok:
        return dg.AssetCheckResult(passed=False, description=_NOT_VERIFIED)
    bad = eval_suite_mismatches(training_manifest.verified.manifest, eval_suite.suite_id, eval_suite.digest)
    return dg.AssetCheckResult(
        passed=not bad,
        metadata={"eval_suite_id": eval_suite.suite_id, "eval_suite_digest": eval_suite.digest, "mismatched": ", ".join(bad)},
    )


MANIFEST_CHECKS = [manifest_verified, manifest_has_no_secrets, provenance_present, eval_suite_digest_matches]
