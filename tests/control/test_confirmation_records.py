"""What a confirmation binds and records, exactly: the binding a human reads before approving, the
audit events with their actors, single use of the stored row, the scope of every request to the
caller's own account; and the idempotency records a retry depends on."""

from __future__ import annotations

import hashlib
import json

import pytest
import sqlalchemy as sa

from gate_world import COST, TERMS, T0, verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, confirm_request, confirmations, create_run, idempotency
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.fingerprint import request_fingerprint, validate_key
from ito_assets.control.policy import DEFAULT_CONFIRMATION_TTL_S
from ito_assets.control.states import Action


def events_of(world, kind: str) -> list[audit.AuditEvent]:
    return [e for e in audit.events(world.ledger, limit=10_000) if e.kind == kind]


def test_the_binding_a_desk_reads_is_every_term_exactly(world) -> None:
    issued = confirm_request.request_train(world.ledger, world.policy, world.account, world.booking_id, verified())
    binding = confirmations.show(world.ledger, issued.ref).binding()
    eligibility = {"account_id": world.account.account_id, "booking_id": world.booking_id, "booking_revision": 1,
                   "gpu_type": "H100", "num_gpus": 8, "num_nodes": 1, "topology": "1x8-nvlink",
                   "region": "eu-west", "network": "ib-400g", "starts_at": TERMS["starts_at"],
                   "ends_at": TERMS["ends_at"], "duration_s": TERMS["ends_at"] - TERMS["starts_at"]}
    assert binding == {
        "confirmation_id": issued.confirmation.confirmation_id, "account_id": world.account.account_id,
        "action": "train", "booking_id": world.booking_id, "booking_revision": 1,
        "manifest_digest": verified().digest, "run_id": None, "cost_cents": COST, "eligibility": eligibility,
        "created_at": T0, "expires_at": T0 + DEFAULT_CONFIRMATION_TTL_S, "approved": False, "consumed": False,
    }
    world.approve(issued.ref, COST)
    assert confirmations.show(world.ledger, issued.ref).binding()["approved"] is True


def test_requesting_and_approving_are_audited_with_who_and_what(world) -> None:
    issued = confirm_request.request_train(world.ledger, world.policy, world.account, world.booking_id, verified())
    world.approve(issued.ref, COST)
    [requested], [approved] = events_of(world, "confirmation_requested"), events_of(world, "confirmation_approved")
    assert (requested.actor, requested.account_id, requested.subject) == (
        world.account.token_id, world.account.account_id, issued.confirmation.confirmation_id)
    assert requested.detail == {"action": "train", "booking_id": world.booking_id,
                                "manifest_digest": verified().digest, "run_id": None, "cost_cents": COST,
                                "expires_at": T0 + DEFAULT_CONFIRMATION_TTL_S}
    assert (approved.actor, approved.account_id, approved.subject, approved.detail) == (
        world.desk.token_id, world.account.account_id, issued.confirmation.confirmation_id,
        {"action": "train", "cost_cents": COST})
    assert issued.confirmation.confirmation_id.startswith("cfm_")
    stored = confirmations.show(world.ledger, issued.ref)
    assert (stored.approved_by, stored.approved_at) == (world.desk.token_id, T0)
    world.approve(issued.ref, COST)  # approving again changes nothing and audits nothing
    assert len(events_of(world, "confirmation_approved")) == 1


def test_approval_is_refused_from_the_second_of_expiry(world) -> None:
    issued = confirm_request.request_train(world.ledger, world.policy, world.account, world.booking_id, verified())
    world.clock.now = T0 + DEFAULT_CONFIRMATION_TTL_S - 1
    world.approve(issued.ref, COST)
    late = confirm_request.request_train(world.ledger, world.policy, world.account, world.booking_id, verified())
    world.clock.now += DEFAULT_CONFIRMATION_TTL_S
    with pytest.raises(ItoError) as info:
        world.approve(late.ref, COST)
    assert info.value.code is ErrorCode.CONFIRMATION_EXPIRED
    assert confirmations.show(world.ledger, late.ref).approved_at is None


def test_a_request_that_needs_another_network_is_refused_before_a_confirmation(world) -> None:
    from ito_assets.control.validation import RunRequirements

    with pytest.raises(ItoError) as info:
        confirm_request.request_train(world.ledger, world.policy, world.account, world.booking_id, verified(),
                                      RunRequirements(region="us-east"))
    assert info.value.code is ErrorCode.NETWORK_MISMATCH
    assert not events_of(world, "confirmation_requested")


