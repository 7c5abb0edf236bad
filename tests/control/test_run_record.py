"""What a created run leaves in the ledger, field for field: the run row, its reserved key, the
consumed confirmation, the stored manifest and the audit event an auditor reads. Also the request
fingerprint the client and the server must compute alike, since a retry looks a run up by it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gate_world import COST, T0, manifest_bytes, verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, bookings, create_run, idempotency
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.fingerprint import request_fingerprint
from ito_assets.control.ledger import confirmations

KEY = "key-record-0001"


def request_for(world, ref: str, key: str = KEY, manifest=None, booking_id: str | None = None) -> TrainRequest:
    return TrainRequest(booking_id=booking_id or world.booking_id, verified=manifest or verified(),
                        confirmation_ref=ref, idempotency_key=key)


def test_the_server_fingerprint_is_the_one_the_client_computes(world) -> None:
    request = request_for(world, "cfr_" + "0" * 26)
    client_side = request_fingerprint("train", booking_id=world.booking_id, manifest_digest=verified().digest)
    assert request.fingerprint() == client_side


@pytest.mark.parametrize("changed", ["action", "booking", "digest"])
def test_every_part_of_a_request_moves_its_fingerprint(changed) -> None:
    parts = {"action": "train", "booking_id": "bkg_a", "manifest_digest": "sha256:" + "a" * 64}
    other = dict(parts)
    if changed == "action":
        other["action"] = "cancel"
    elif changed == "booking":
        other["booking_id"] = "bkg_b"
    else:
        other["manifest_digest"] = "sha256:" + "b" * 64
    fingerprint = request_fingerprint(parts.pop("action"), **parts)
    assert fingerprint != request_fingerprint(other.pop("action"), **other)
    assert len(fingerprint) == 64 and int(fingerprint, 16) >= 0


def test_a_created_run_records_its_key_confirmation_and_audit_event_exactly(world) -> None:
    ref = world.confirm_train()
    created = create_run.create_run(world.ledger, world.policy, world.account, request_for(world, ref))
    run = created.run
    with world.ledger.read() as conn:
        record = idempotency.lookup(conn, world.account.account_id, KEY)
        consumed = conn.execute(sa.select(confirmations)).mappings().one()
    assert (record.action, record.run_id, record.fingerprint, record.created_at) == (
        "train", run.run_id, request_for(world, ref).fingerprint(), T0)
    assert (consumed["consumed_at"], consumed["consumed_by_run"], consumed["consumed_by_key"]) == (T0, run.run_id, KEY)
    event = [e for e in audit.events(world.ledger, limit=10_000) if e.kind == "run_created"]
    assert len(event) == 1
    assert (event[0].actor, event[0].account_id, event[0].subject, event[0].at) == (
        None, world.account.account_id, run.run_id, T0)
    assert event[0].detail == {
        "booking_id": world.booking_id, "manifest_digest": verified().digest, "idempotency_key": KEY,
        "confirmation_id": consumed["confirmation_id"], "cost_cents": COST,
    }


def test_the_same_key_on_another_booking_is_another_request(world) -> None:
    create_run.create_run(world.ledger, world.policy, world.account, request_for(world, world.confirm_train()))
    world.booking_id = world.booking()
    fresh = world.confirm_train()
    with pytest.raises(ItoError) as info:
        create_run.create_run(world.ledger, world.policy, world.account, request_for(world, fresh))
    assert info.value.code is ErrorCode.IDEMPOTENCY_KEY_REUSED


def test_the_same_key_under_another_account_is_that_accounts_own(world) -> None:
    """Keys are unique per account: a rival's use of the same key neither replays nor blocks."""
    mine = create_run.create_run(world.ledger, world.policy, world.account, request_for(world, world.confirm_train()))
    their_booking = world.booking(account=world.other)
    theirs_manifest = verified(manifest_bytes(name="the-rivals-manifest"))
    theirs = create_run.create_run(world.ledger, world.policy, world.other, request_for(
        world, world.confirm_train(booking_id=their_booking, manifest=theirs_manifest, account=world.other),
        manifest=theirs_manifest, booking_id=their_booking))
    assert not theirs.replayed and theirs.run.run_id != mine.run.run_id
    assert theirs.run.account_id == world.other.account_id


