"""Every error code a client call can meet at the API's edge (the manifest reader, the five gates,
identity, transport, the run lifecycle), reached through the client against the real server (or,
for transport failures, against a misbehaving listener on loopback).

Each case builds what it needs and returns the envelope; the table states the code and whether
any byte may have reached the API. Not reachable here by design: INTERNAL_ERROR (a bug),
MANIFEST_CHANGED (a race inside one read, covered by tests/manifest), and the codes the pipeline
reports (PLAN_REFUSED, the data, eval and post-training codes), tested with their stages.
"""

from __future__ import annotations

import os
import sqlite3
import time

import pytest

from api_harness import fake_api, free_port
from helpers import CANARIES, valid_manifest
from ito_assets.errors import ErrorCode
from ito_assets.control import capabilities
from ito_assets.control.capabilities import Capability

UNKNOWN_RUN = "run_" + "0" * 26
UNKNOWN_REF = "cfr_" + "0" * 26


def _train_with(api, manifest: str) -> dict:
    return api.train(api.booking(), manifest, UNKNOWN_REF, api.unique("key"))


def _confirm(api, booking: str, manifest: str | None = None) -> dict:
    return api.ito("confirm", "request", "--action", "train", "--booking", booking,
                   "--manifest", manifest or api.manifest())


def manifest_not_canonical(api):
    return _train_with(api, "relative/manifest.json")


def manifest_not_found(api):
    return _train_with(api, str(api.root / "missing.json"))


def manifest_symlink(api):
    link = api.root / api.unique("link")
    os.symlink(api.manifest(), link)
    return _train_with(api, str(link))


def manifest_not_regular(api):
    folder = api.root / api.unique("folder")
    folder.mkdir()
    return _train_with(api, str(folder))


def manifest_hard_linked(api):
    path = api.manifest()
    os.link(path, str(api.root / api.unique("hard")))
    return _train_with(api, path)


def manifest_unsafe_owner(api):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the manifest to another user")
    path = api.manifest()
    os.chown(path, 54321, 54321)
    return _train_with(api, path)


def manifest_unsafe_permissions(api):
    path = api.manifest()
    os.chmod(path, 0o666)
    return _train_with(api, path)


def manifest_too_large(api):
    return api.train(api.booking(), api.manifest(), UNKNOWN_REF, api.unique("key"), ITO_MAX_MANIFEST_BYTES="100")


def manifest_invalid(api):
    return _train_with(api, api.manifest({"schema_version": 1}))


def manifest_contains_secret(api):
    return _train_with(api, api.manifest(notes=CANARIES["github"]))


def manifest_digest_mismatch(api):
    booking = api.booking()
    ref = api.confirm_train(booking, api.manifest())
    return api.train(booking, api.manifest(name="different"), ref, api.unique("key"))


def provenance_missing(api):
    document = valid_manifest()
    del document["data"][0]["decontamination"]
    return _train_with(api, api.manifest(document))


def booking_not_found(api):
    return _confirm(api, "bkg_" + "0" * 26)


def booking_expired(api):
    booking = api.booking()
    api.ok("desk", "bookings", "amend", booking, "--start", "1000", "--end", "2000", token="desk")
    return _confirm(api, booking)


def booking_not_started(api):
    booking = api.booking()
    start = int(time.time()) + 30 * 86400  # a window a month ahead
    api.ok("desk", "bookings", "amend", booking, "--start", str(start), "--end", str(start + 3600), token="desk")
    return _confirm(api, booking)


def booking_state(verb):
    def case(api):
        booking = api.booking()
        api.ok("desk", "bookings", verb, booking, token="desk")
        return _confirm(api, booking)
    return case


def booking_incomplete(api):
    return _confirm(api, api.booking(complete=False))


def amended_after_confirmation(flag, value):
    def case(api):
        booking, manifest = api.booking(), api.manifest()
        ref = api.confirm_train(booking, manifest)
        api.ok("desk", "bookings", "amend", booking, flag, value, token="desk")
        return api.train(booking, manifest, ref, api.unique("key"))
    return case


def confirmation_invalid(api):
    booking, manifest = api.booking(), api.manifest()
    return api.train(booking, manifest, UNKNOWN_REF, api.unique("key"))


