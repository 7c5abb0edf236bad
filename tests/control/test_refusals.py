"""Every gate of `create_run` refuses before any side effect: no run, no reserved key, no stored
manifest, no consumed confirmation; only the refusal itself is audited, with its code."""

from __future__ import annotations

import sqlalchemy as sa
import pytest

from gate_world import TERMS, T0, manifest_bytes, verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, bookings, confirm_request, create_run
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.ledger import confirmations, idempotency_keys, manifests, runs
from ito_assets.control.policy import DEFAULT_CONFIRMATION_TTL_S

UNKNOWN_REF = "cfr_" + "0" * 26


def side_effects(world) -> dict[str, int]:
    with world.ledger.read() as conn:
        def count(table, *where) -> int:
            return conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one()
        return {"runs": count(runs), "keys": count(idempotency_keys), "manifests": count(manifests),
                "consumed": count(confirmations, confirmations.c.consumed_at.is_not(None))}


def train(world, ref: str, *, key: str = "key-refused-01", manifest=None, booking_id: str | None = None):
    request = TrainRequest(booking_id=booking_id or world.booking_id, verified=manifest or verified(),
                           confirmation_ref=ref, idempotency_key=key)
    return create_run.create_run(world.ledger, world.policy, world.account, request)


# Each case: (what to do to the world after an approved confirmation, how to call train) -> code.
def revoke_booking(world, ref):
    bookings.transition(world.ledger, world.booking_id, "revoke", actor=None)
    return lambda: train(world, ref)


def booking_ends(world, ref):
    world.clock.now = TERMS["ends_at"]  # exactly the end: expired
    return lambda: train(world, ref)


def foreign_booking(world, ref):
    theirs = world.booking(account=world.other)
    return lambda: train(world, ref, booking_id=theirs)


def amend_booking(world, ref):
    bookings.amend(world.ledger, world.booking_id, {"topology": "2x4-pcie"}, actor=world.desk.token_id)
    return lambda: train(world, ref)


def other_manifest(world, ref):
    return lambda: train(world, ref, manifest=verified(manifest_bytes(name="not-the-confirmed-one")))


def unknown_reference(world, ref):
    return lambda: train(world, UNKNOWN_REF)


def unapproved(world, ref):
    return lambda: train(world, world.confirm_train(approve=False))


def confirmation_expires(world, ref):
    world.clock.now = T0 + DEFAULT_CONFIRMATION_TTL_S  # exactly the expiry: expired
    return lambda: train(world, ref)


def malformed_key(world, ref):
    return lambda: train(world, ref, key="has space")


def capacity_taken(world, ref):
    train(world, world.confirm_train(), key="key-occupant-1")  # the booking's one concurrent run
    return lambda: train(world, ref)


def key_reused(world, ref):
    """The key already created a run for another manifest: found before the write transaction."""
    train(world, world.confirm_train(manifest=verified(manifest_bytes(name="the-first-use"))),
          manifest=verified(manifest_bytes(name="the-first-use")))
    return lambda: train(world, ref)


CASES = [
    (revoke_booking, ErrorCode.BOOKING_REVOKED),
    (booking_ends, ErrorCode.BOOKING_EXPIRED),
    (foreign_booking, ErrorCode.BOOKING_NOT_FOUND),
    (amend_booking, ErrorCode.BOOKING_MISMATCH),
    (other_manifest, ErrorCode.MANIFEST_DIGEST_MISMATCH),
    (unknown_reference, ErrorCode.CONFIRMATION_INVALID),
    (unapproved, ErrorCode.CONFIRMATION_NOT_APPROVED),
    (confirmation_expires, ErrorCode.CONFIRMATION_EXPIRED),
    (malformed_key, ErrorCode.IDEMPOTENCY_KEY_INVALID),
    (capacity_taken, ErrorCode.CAPACITY_UNAVAILABLE),
    (key_reused, ErrorCode.IDEMPOTENCY_KEY_REUSED),
]


@pytest.mark.parametrize(("make", "code"), CASES, ids=[make.__name__ for make, _ in CASES])
def test_a_refused_train_changes_nothing_but_the_audit_trail(world, make, code) -> None:
    ref = world.confirm_train()
    call = make(world, ref)
    before = side_effects(world)
    with pytest.raises(ItoError) as info:
        call()
    assert info.value.code is code
    assert side_effects(world) == before
    last = audit.events(world.ledger, limit=10_000)[-1]
    if code is not ErrorCode.IDEMPOTENCY_KEY_INVALID:  # refused before the ledger is read at all
        assert (last.kind, last.code, last.account_id, last.actor) == (
            "run_refused", code.value, world.account.account_id, world.account.token_id)
        assert last.subject.startswith("bkg_")
        assert set(last.detail) == {"manifest_digest", "idempotency_key"}
        assert last.detail["idempotency_key"] == "key-refused-01" and last.detail["manifest_digest"].startswith("sha256:")
    assert ref not in str(last.detail)


