"""Gate 3: a confirmation is single-use, short-lived, approved by the desk and bound to account,
action, booking, manifest digest and cost; each failure has its own code."""

from __future__ import annotations

import sqlalchemy as sa
import pytest

from gate_world import COST, T0, manifest_bytes, verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import bookings, confirmations, confirm_request, create_run, ids
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.ledger import confirmations as confirmations_table
from ito_assets.control.policy import DEFAULT_CONFIRMATION_TTL_S


def train(world, ref: str, key: str = "key-00000001", *, manifest=None, booking_id=None, account=None):
    request = TrainRequest(booking_id=booking_id or world.booking_id, verified=manifest or verified(),
                           confirmation_ref=ref, idempotency_key=key)
    return create_run.create_run(world.ledger, world.policy, account or world.account, request)


def code_of(call) -> ErrorCode:
    with pytest.raises(ItoError) as info:
        call()
    return info.value.code


def test_reference_is_opaque_stored_hashed_and_priced(world) -> None:
    issued = confirm_request.request_train(world.ledger, world.policy, world.account, world.booking_id, verified())
    assert ids.is_confirmation_ref(issued.ref) and issued.ref not in repr(issued)
    assert issued.confirmation.cost_cents == COST
    assert issued.confirmation.expires_at == T0 + DEFAULT_CONFIRMATION_TTL_S
    with world.ledger.read() as conn:
        stored = conn.execute(sa.select(confirmations_table.c.ref_hash)).scalars().all()
    assert issued.ref not in stored and ids.secret_hash(issued.ref) in stored


def test_unapproved_confirmation_is_refused(world) -> None:
    ref = world.confirm_train(approve=False)
    assert code_of(lambda: train(world, ref)) is ErrorCode.CONFIRMATION_NOT_APPROVED


def test_expiry_is_exact_to_the_second(world) -> None:
    ref = world.confirm_train()
    world.clock.now = T0 + DEFAULT_CONFIRMATION_TTL_S
    assert code_of(lambda: train(world, ref)) is ErrorCode.CONFIRMATION_EXPIRED
    world.clock.now = T0 + DEFAULT_CONFIRMATION_TTL_S - 1
    assert train(world, ref).replayed is False


def test_replay_of_a_consumed_confirmation_is_refused(world) -> None:
    ref = world.confirm_train()
    train(world, ref, "key-00000001")
    assert code_of(lambda: train(world, ref, "key-00000002")) is ErrorCode.CONFIRMATION_CONSUMED


def test_one_manifest_byte_differs(world) -> None:
    ref = world.confirm_train()
    other = verified(manifest_bytes() + b" ")
    assert code_of(lambda: train(world, ref, manifest=other)) is ErrorCode.MANIFEST_DIGEST_MISMATCH


def test_one_cent_differs(world) -> None:
    ref = world.confirm_train()
    with world.ledger.write() as conn:
        conn.execute(confirmations_table.update().values(cost_cents=COST - 1))
    assert code_of(lambda: train(world, ref)) is ErrorCode.CONFIRMATION_MISMATCH


def test_another_booking_is_a_mismatch(world) -> None:
    ref = world.confirm_train()
    second = world.booking()
    assert code_of(lambda: train(world, ref, booking_id=second)) is ErrorCode.CONFIRMATION_MISMATCH


def test_unknown_and_foreign_references_are_both_invalid(world) -> None:
    ref = world.confirm_train()
    assert code_of(lambda: train(world, ids.new_confirmation_ref())) is ErrorCode.CONFIRMATION_INVALID
    foreign_booking = world.booking(account=world.other)
    assert code_of(lambda: train(world, ref, booking_id=foreign_booking, account=world.other)) in (
        ErrorCode.CONFIRMATION_INVALID,)
    assert code_of(lambda: train(world, "ito_acct_" + "x" * 43)) is ErrorCode.CONFIRMATION_INVALID


@pytest.mark.parametrize("change, code", [
    ({"region": "us-east"}, ErrorCode.NETWORK_MISMATCH),
    ({"network": "eth-100g"}, ErrorCode.NETWORK_MISMATCH),
    ({"topology": "2x4-pcie"}, ErrorCode.BOOKING_MISMATCH),
    ({"price_per_gpu_hour_cents": 99}, ErrorCode.CONFIRMATION_MISMATCH),
])
def test_amendment_invalidates_pending_confirmations(world, change, code) -> None:
    ref = world.confirm_train()
    bookings.amend(world.ledger, world.booking_id, change, actor=None)
    assert code_of(lambda: train(world, ref)) is code


def test_approval_must_name_the_cost_it_saw(world) -> None:
    issued = confirm_request.request_train(world.ledger, world.policy, world.account, world.booking_id, verified())
    wrong = lambda: confirmations.approve(world.ledger, issued.ref, approver_token_id=world.desk.token_id,  # noqa: E731
                                          expected_cost_cents=COST + 1)
    assert code_of(wrong) is ErrorCode.CONFIRMATION_MISMATCH
    approved = confirmations.approve(world.ledger, issued.ref, approver_token_id=world.desk.token_id,
                                     expected_cost_cents=COST, expected_digest=verified().digest)
    assert approved.approved_by == world.desk.token_id


def test_cancel_and_cleanup_confirmations_do_not_authorize_training(world) -> None:
    ref = confirm_request.request_cleanup(world.ledger, world.policy, world.account).ref
    world.approve(ref)
    assert code_of(lambda: train(world, ref)) is ErrorCode.CONFIRMATION_MISMATCH