def confirmation_foreign(api):
    booking, manifest = api.booking("other"), api.manifest()
    foreign = api.confirm_train(api.booking(), manifest)
    return api.train(booking, manifest, foreign, api.unique("key"), token="other")


def confirmation_malformed(api):
    return api.train(api.booking(), api.manifest(), "ito_acct_" + "A" * 43, api.unique("key"))


def confirmation_not_approved(api):
    booking, manifest = api.booking(), api.manifest()
    return api.train(booking, manifest, api.confirm_train(booking, manifest, approve=False), api.unique("key"))


def confirmation_expired(api):
    booking, manifest = api.booking(), api.manifest()
    ref = api.confirm_train(booking, manifest)
    with sqlite3.connect(api.server.ledger_path, timeout=30) as db:
        db.execute("UPDATE confirmations SET expires_at = ? WHERE consumed_at IS NULL AND booking_id = ?",
                   (int(time.time()) - 1, booking))
    return api.train(booking, manifest, ref, api.unique("key"))


def confirmation_consumed(api):
    booking, manifest = api.booking(), api.manifest()
    ref = api.confirm_train(booking, manifest)
    assert api.train(booking, manifest, ref, api.unique("key"))["ok"]
    return api.train(booking, manifest, ref, api.unique("key"))


def confirmation_mismatch(api):
    manifest = api.manifest()
    ref = api.confirm_train(api.booking(), manifest)
    return api.train(api.booking(), manifest, ref, api.unique("key"))


def key_invalid(api):
    return api.train(api.booking(), api.manifest(), UNKNOWN_REF, "short")


def key_reused(api):
    key = api.unique("key")
    first, manifest = api.booking(), api.manifest()
    assert api.train(first, manifest, api.confirm_train(first, manifest), key)["ok"]
    second = api.booking()
    return api.train(second, manifest, api.confirm_train(second, manifest), key)


def budget_exceeded(api):
    return _confirm(api, api.booking(price=10_000))


def capacity_unavailable(api):
    booking, _run = api.started_run()
    return _confirm(api, booking)


def data_policy_violation(api):
    document = valid_manifest()
    document["data"][0]["license"] = "CC-BY-NC-4.0"
    return _confirm(api, api.booking(), api.manifest(document))


def checkpoint_storage_invalid(api):
    document = valid_manifest()
    document["checkpoint_policy"]["storage_uri"] = "file:///tmp/not-the-tenant-area"
    return _confirm(api, api.booking(), api.manifest(document))


def auth_required(api):
    return api.ito("status", UNKNOWN_RUN, token=None)


def auth_unsafe_token_file(api):
    path = api.root / api.unique("loose.token")
    path.write_text(open(api.tokens["account"]).read())
    os.chmod(path, 0o644)
    return api.ito("status", UNKNOWN_RUN, token=str(path))


def api_unreachable(api):
    return api.ito("status", UNKNOWN_RUN, ITO_API_URL=f"http://127.0.0.1:{free_port()}")


def timeout(api):
    with fake_api("silent") as url:
        return api.ito("status", UNKNOWN_RUN, ITO_API_URL=url, ITO_TIMEOUT_S="0.3")


def outcome_unknown(api):
    booking, manifest = api.booking(), api.manifest()
    ref = api.confirm_train(booking, manifest)
    with fake_api("hangup") as url:
        return api.train(booking, manifest, ref, api.unique("key"), ITO_API_URL=url)


def bare_401_from_a_proxy(api):
    with fake_api("bare401") as url:
        return api.ito("status", UNKNOWN_RUN, ITO_API_URL=url)


def run_not_found(api):
    return api.ito("status", UNKNOWN_RUN)


def run_finished(api):
    _booking, run = api.started_run()
    ref = api.ok("confirm", "request", "--action", "cancel", "--run", run)["confirmation_ref"]
    api.approve(ref)
    api.ok("cancel", run, "--confirmation-ref", ref, "--idempotency-key", api.unique("cancel"))
    return api.ito("confirm", "request", "--action", "cancel", "--run", run)


def usage_error(api):
    return api.ito("train", "--booking", "bkg_x")


