"""The Dagster run tags that tie a Dagster run to the ledger: defined here once, written through
`for_run` and read through `run_id_of`, so the sensors, the assets and the ledger's re-check agree
on every spelling. Values are identifiers and digests only, never a secret."""

from __future__ import annotations

from typing import Mapping, Protocol

RUN_ID = "ito/run_id"
ACCOUNT_ID = "ito/account_id"
BOOKING_ID = "ito/booking_id"
MANIFEST_DIGEST = "ito/manifest_digest"
IDEMPOTENCY_KEY = "ito/idempotency_key"
EVAL_SUITE_DIGEST = "ito/eval_suite_digest"


class LedgerRunLike(Protocol):
    run_id: str
    account_id: str
    booking_id: str
    manifest_digest: str
    idempotency_key: str


def for_run(run: LedgerRunLike) -> dict[str, str]:
    """The tags of the Dagster run launched for a ledger run: account, booking, manifest digest, key."""
    return {RUN_ID: run.run_id, ACCOUNT_ID: run.account_id, BOOKING_ID: run.booking_id,
            MANIFEST_DIGEST: run.manifest_digest, IDEMPOTENCY_KEY: run.idempotency_key}


def for_preparation(manifest_digest: str, eval_suite_digest: str | None = None) -> dict[str, str]:
    """The tags of a preparation run: the manifest it prepares (and the suite it is decontaminated against)."""
    tags = {MANIFEST_DIGEST: manifest_digest}
    if eval_suite_digest is not None:
        tags[EVAL_SUITE_DIGEST] = eval_suite_digest
    return tags


def run_id_of(tags: Mapping[str, str]) -> str | None:
    """The ledger run a Dagster run was launched for, or None for a run that is not a ledger run's."""
    return tags.get(RUN_ID) or None