# --- a twin that lost the race --------------------------------------------------------------------

class _DriverError(Exception):
    pass


@pytest.mark.parametrize("raised", [
    sa.exc.IntegrityError("INSERT", {}, _DriverError("UNIQUE constraint failed: idempotency_keys.key")),
    sa.exc.OperationalError("BEGIN", {}, _DriverError("database is locked")),
])
def test_a_lost_race_with_no_winner_yet_is_in_flight_and_never_a_second_run(world, monkeypatch, raised) -> None:
    def lose(*_args, **_kwargs):
        raise raised
    monkeypatch.setattr(create_run, "_create_locked", lose)
    with pytest.raises(ItoError) as info:
        create_run.create_run(world.ledger, world.policy, world.account, request_for(world, world.confirm_train()))
    assert info.value.code is ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT


def test_a_database_failure_that_is_no_lock_timeout_is_not_disguised(world, monkeypatch) -> None:
    def fail(*_args, **_kwargs):
        raise sa.exc.OperationalError("INSERT", {}, _DriverError("disk I/O error"))
    monkeypatch.setattr(create_run, "_create_locked", fail)
    with pytest.raises(sa.exc.OperationalError):
        create_run.create_run(world.ledger, world.policy, world.account, request_for(world, world.confirm_train()))


def test_a_lost_race_answers_from_the_winners_committed_key(world) -> None:
    ref = world.confirm_train()
    winner = create_run.create_run(world.ledger, world.policy, world.account, request_for(world, ref))
    request = request_for(world, ref)
    replay = create_run._replay_after_race(world.ledger, world.account.account_id, KEY, request.fingerprint())
    assert replay.replayed and replay.run.run_id == winner.run.run_id
    with pytest.raises(ItoError) as info:
        create_run._replay_after_race(world.ledger, world.account.account_id, KEY, "0" * 64)
    assert info.value.code is ErrorCode.IDEMPOTENCY_KEY_REUSED


def test_a_retry_replays_its_run_even_after_the_booking_ended(world) -> None:
    """The answer to a lost response is the run already created, whatever became of the booking
    since: the replay is read before any gate is checked again."""
    ref = world.confirm_train()
    first = create_run.create_run(world.ledger, world.policy, world.account, request_for(world, ref))
    bookings.transition(world.ledger, world.booking_id, "revoke", actor=None)
    again = create_run.create_run(world.ledger, world.policy, world.account, request_for(world, ref))
    assert again.replayed and again.run.run_id == first.run.run_id


@pytest.mark.parametrize("raised", [
    sa.exc.IntegrityError("INSERT", {}, _DriverError("UNIQUE constraint failed")),
    sa.exc.OperationalError("BEGIN", {}, _DriverError("database is locked")),
], ids=["unique_violation", "lock_timeout"])
def test_a_twin_that_loses_the_race_after_the_winner_committed_answers_with_the_winners_run(
        world, monkeypatch, raised) -> None:
    """The loser's first read ran before the winner committed (seen as no key), then its insert
    hit the unique key: it answers from the winner's committed key, never a second run."""
    ref = world.confirm_train()
    winner = create_run.create_run(world.ledger, world.policy, world.account, request_for(world, ref))
    real_replay = create_run._replay
    reads = []

    def first_read_misses(conn, account_id, key, fingerprint):
        reads.append(key)
        return None if len(reads) == 1 else real_replay(conn, account_id, key, fingerprint)

    def lose(*_args, **_kwargs):
        raise raised

    monkeypatch.setattr(create_run, "_replay", first_read_misses)
    monkeypatch.setattr(create_run, "_create_locked", lose)
    loser = create_run.create_run(world.ledger, world.policy, world.account, request_for(world, ref))
    assert loser.replayed and loser.run.run_id == winner.run.run_id and reads == [KEY, KEY]