def test_cancel_release_and_cleanup_confirmations_bind_their_own_terms(world) -> None:
    run = create_run.create_run(world.ledger, world.policy, world.account, TrainRequest(
        booking_id=world.booking_id, verified=verified(), confirmation_ref=world.confirm_train(),
        idempotency_key="key-binding-01")).run
    cancel = confirm_request.request_cancel(world.ledger, world.policy, world.account, run.run_id).confirmation
    release = confirm_request.request_release(world.ledger, world.policy, world.account, world.booking_id).confirmation
    cleanup = confirm_request.request_cleanup(world.ledger, world.policy, world.account).confirmation
    assert (cancel.action, cancel.booking_id, cancel.target_run_id, cancel.manifest_digest, cancel.cost_cents) == (
        Action.CANCEL, world.booking_id, run.run_id, verified().digest, 0)
    assert (release.action, release.booking_id, release.booking_revision, release.cost_cents) == (
        Action.RELEASE, world.booking_id, 1, 0)
    assert json.loads(release.eligibility)["booking_id"] == world.booking_id
    assert (cleanup.action, cleanup.booking_id, cleanup.target_run_id, cleanup.cost_cents) == (
        Action.CLEANUP, None, None, 0)
    assert cleanup.binding()["eligibility"] is None and cancel.binding()["eligibility"] is None
    runs_named = {e.detail["action"]: e.detail["run_id"] for e in events_of(world, "confirmation_requested")}
    assert runs_named == {"train": None, "cancel": run.run_id, "release": None, "cleanup": None}
    actors = {e.detail["action"]: e.actor for e in events_of(world, "confirmation_requested")}
    assert actors == {"train": world.account.token_id, "cancel": world.account.token_id,
                      "release": world.account.token_id, "cleanup": world.account.token_id}


def test_another_accounts_run_cannot_be_confirmed_for_cancellation(world) -> None:
    run = create_run.create_run(world.ledger, world.policy, world.account, TrainRequest(
        booking_id=world.booking_id, verified=verified(), confirmation_ref=world.confirm_train(),
        idempotency_key="key-foreign-01")).run
    with pytest.raises(ItoError) as info:
        confirm_request.request_cancel(world.ledger, world.policy, world.other, run.run_id)
    assert info.value.code is ErrorCode.RUN_NOT_FOUND
    assert not [e for e in events_of(world, "confirmation_requested") if e.detail["action"] == "cancel"]


def test_a_stored_confirmation_is_consumed_once_even_when_read_before_its_first_use(world) -> None:
    ref = world.confirm_train()
    with world.ledger.read() as conn:
        stale = confirmations.resolve(conn, ref, account_id=world.account.account_id)
    with world.ledger.write() as conn:
        confirmations.consume(conn, stale, now=T0, run_id="run_first", key="key-first-0001")
    with pytest.raises(ItoError) as info, world.ledger.write() as conn:
        confirmations.consume(conn, stale, now=T0 + 1, run_id="run_second", key="key-second-001")
    assert info.value.code is ErrorCode.CONFIRMATION_CONSUMED
    with world.ledger.read() as conn:
        again = confirmations.resolve(conn, ref, account_id=None)
    assert (again.consumed_at, again.consumed_by_run, again.consumed_by_key) == (T0, "run_first", "key-first-0001")


def test_the_desk_sees_every_accounts_confirmation_and_an_account_only_its_own(world) -> None:
    ref = world.confirm_train(approve=False)
    assert confirmations.show(world.ledger, ref).account_id == world.account.account_id
    with world.ledger.read() as conn:
        with pytest.raises(ItoError) as info:
            confirmations.resolve(conn, ref, account_id=world.other.account_id)
    assert info.value.code is ErrorCode.CONFIRMATION_INVALID


# --- idempotency records ---------------------------------------------------------------------------

def test_the_fingerprint_is_a_stable_canonical_hash() -> None:
    """Fingerprints are stored with each key and compared on every retry: a change of their form
    (key order, separators, field names) would refuse every retry of an existing key."""
    got = request_fingerprint("train", manifest_digest="sha256:" + "a" * 64, booking_id="bkg_1")
    canonical = '{"action":"train","booking_id":"bkg_1","manifest_digest":"sha256:' + "a" * 64 + '"}'
    assert got == hashlib.sha256(canonical.encode()).hexdigest()