CASES = [
    ("MANIFEST_PATH_NOT_CANONICAL", manifest_not_canonical, False),
    ("MANIFEST_NOT_FOUND", manifest_not_found, False),
    ("MANIFEST_SYMLINK", manifest_symlink, False),
    ("MANIFEST_NOT_REGULAR", manifest_not_regular, False),
    ("MANIFEST_HARD_LINKED", manifest_hard_linked, False),
    ("MANIFEST_UNSAFE_OWNER", manifest_unsafe_owner, False),
    ("MANIFEST_UNSAFE_PERMISSIONS", manifest_unsafe_permissions, False),
    ("MANIFEST_TOO_LARGE", manifest_too_large, False),
    ("MANIFEST_INVALID", manifest_invalid, False),
    ("MANIFEST_CONTAINS_SECRET", manifest_contains_secret, False),
    ("MANIFEST_DIGEST_MISMATCH", manifest_digest_mismatch, True),
    ("PROVENANCE_MISSING", provenance_missing, False),
    ("BOOKING_NOT_FOUND", booking_not_found, True),
    ("BOOKING_EXPIRED", booking_expired, True),
    ("BOOKING_NOT_STARTED", booking_not_started, True),
    ("BOOKING_REVOKED", booking_state("revoke"), True),
    ("BOOKING_RELEASED", booking_state("release"), True),
    ("BOOKING_INCOMPLETE", booking_incomplete, True),
    ("BOOKING_MISMATCH", amended_after_confirmation("--topology", "2x4-pcie"), True),
    ("NETWORK_MISMATCH", amended_after_confirmation("--region", "us-east"), True),
    ("CONFIRMATION_INVALID", confirmation_invalid, True),
    ("CONFIRMATION_INVALID", confirmation_foreign, True),
    ("CONFIRMATION_INVALID", confirmation_malformed, False),
    ("CONFIRMATION_NOT_APPROVED", confirmation_not_approved, True),
    ("CONFIRMATION_EXPIRED", confirmation_expired, True),
    ("CONFIRMATION_CONSUMED", confirmation_consumed, True),
    ("CONFIRMATION_MISMATCH", confirmation_mismatch, True),
    ("IDEMPOTENCY_KEY_INVALID", key_invalid, False),
    ("IDEMPOTENCY_KEY_REUSED", key_reused, True),
    ("BUDGET_EXCEEDED", budget_exceeded, True),
    ("CAPACITY_UNAVAILABLE", capacity_unavailable, True),
    ("DATA_POLICY_VIOLATION", data_policy_violation, True),
    ("CHECKPOINT_STORAGE_INVALID", checkpoint_storage_invalid, True),
    ("AUTH_REQUIRED", auth_required, False),
    ("AUTH_REQUIRED", auth_unsafe_token_file, False),
    ("API_UNREACHABLE", api_unreachable, False),
    ("TIMEOUT", timeout, True),
    ("OUTCOME_UNKNOWN", outcome_unknown, True),
    ("CREDENTIAL_REVOKED", bare_401_from_a_proxy, True),
    ("RUN_NOT_FOUND", run_not_found, True),
    ("RUN_FINISHED", run_finished, True),
    ("USAGE_ERROR", usage_error, False),
]


@pytest.mark.parametrize("code, case, contacted", CASES, ids=[f"{c}-{f.__name__}" for c, f, _ in CASES])
def test_error_code_through_the_client(api, code, case, contacted) -> None:
    document = case(api)
    assert document["ok"] is False, document
    assert document["error"]["code"] == code, document["error"]
    assert document["live_api_contacted"] is contacted
    assert set(document["error"]) == {"code", "message", "retryable"}


def test_credential_revoked(api) -> None:
    token_file = api.root / api.unique("soon-revoked.token")
    data = api.ok("desk", "tokens", "issue", "--account", api.accounts["account"], "--out", str(token_file),
                  token="desk")
    assert api.ok("readiness", token=str(token_file))["ready"]
    api.ok("desk", "tokens", "revoke", data["token_id"], token="desk")
    document = api.ito("status", UNKNOWN_RUN, token=str(token_file))
    assert document["error"]["code"] == "CREDENTIAL_REVOKED" and document["live_api_contacted"] is True


