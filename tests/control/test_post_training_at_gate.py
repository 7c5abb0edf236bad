"""Gate 5 plans the recipe's post-training too: it reads each SFT and DPO pair file as the stage
will (its bytes against the manifest's sha256), counts the stages' time in the plan the booked
window must hold, and refuses a file the stage would refuse before anything is issued. The files
are read before the gate's transaction, and only where the data policy allows them."""

from __future__ import annotations

import json
import math
import uuid

import pytest

from gate_world import T0, TERMS, manifest_bytes, verified
from helpers import bound_pair_steps
from ito_assets.control import confirm_request, create_run, validation
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.posttraining.plan import read_pair_shapes
from ito_assets.training.run_plan import booked_hardware, plan_run


def code_of(call) -> ErrorCode:
    with pytest.raises(ItoError) as raised:
        call()
    return raised.value.code


def recipe_manifest(steps: list[dict]) -> bytes:
    document = json.loads(manifest_bytes())
    document["post_training"] = steps
    return json.dumps(document).encode()


def num_confirmations(world) -> int:
    with world.ledger.read() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM confirmations").scalar()


def full_recipe(world) -> bytes:
    return recipe_manifest([*bound_pair_steps(world.policy.data_root), {"kind": "rlvr"}])


def test_a_quote_plans_every_recipe_stage_and_the_window_holds_them_all(world) -> None:
    content = full_recipe(world)
    quote = confirm_request.quote_train(world.ledger, world.policy, world.account, world.booking_id, verified(content))
    plan = quote.to_dict()["plan"]
    assert [p["stage"] for p in plan["post_training"]] == ["sft", "dpo", "rlvr"]
    curriculum = math.fsum(s.plan.wall_seconds for s in quote.run_plan.stages)
    post = math.fsum(p.wall_seconds for p in quote.run_plan.post_training)
    assert quote.to_dict()["time"]["post_training_included"] is True
    assert quote.run_plan.wall_seconds == pytest.approx(curriculum + post, rel=1e-12) and post > 0
    assert quote.to_dict()["time"]["planned_wall_seconds"] == round(quote.run_plan.wall_seconds, 3)


def _wall(world, content: bytes, shapes) -> float:
    terms = {k: TERMS[k] for k in ("gpu_type", "topology", "network", "num_nodes", "num_gpus")}
    hardware = booked_hardware(**terms, price_per_gpu_hour_cents=TERMS["price_per_gpu_hour_cents"])
    return plan_run(verified(content).manifest, hardware, pair_shapes=shapes).wall_seconds


@pytest.mark.parametrize("spare", [0, -1])
def test_post_training_decides_whether_the_window_is_long_enough(world, spare: int) -> None:
    content = full_recipe(world)
    shapes = read_pair_shapes(verified(content).manifest.post_training, world.policy.data_root)
    wall, curriculum = _wall(world, content, shapes), _wall(world, content, None)
    assert math.ceil(curriculum) < math.ceil(wall) - 1  # without post-training both windows would fit
    booking_id = world.booking(ends_at=T0 + math.ceil(wall) + spare)
    if spare == 0:
        assert world.confirm_train(booking_id, verified(content))
        return
    assert code_of(lambda: world.confirm_train(booking_id, verified(content))) is ErrorCode.CAPACITY_UNAVAILABLE
    assert num_confirmations(world) == 0


def _tamper(world) -> None:
    path = world.policy.data_root / "fixtures" / "posttraining" / "sft_pairs.jsonl"
    path.write_bytes(path.read_bytes() + b'{"pair_id": "x", "prompt": "max 123=", "response": "3"}\n')


@pytest.mark.parametrize("damage, code", [
    (_tamper, ErrorCode.SOURCE_DIGEST_MISMATCH),
    (lambda world: (world.policy.data_root / "fixtures" / "posttraining" / "dpo_pairs.jsonl").unlink(),
     ErrorCode.SOURCE_NOT_FOUND),
])
def test_a_pair_file_the_stage_would_refuse_is_refused_before_anything_is_issued(world, damage, code) -> None:
    content = full_recipe(world)
    damage(world)
    assert code_of(lambda: world.confirm_train(manifest=verified(content))) is code
    assert code_of(lambda: confirm_request.quote_train(world.ledger, world.policy, world.account, world.booking_id,
                                                       verified(content))) is code
    assert num_confirmations(world) == 0