def test_a_reused_key_found_after_a_lost_race_is_audited_and_in_flight_is_not(world, monkeypatch) -> None:
    """The other two places a key's answer is found: after the write transaction lost the race
    for it (the key differs: refused and audited) or before the winner committed (in flight: no
    answer yet, nothing audited)."""
    ref = world.confirm_train()
    first = verified(manifest_bytes(name="the-first-use"))
    train(world, world.confirm_train(manifest=first), manifest=first)
    real_lookup = create_run.idempotency.lookup
    seen = []

    def lookup_misses_once(conn, account_id, key):  # the twin had not committed at the first look
        seen.append(key)
        return None if len(seen) == 1 else real_lookup(conn, account_id, key)

    def loses_the_race(*args, **kwargs):
        raise sa.exc.IntegrityError("INSERT INTO idempotency_keys", {}, Exception("unique violation"))

    monkeypatch.setattr(create_run.idempotency, "lookup", lookup_misses_once)
    monkeypatch.setattr(create_run, "_create_locked", loses_the_race)
    with pytest.raises(ItoError) as reused:
        train(world, ref)
    assert reused.value.code is ErrorCode.IDEMPOTENCY_KEY_REUSED
    last = audit.events(world.ledger, limit=10_000)[-1]
    assert (last.kind, last.code, last.detail["idempotency_key"]) == ("run_refused", "IDEMPOTENCY_KEY_REUSED", "key-refused-01")

    monkeypatch.setattr(create_run.idempotency, "lookup", lambda conn, account_id, key: None)
    before = len(audit.events(world.ledger, limit=10_000))
    with pytest.raises(ItoError) as waiting:
        train(world, ref, key="key-in-flight-1")
    assert waiting.value.code is ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT
    assert len(audit.events(world.ledger, limit=10_000)) == before


def test_the_refusal_event_names_the_booking_and_manifest_that_were_refused(world) -> None:
    ref = world.confirm_train()
    other = verified(manifest_bytes(name="not-the-confirmed-one"))
    with pytest.raises(ItoError):
        train(world, ref, manifest=other)
    last = audit.events(world.ledger, limit=10_000)[-1]
    assert (last.subject, last.detail) == (world.booking_id, {"manifest_digest": other.digest,
                                                             "idempotency_key": "key-refused-01"})


def test_just_inside_every_time_bound_the_same_confirmation_creates_the_run(world) -> None:
    """The other side of the two time bounds above: one second before the booking's end and the
    confirmation's expiry, the same approved confirmation still creates exactly one run."""
    ref = world.confirm_train()
    world.clock.now = min(TERMS["ends_at"], T0 + DEFAULT_CONFIRMATION_TTL_S) - 1
    created = train(world, ref)
    assert created.run.state.value == "queued" and side_effects(world)["runs"] == 1


# --- booking ids not in the ledger's form: BOOKING_NOT_FOUND, and never written to the audit ------

ODD_BOOKING_IDS = {
    "128 chars": "bkg_" + "x" * 124,     # the audit subject's width: still not a booking id
    "129 chars": "bkg_" + "x" * 125,     # one past it: overflowed the subject on PostgreSQL (500)
    "256 chars": "bkg_" + "x" * 252,     # the body's bound for an id
    "25 chars body": "bkg_" + "0" * 25,  # one short of the form
    "27 chars body": "bkg_" + "0" * 27,  # one past it
    "upper case": "BKG_" + "0" * 26,
    "outside the alphabet": "bkg_" + "u" * 26,
    "newline": "bkg_" + "0" * 25 + "\n",
    "sql": "bkg_' OR '1'='1" + "0" * 11,
    "unicode": "bkg_" + "\u0430" * 26,   # Cyrillic a: looks like the alphabet, is not
    "empty": "",
}


@pytest.mark.parametrize("booking_id", ODD_BOOKING_IDS.values(), ids=ODD_BOOKING_IDS.keys())
def test_a_booking_id_not_in_the_ledgers_form_is_not_found_and_stays_out_of_the_audit(world, booking_id) -> None:

    manifest = verified()
    ref = world.confirm_train(manifest=manifest)
    with pytest.raises(ItoError) as confirm:
        confirm_request.request_train(world.ledger, world.policy, world.account, booking_id, manifest)
    request = create_run.TrainRequest(booking_id=booking_id, verified=manifest, confirmation_ref=ref,
                                      idempotency_key="key-odd-booking")
    with pytest.raises(ItoError) as train:
        create_run.create_run(world.ledger, world.policy, world.account, request)
    assert (confirm.value.code, train.value.code) == (ErrorCode.BOOKING_NOT_FOUND, ErrorCode.BOOKING_NOT_FOUND)
    refusals = [e for e in audit.events(world.ledger, limit=1000) if e.kind == "run_refused"]
    assert [(e.code, e.subject) for e in refusals] == [("BOOKING_NOT_FOUND", None)]
    assert booking_id not in str(refusals[0].detail) or booking_id == ""


def test_a_refused_train_on_a_well_formed_booking_id_keeps_it_as_the_subject(world) -> None:

    manifest = verified()
    unknown = "bkg_" + "0" * 26
    request = create_run.TrainRequest(booking_id=unknown, verified=manifest,
                                      confirmation_ref=world.confirm_train(manifest=manifest),
                                      idempotency_key="key-unknown-bkg")
    with pytest.raises(ItoError) as train:
        create_run.create_run(world.ledger, world.policy, world.account, request)
    assert train.value.code is ErrorCode.BOOKING_NOT_FOUND
    assert [(e.code, e.subject) for e in audit.events(world.ledger, limit=1000)
            if e.kind == "run_refused"] == [("BOOKING_NOT_FOUND", unknown)]