def test_a_key_record_keeps_its_result_as_canonical_json(ledger) -> None:
    with ledger.write() as conn:
        idempotency.reserve(conn, account_id="acct_a", key="key-result-01", action="cleanup", fingerprint="f" * 64,
                            run_id=None, now=T0, result={"b": 1, "a": [2, 3]})
        idempotency.reserve(conn, account_id="acct_a", key="key-noresult1", action="train", fingerprint="e" * 64,
                            run_id="run_x", now=T0)
    with ledger.read() as conn:
        raw = conn.execute(sa.text("SELECT result FROM idempotency_keys WHERE key = 'key-result-01'")).scalar_one()
        with_result = idempotency.lookup(conn, "acct_a", "key-result-01")
        without = idempotency.lookup(conn, "acct_a", "key-noresult1")
        foreign = idempotency.lookup(conn, "acct_b", "key-result-01")
    assert raw == '{"a": [2, 3], "b": 1}'
    assert (with_result.result, with_result.action, with_result.run_id, with_result.created_at) == (
        {"a": [2, 3], "b": 1}, "cleanup", None, T0)
    assert (without.result, without.run_id) == (None, "run_x")
    assert foreign is None
    with ledger.read() as conn:
        assert conn.execute(sa.text("SELECT result FROM idempotency_keys WHERE key = 'key-noresult1'")).scalar_one() is None
    with ledger.write() as conn:
        idempotency.reserve(conn, account_id="acct_b", key="key-noresult1", action="train", fingerprint="d" * 64,
                            run_id="run_y", now=T0)
        idempotency.store_result(conn, "acct_a", "key-noresult1", {"z": 0, "y": "done"})
    with ledger.read() as conn:
        stored = conn.execute(sa.text("SELECT result FROM idempotency_keys WHERE key = 'key-noresult1' "
                                      "AND account_id = 'acct_a'")).scalar_one()
        untouched = idempotency.lookup(conn, "acct_a", "key-result-01").result
        other_account = idempotency.lookup(conn, "acct_b", "key-noresult1").result
    assert stored == '{"y": "done", "z": 0}' and untouched == {"a": [2, 3], "b": 1}
    assert other_account is None  # the same key of another account is another record


class _Orig(Exception):
    def __init__(self, text: str, sqlstate: str | None = None):
        super().__init__(text)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(("orig", "timeout"), [
    (_Orig("canceling statement due to lock timeout", "55P03"), True),   # PostgreSQL lock_timeout
    (_Orig("database is locked"), True),                                 # SQLite busy timeout
    (_Orig("Database Is Busy"), True),
    (_Orig("deadlock detected", "40P01"), False),
    (_Orig("no such table: runs"), False),
    (_Orig("could not serialize access", "40001"), False),
])
def test_only_lock_timeouts_are_answered_as_in_flight(orig, timeout) -> None:
    wrapped = sa.exc.OperationalError("statement", {}, orig)
    assert idempotency.is_lock_timeout(wrapped) is timeout


def test_a_plain_error_without_a_driver_cause_is_read_from_its_own_text() -> None:
    assert idempotency.is_lock_timeout(RuntimeError("database is locked")) is True
    assert idempotency.is_lock_timeout(RuntimeError("disk I/O error")) is False


def test_in_flight_is_retryable_with_the_same_key() -> None:
    error = idempotency.in_flight()
    assert error.code is ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT and error.retryable is True
    assert "same key" in error.message


@pytest.mark.parametrize(("key", "valid"), [
    ("k" * 7, False), ("k" * 8, True),            # 8-128 characters
    ("k" * 128, True), ("k" * 129, False),
    ("run-2026.12.01:a_b", True),                 # every allowed punctuation mark
    ("-leading-dash", True), ("_leading-underscore", True),  # token_urlsafe may start with either
    (".leading-dot", False), (":leading-colon", False),
    ("key/with/slash", False), ("kéy-accented", False),
    ("ito_looks_like_a_token", False), ("cfr_looks_like_a_ref", False),
    ("ghp_" + "A1b2" * 9, False),                 # a credential pattern is never a key
])
def test_an_idempotency_key_at_each_edge(key, valid) -> None:
    if valid:
        assert validate_key(key) == key
    else:
        with pytest.raises(ItoError) as info:
            validate_key(key)
        assert info.value.code is ErrorCode.IDEMPOTENCY_KEY_INVALID and key not in info.value.message