def test_capability_missing_fails_closed_before_any_credential(api, monkeypatch) -> None:
    extra = Capability("teleport", "lifecycle", "teleport", "POST /v1/teleport")
    monkeypatch.setattr(capabilities, "CAPABILITIES", (*capabilities.CAPABILITIES, extra))
    document = api.train("bkg_x", "/nonexistent", UNKNOWN_REF, "some-key-0001", token=str(api.root / "no-such-file"))
    assert document["error"]["code"] == "CAPABILITY_MISSING" and document["live_api_contacted"] is False


# The codes of the client's contract that a client call can reach; pipeline codes and those no
# client call can reach are tested elsewhere (see the module docstring).
CLIENT_CONTRACT_CODES = {
    "MANIFEST_PATH_NOT_CANONICAL", "MANIFEST_NOT_FOUND", "MANIFEST_SYMLINK", "MANIFEST_NOT_REGULAR",
    "MANIFEST_HARD_LINKED", "MANIFEST_UNSAFE_OWNER", "MANIFEST_UNSAFE_PERMISSIONS", "MANIFEST_TOO_LARGE",
    "MANIFEST_INVALID", "MANIFEST_CONTAINS_SECRET", "MANIFEST_DIGEST_MISMATCH", "PROVENANCE_MISSING",
    "BOOKING_NOT_FOUND", "BOOKING_EXPIRED", "BOOKING_NOT_STARTED", "BOOKING_REVOKED", "BOOKING_RELEASED", "BOOKING_INCOMPLETE",
    "BOOKING_MISMATCH", "CONFIRMATION_INVALID", "CONFIRMATION_NOT_APPROVED", "CONFIRMATION_EXPIRED",
    "CONFIRMATION_CONSUMED", "CONFIRMATION_MISMATCH", "IDEMPOTENCY_KEY_INVALID", "IDEMPOTENCY_KEY_REUSED",
    "IDEMPOTENCY_KEY_IN_FLIGHT", "BUDGET_EXCEEDED", "CAPACITY_UNAVAILABLE", "NETWORK_MISMATCH",
    "DATA_POLICY_VIOLATION", "CHECKPOINT_STORAGE_INVALID", "AUTH_REQUIRED", "CREDENTIAL_REVOKED",
    "API_UNREACHABLE", "TIMEOUT", "OUTCOME_UNKNOWN", "RUN_NOT_FOUND", "RUN_FINISHED", "CAPABILITY_MISSING",
    "USAGE_ERROR",
}


def test_every_client_contract_code_has_a_case() -> None:
    covered = {code for code, _case, _ in CASES} | {"CREDENTIAL_REVOKED", "CAPABILITY_MISSING",
                                                     "IDEMPOTENCY_KEY_IN_FLIGHT"}  # test_races.py
    assert CLIENT_CONTRACT_CODES - covered == set()
    assert CLIENT_CONTRACT_CODES <= {c.value for c in ErrorCode}


# Booking ids at and past the audit subject's width (128) up to the body's bound (256), and one past
# that: the gate's BOOKING_NOT_FOUND, then the body's USAGE_ERROR; the same on PostgreSQL
# (test_postgres_server.py), where 129..256 characters were once a 500.
LONG_BOOKING_IDS = [(128, "BOOKING_NOT_FOUND"), (129, "BOOKING_NOT_FOUND"), (256, "BOOKING_NOT_FOUND"),
                    (257, "USAGE_ERROR")]


def refused_train_codes(api) -> list[str]:
    booking, manifest = api.booking(), api.manifest()
    ref = api.confirm_train(booking, manifest)
    ids = ["bkg_" + "x" * (n - 4) for n, _ in LONG_BOOKING_IDS] + ["bkg_" + "0" * 25 + "\u0430", "bkg_\t" + "0" * 25]
    codes = [api.train(booking_id, manifest, ref, api.unique("odd-bkg"))["error"]["code"] for booking_id in ids]
    assert api.train(booking, manifest, ref, api.unique("odd-bkg"))["ok"]  # nothing was consumed
    return codes


def test_odd_and_long_booking_ids_are_not_found_never_a_500(api) -> None:
    assert refused_train_codes(api) == [code for _, code in LONG_BOOKING_IDS] + ["BOOKING_NOT_FOUND"] * 2