def test_an_unbound_step_and_a_file_that_is_not_pairs_are_the_stages_codes(world) -> None:
    assert code_of(lambda: world.confirm_train(manifest=verified(recipe_manifest([{"kind": "sft"}])))) \
        is ErrorCode.PROVENANCE_MISSING
    broken = world.policy.data_root / "broken.jsonl"
    broken.write_bytes(b'{"pair_id": "a", "prompt": "p"\n')
    import hashlib

    step = {"kind": "sft", "data": {"uri": "dataroot://broken.jsonl", "sha256": hashlib.sha256(broken.read_bytes()).hexdigest(),
                                    "license": "CC0-1.0", "format": "jsonl"}}
    assert code_of(lambda: world.confirm_train(manifest=verified(recipe_manifest([step])))) \
        is ErrorCode.POSTTRAINING_DATA_INVALID


def test_the_gates_keep_their_order_around_the_files_read(world, tmp_path) -> None:
    """Entitlement before anything about the files; the data policy before any file is read."""
    content = full_recipe(world)
    (world.policy.data_root / "fixtures" / "posttraining" / "sft_pairs.jsonl").unlink()
    assert code_of(lambda: world.confirm_train("bkg_" + "0" * 26, verified(content))) is ErrorCode.BOOKING_NOT_FOUND
    outside = tmp_path / "outside.jsonl"  # exists, outside the allowed roots: never read, never told apart
    outside.write_bytes(b"")
    for uri in (f"file://{outside}", f"file://{tmp_path}/absent.jsonl"):
        step = {"kind": "sft", "data": {"uri": uri, "sha256": "a" * 64, "license": "CC0-1.0", "format": "jsonl"}}
        assert code_of(lambda: world.confirm_train(manifest=verified(recipe_manifest([step])))) \
            is ErrorCode.DATA_POLICY_VIOLATION
    unlicensed = bound_pair_steps(world.policy.data_root)
    unlicensed[0]["data"]["license"] = "CC-BY-NC-4.0"
    (world.policy.data_root / "fixtures" / "posttraining" / "sft_pairs.jsonl").unlink()
    assert code_of(lambda: world.confirm_train(manifest=verified(recipe_manifest(unlicensed)))) \
        is ErrorCode.DATA_POLICY_VIOLATION


def test_a_file_changed_after_the_confirmation_refuses_the_train_and_keeps_the_confirmation(world) -> None:
    content = full_recipe(world)
    ref = world.confirm_train(manifest=verified(content))
    _tamper(world)
    request = create_run.TrainRequest(booking_id=world.booking_id, verified=verified(content), confirmation_ref=ref,
                                      idempotency_key=f"train-{uuid.uuid4().hex[:12]}")
    assert code_of(lambda: create_run.create_run(world.ledger, world.policy, world.account, request)) \
        is ErrorCode.SOURCE_DIGEST_MISMATCH
    with world.ledger.read() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM runs").scalar() == 0
        assert conn.exec_driver_sql("SELECT count(*) FROM confirmations WHERE consumed_at IS NOT NULL").scalar() == 0


def test_recipe_pairs_read_outside_the_policy_are_not_read(world, tmp_path) -> None:
    step = {"kind": "sft", "data": {"uri": f"file://{tmp_path}/x.jsonl", "sha256": "a" * 64, "license": "CC0-1.0",
                                    "format": "jsonl"}}
    pairs = validation.read_recipe_pairs(verified(recipe_manifest([step])).manifest, world.policy)
    assert pairs.shapes is None and pairs.refusal is None
    with pytest.raises(ItoError) as raised:
        pairs.require()
    assert raised.value.code is ErrorCode.INTERNAL_ERROR


