"""The one transaction that creates a run: idempotency first, every gate, exactly one run."""

from __future__ import annotations

import json

import sqlalchemy as sa
import pytest

from gate_world import COST, manifest_bytes, verified
from helpers import bound_pair_steps
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, bookings, create_run, runs
from ito_assets.control.create_run import TrainRequest
from ito_assets.control.ledger import audit_events, confirmations, runs as runs_table
from ito_assets.control.states import RunState


def train(world, ref: str, key: str = "key-00000001", manifest=None):
    request = TrainRequest(booking_id=world.booking_id, verified=manifest or verified(), confirmation_ref=ref,
                           idempotency_key=key)
    return create_run.create_run(world.ledger, world.policy, world.account, request)


def code_of(call) -> ErrorCode:
    with pytest.raises(ItoError) as info:
        call()
    return info.value.code


def num_runs(world) -> int:
    with world.ledger.read() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(runs_table)).scalar_one()


def test_creates_one_queued_run_with_stable_identifiers(world) -> None:
    created = train(world, world.confirm_train())
    data = created.run.to_dict()
    assert created.replayed is False and data["state"] == "queued"
    assert data["booking_id"] == world.booking_id and data["manifest_sha256"] == verified().digest
    assert data["idempotency_key"] == "key-00000001" and data["cost_cents"] == COST
    assert runs.manifest_bytes(world.ledger, verified().digest) == manifest_bytes()
    assert created.run.checkpoint_dir.startswith(str(world.policy.tenant_area(world.account.account_id)))


def test_same_key_same_request_replays_even_after_consumption(world) -> None:
    ref = world.confirm_train()
    first = train(world, ref)
    again = train(world, ref)
    assert again.replayed and again.run.run_id == first.run.run_id and num_runs(world) == 1


def test_same_key_different_request_is_refused_before_the_confirmation(world) -> None:
    train(world, world.confirm_train())
    other = verified(manifest_bytes(name="another"))
    world.booking_id = world.booking()  # a fresh booking: capacity is not what this test is about
    fresh = world.confirm_train(manifest=other)
    assert code_of(lambda: train(world, fresh, manifest=other)) is ErrorCode.IDEMPOTENCY_KEY_REUSED
    with world.ledger.read() as conn:
        unconsumed = conn.execute(sa.select(sa.func.count()).select_from(confirmations)
                                  .where(confirmations.c.consumed_at.is_(None))).scalar_one()
    assert unconsumed == 1  # the refused request left its confirmation untouched


@pytest.mark.parametrize("key", ["short", "has space in it", "x" * 129, "ito_acct_abcdefgh",
                                 "ghp_CANARYcanary0123456789abcdefghijABCD"])
def test_malformed_or_secret_looking_keys_are_refused(world, key) -> None:
    assert code_of(lambda: train(world, world.confirm_train(), key)) is ErrorCode.IDEMPOTENCY_KEY_INVALID


def test_booking_released_between_confirm_and_train_never_yields_a_run(world) -> None:
    ref = world.confirm_train()
    bookings.transition(world.ledger, world.booking_id, "release", actor=None)
    assert code_of(lambda: train(world, ref)) is ErrorCode.BOOKING_RELEASED and num_runs(world) == 0


def test_capacity_bounds_concurrent_runs_per_booking(world) -> None:
    first, second = world.confirm_train(), world.confirm_train()
    train(world, first)
    assert code_of(lambda: train(world, second, "key-00000002")) is ErrorCode.CAPACITY_UNAVAILABLE
    assert code_of(lambda: world.confirm_train()) is ErrorCode.CAPACITY_UNAVAILABLE


@pytest.mark.parametrize("changes, code", [
    ({"budget__max_incremental_cents": COST - 1}, ErrorCode.BUDGET_EXCEEDED),
    ({"data__0__license": "CC-BY-NC-4.0"}, ErrorCode.DATA_POLICY_VIOLATION),
    ({"data__0__uri": "file:///etc/passwd"}, ErrorCode.DATA_POLICY_VIOLATION),
    ({"data__0__uri": "dataroot://../outside.jsonl"}, ErrorCode.DATA_POLICY_VIOLATION),
    ({"checkpoint_policy__storage_uri": "file:///tmp/elsewhere"}, ErrorCode.CHECKPOINT_STORAGE_INVALID),
    ({"checkpoint_policy__storage_uri": "tenant://../other-tenant"}, ErrorCode.CHECKPOINT_STORAGE_INVALID),
])
def test_server_side_validation_refuses_before_confirmation(world, changes, code) -> None:
    bad = verified(manifest_bytes(**changes))
    assert code_of(lambda: world.confirm_train(manifest=bad)) is code


def test_missing_provenance_is_its_own_code(world) -> None:
    document = json.loads(manifest_bytes())
    del document["data"][0]["decontamination"]
    bad = verified(json.dumps(document).encode())
    assert code_of(lambda: world.confirm_train(manifest=bad)) is ErrorCode.PROVENANCE_MISSING


@pytest.mark.parametrize("change, code", [
    ({"license": "CC-BY-NC-4.0"}, ErrorCode.DATA_POLICY_VIOLATION),
    ({"uri": "dataroot://../outside.jsonl"}, ErrorCode.DATA_POLICY_VIOLATION),
])
def test_a_post_training_pair_file_meets_the_same_data_policy(world, change, code) -> None:
    document = json.loads(manifest_bytes())
    sft = bound_pair_steps(world.policy.data_root)[0]
    pairs = sft["data"]
    document["post_training"] = [sft]
    assert world.confirm_train(manifest=verified(json.dumps(document).encode()))  # the bound file as reviewed
    document["post_training"] = [{"kind": "sft", "data": {**pairs, **change}}]
    assert code_of(lambda: world.confirm_train(manifest=verified(json.dumps(document).encode()))) is code


def test_budget_cap_counts_earlier_runs_of_the_same_manifest(world, policy) -> None:
    capped = verified(manifest_bytes(budget__cap_cents=COST * 3 // 2, budget__max_incremental_cents=COST))
    first = world.confirm_train(manifest=capped)
    train(world, first, manifest=capped)
    world.booking_id = world.booking()
    assert code_of(lambda: world.confirm_train(manifest=capped)) is ErrorCode.BUDGET_EXCEEDED


def test_symlink_out_of_the_tenant_area_is_refused(world, tmp_path) -> None:
    area = world.policy.tenant_area(world.account.account_id)
    area.mkdir(parents=True)
    (area / "escape").symlink_to(tmp_path)
    bad = verified(manifest_bytes(checkpoint_policy__storage_uri="tenant://escape/ckpt"))
    assert code_of(lambda: world.confirm_train(manifest=bad)) is ErrorCode.CHECKPOINT_STORAGE_INVALID


def test_every_step_and_refusal_is_audited_and_the_trail_is_append_only(world) -> None:
    ref = world.confirm_train()
    created = train(world, ref)
    code_of(lambda: train(world, ref, "key-00000002"))
    kinds = [e.kind for e in audit.events(world.ledger)]
    assert {"confirmation_requested", "confirmation_approved", "run_created", "run_refused"} <= set(kinds)
    for e in audit.events(world.ledger):
        assert ref not in str(e.detail)
    assert any(e.subject == created.run.run_id for e in audit.events(world.ledger))
    with pytest.raises(sa.exc.DBAPIError):
        with world.ledger.write() as conn:
            conn.execute(audit_events.update().values(kind="tampered"))
    with pytest.raises(sa.exc.DBAPIError):
        with world.ledger.write() as conn:
            conn.execute(audit_events.delete())


def test_state_machine_for_the_dagster_shell(world) -> None:
    run = train(world, world.confirm_train()).run
    assert [r.run_id for r in runs.pending_runs(world.ledger)] == [run.run_id]
    runs.attach_dagster_run(world.ledger, run.run_id, "dagster-1")
    runs.attach_dagster_run(world.ledger, run.run_id, "dagster-1")  # idempotent
    assert runs.pending_runs(world.ledger) == []
    assert code_of(lambda: runs.attach_dagster_run(world.ledger, run.run_id, "dagster-2")) is ErrorCode.INTERNAL_ERROR
    assert runs.set_state(world.ledger, run.run_id, RunState.RUNNING).state is RunState.RUNNING
    assert runs.set_state(world.ledger, run.run_id, RunState.SUCCEEDED).finished_at is not None
    assert code_of(lambda: runs.set_state(world.ledger, run.run_id, RunState.RUNNING)) is ErrorCode.USAGE_ERROR