@pytest.mark.parametrize("extra, refused", [(0, False), (1, True)])
def test_a_file_shorter_than_one_batch_is_refused_at_the_gate(world, extra: int, refused: bool) -> None:
    steps = bound_pair_steps(world.policy.data_root)
    lines = (world.policy.data_root / "fixtures" / "posttraining" / "sft_pairs.jsonl").read_bytes().count(b"\n")
    steps[0]["batch_size"] = lines + extra
    content = recipe_manifest(steps[:1])
    if not refused:
        assert world.confirm_train(manifest=verified(content))
        return
    with pytest.raises(ItoError) as raised:
        world.confirm_train(manifest=verified(content))
    assert raised.value.code is ErrorCode.POSTTRAINING_DATA_INVALID
    assert f"holds {lines} pairs, fewer than one batch of {lines + 1}" in raised.value.message


def test_no_file_is_read_for_a_caller_without_the_booking(world, monkeypatch) -> None:
    """Gate 1 is asked before the files are read: another account's booking (or none) costs the
    server no read of any file."""
    content = full_recipe(world)
    reads, read = [], validation.read_pair_shapes
    monkeypatch.setattr(validation, "read_pair_shapes", lambda *args, **kwargs: reads.append(args) or read(*args, **kwargs))
    for booking_id, account in (("bkg_" + "0" * 26, world.account), (world.booking_id, world.other)):
        assert code_of(lambda: world.confirm_train(booking_id, verified(content), account=account)) \
            is ErrorCode.BOOKING_NOT_FOUND
        assert code_of(lambda: confirm_request.quote_train(world.ledger, world.policy, account, booking_id,
                                                           verified(content))) is ErrorCode.BOOKING_NOT_FOUND
    assert reads == []
    world.confirm_train(manifest=verified(content))
    assert len(reads) == 1


def test_a_link_swapped_after_the_policy_check_is_not_read(world, tmp_path, monkeypatch) -> None:
    """The data policy resolves the link inside the roots; the file opened must still be that one.
    (A `file://` uri is opened as written; a `dataroot://` one is resolved first, outside the root
    SOURCE_INVALID.)"""
    steps = bound_pair_steps(world.policy.data_root)
    folder = world.policy.data_root / "fixtures" / "posttraining"
    steps[0]["data"]["uri"] = f"file://{folder / 'sft_pairs.jsonl'}"
    (folder / "sft_pairs.jsonl").rename(folder / "real.jsonl")
    (folder / "sft_pairs.jsonl").symlink_to(folder / "real.jsonl")
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes((folder / "real.jsonl").read_bytes())  # the same bytes: only where it lies differs
    checked = validation.check_data_policy

    def check_then_swap(manifest, policy) -> None:
        checked(manifest, policy)
        (folder / "sft_pairs.jsonl").unlink()
        (folder / "sft_pairs.jsonl").symlink_to(outside)

    monkeypatch.setattr(validation, "check_data_policy", check_then_swap)
    pairs = validation.read_recipe_pairs(verified(recipe_manifest(steps)).manifest, world.policy)
    assert pairs.refusal is not None and pairs.refusal.code is ErrorCode.DATA_POLICY_VIOLATION
    monkeypatch.setattr(validation, "check_data_policy", checked)  # no swap: the link inside is read
    (folder / "sft_pairs.jsonl").unlink()
    (folder / "sft_pairs.jsonl").symlink_to(folder / "real.jsonl")
    assert validation.read_recipe_pairs(verified(recipe_manifest(steps)).manifest, world.policy).shapes["sft"]


@pytest.mark.parametrize("new, code", [(511, None), (512, ErrorCode.POSTTRAINING_DATA_INVALID)])
def test_rlvr_completions_the_model_cannot_hold_are_refused_at_the_gate(world, new: int, code) -> None:
    document = json.loads(recipe_manifest([{"kind": "rlvr", "max_new_tokens": new, "overlong_cache": 1}]))  # tiny: 512
    document["budget"] = {"cap_cents": 10**9, "max_incremental_cents": 10**9}
    content = json.dumps(document).encode()
    booking_id = world.booking(ends_at=T0 + 30 * 24 * 3600)  # a window long enough for a day of generation
    if code is None:
        assert world.confirm_train(booking_id, verified(content))
    else:
        assert code_of(lambda: world.confirm_train(booking_id, verified(content))) is code
