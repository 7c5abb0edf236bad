"""Gate 5's pure checks at their edges: where a data or checkpoint location may resolve, which
network and capacity a booking must offer, and which data the policy admits."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gate_world import make_policy, manifest_bytes, verified
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import validation
from ito_assets.control.entitlement import Eligibility
from ito_assets.control.validation import RunRequirements

ELIGIBLE = Eligibility(account_id="acc_a", booking_id="bkg_a", booking_revision=1, gpu_type="H100", num_gpus=8,
                       num_nodes=1, topology="1x8", region="eu-west", network="ib-400g", starts_at=1, ends_at=2,
                       duration_s=1)


def code_of(call) -> ErrorCode:
    with pytest.raises(ItoError) as info:
        call()
    return info.value.code


@pytest.mark.parametrize(("text", "parts"), [
    ("a", ("a",)), ("a/b/c.jsonl", ("a", "b", "c.jsonl")), ("a..b/c", ("a..b", "c")), (".hidden", (".hidden",)),
])
def test_plain_relative_locations_resolve_to_their_parts(text, parts) -> None:
    assert validation._relative_parts(text) == parts


@pytest.mark.parametrize("text", ["", "/abs", "..", "a/../b", "./a", "a/.", "a/./b", "a\x00b", "a//b/.."])
def test_every_other_location_is_refused(text) -> None:
    with pytest.raises(ValueError):
        validation._relative_parts(text)


def test_inside_is_the_root_or_below_it_never_a_sibling_with_the_same_prefix(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "data-other").mkdir()
    assert validation.inside(root, root) and validation.inside(root / "sub", root)
    assert validation.inside(root / "not-yet-made.jsonl", root)
    assert not validation.inside(tmp_path / "data-other", root)
    assert not validation.inside(tmp_path, root)
    (root / "escape").symlink_to(tmp_path / "data-other")
    assert not validation.inside(root / "escape", root)


def test_data_uris_resolve_inside_an_allowed_root(tmp_path: Path) -> None:
    policy = make_policy(tmp_path)
    assert validation.resolve_data_uri("dataroot://corpus/a.jsonl", policy) == policy.data_root / "corpus" / "a.jsonl"
    absolute = policy.data_root / "b.jsonl"
    assert validation.resolve_data_uri(f"file://{absolute}", policy) == absolute
    for uri in ("file:///etc/passwd", "dataroot://../x", "s3://bucket/key", "dataroot://", "file://relative"):
        with pytest.raises(ValueError):
            validation.resolve_data_uri(uri, policy)


def test_a_second_allowed_root_admits_its_files(tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    policy = make_policy(tmp_path, allowed_data_roots=(tmp_path / "data", extra))
    assert validation.resolve_data_uri(f"file://{extra}/c.jsonl", policy) == extra / "c.jsonl"


@pytest.mark.parametrize(("requirements", "code"), [
    (RunRequirements(), None),
    (RunRequirements(region="eu-west", network="ib-400g"), None),
    (RunRequirements(region="us-east"), ErrorCode.NETWORK_MISMATCH),
    (RunRequirements(network="roce-100g"), ErrorCode.NETWORK_MISMATCH),
    (RunRequirements(region="eu-west", network="roce-100g"), ErrorCode.NETWORK_MISMATCH),
])
def test_the_network_the_run_needs_must_be_the_bookings(requirements, code) -> None:
    if code is None:
        validation.check_network(requirements, ELIGIBLE)
    else:
        assert code_of(lambda: validation.check_network(requirements, ELIGIBLE)) is code


@pytest.mark.parametrize(("num_gpus", "active", "limit", "ok", "retryable"), [
    (8, 0, 1, True, None),      # exactly the booking's GPUs
    (9, 0, 1, False, False),    # one more than it has: retrying will not help
    (1, 0, 1, True, None),
    (8, 1, 1, False, True),     # exactly at the concurrent-run limit: a finished run frees it
    (8, 1, 2, True, None),
    (8, 2, 2, False, True),
])
def test_capacity_at_its_edges(tmp_path: Path, num_gpus, active, limit, ok, retryable) -> None:
    policy = make_policy(tmp_path, max_concurrent_runs_per_booking=limit)
    call = lambda: validation.check_capacity(RunRequirements(num_gpus=num_gpus), ELIGIBLE,  # noqa: E731
                                             num_active_runs=active, policy=policy)
    if ok:
        call()
    else:
        with pytest.raises(ItoError) as info:
            call()
        assert info.value.code is ErrorCode.CAPACITY_UNAVAILABLE and info.value.retryable is retryable


def test_the_data_policy_names_each_offending_reference_by_position(tmp_path: Path) -> None:
    policy = make_policy(tmp_path)
    document = json.loads(manifest_bytes())
    document["data"].append({**document["data"][0], "uri": "dataroot://fixtures/nc.jsonl", "sha256": "1" * 64, "license": "CC-BY-NC-4.0"})
    document["data"].append({**document["data"][0], "uri": "file:///etc/shadow", "sha256": "2" * 64})
    with pytest.raises(ItoError) as info:
        validation.check_data_policy(verified(json.dumps(document).encode()).manifest, policy)
    assert info.value.code is ErrorCode.DATA_POLICY_VIOLATION and "data[1]" in info.value.message
    assert "data[2]" not in info.value.message  # licences are checked first, then locations
    del document["data"][1]
    with pytest.raises(ItoError) as info:
        validation.check_data_policy(verified(json.dumps(document).encode()).manifest, policy)
    assert info.value.message.endswith("data[1]") and "/etc/shadow" not in info.value.message


def test_a_licence_the_policy_allows_is_admitted(tmp_path: Path) -> None:
    policy = make_policy(tmp_path, allowed_licenses=frozenset({"CC-BY-NC-4.0"}))
    document = json.loads(manifest_bytes())
    document["data"][0]["license"] = "CC-BY-NC-4.0"
    validation.check_data_policy(verified(json.dumps(document).encode()).manifest, policy)
    document["data"][0]["license"] = "MIT"
    assert code_of(lambda: validation.check_data_policy(verified(json.dumps(document).encode()).manifest,
                                                        policy)) is ErrorCode.DATA_POLICY_VIOLATION


def test_checkpoint_storage_is_made_private_inside_the_tenants_area(tmp_path: Path) -> None:
    policy = make_policy(tmp_path)
    folder = validation.check_checkpoint_storage("tenant://runs/ckpt", "acc_a", policy)
    assert folder == policy.tenant_area("acc_a") / "runs" / "ckpt"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and list(folder.iterdir()) == []  # the probe is gone
    absolute = policy.tenant_area("acc_a") / "abs"
    assert validation.check_checkpoint_storage(f"file://{absolute}", "acc_a", policy) == absolute


@pytest.mark.parametrize("uri", ["tenant://", "tenant://../acc_b/x", "s3://bucket/x", "file:///tmp/x", "tenant:///abs"])
def test_checkpoint_storage_outside_the_area_or_malformed_is_invalid(tmp_path: Path, uri) -> None:
    policy = make_policy(tmp_path)
    assert code_of(lambda: validation.check_checkpoint_storage(uri, "acc_a", policy)) is \
        ErrorCode.CHECKPOINT_STORAGE_INVALID
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_checkpoint_storage_that_cannot_be_written_is_invalid(tmp_path: Path) -> None:
    policy = make_policy(tmp_path)
    area = policy.tenant_area("acc_a")
    (area / "ro").mkdir(parents=True)
    (area / "ro").chmod(0o500)
    try:
        assert code_of(lambda: validation.check_checkpoint_storage("tenant://ro", "acc_a", policy)) is \
            ErrorCode.CHECKPOINT_STORAGE_INVALID
    finally:
        (area / "ro").chmod(0o700)


def test_the_writability_probe_is_written_in_the_checkpoint_folder_itself(tmp_path: Path, monkeypatch) -> None:
    """Root can write anywhere, so the probe's place is what proves the folder is the one checked."""
    policy = make_policy(tmp_path)
    probes = []
    real = validation.tempfile.NamedTemporaryFile

    def recording(*args, **kwargs):
        handle = real(*args, **kwargs)
        probes.append(Path(handle.name))
        return handle
    monkeypatch.setattr(validation.tempfile, "NamedTemporaryFile", recording)
    folder = validation.check_checkpoint_storage("tenant://probed", "acc_a", policy)
    assert [p.parent for p in probes] == [folder] and probes[0].name.startswith(".ito-probe-")
    assert not probes[0].exists()


def test_a_full_or_unwritable_checkpoint_folder_is_invalid_even_for_root(tmp_path: Path, monkeypatch) -> None:
    policy = make_policy(tmp_path)

    def no_space(*_args, **_kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(validation.tempfile, "NamedTemporaryFile", no_space)
    assert code_of(lambda: validation.check_checkpoint_storage("tenant://full", "acc_a", policy)) is \
        ErrorCode.CHECKPOINT_STORAGE_INVALID


def test_a_quote_checks_the_checkpoint_storage_without_creating_it(world) -> None:
    """POST /v1/quotes is read-only: no folder in the tenant's area; the confirmation creates it."""
    from ito_assets.control import confirm_request

    manifest = verified()
    area = world.policy.tenant_area(world.account.account_id)
    quote = confirm_request.quote_train(world.ledger, world.policy, world.account, world.booking_id, manifest)
    assert quote.cost_cents > 0 and not area.exists()
    world.confirm_train(manifest=manifest)
    assert area.exists()


def test_a_quote_refuses_a_checkpoint_folder_linked_out_of_the_tenants_area(world, tmp_path: Path) -> None:
    from ito_assets.control import confirm_request

    manifest = verified(manifest_bytes(checkpoint_policy__storage_uri="tenant://linked/ckpt"))
    area = world.policy.tenant_area(world.account.account_id)
    area.mkdir(parents=True)
    (area / "linked").symlink_to(tmp_path)
    assert code_of(lambda: confirm_request.quote_train(world.ledger, world.policy, world.account, world.booking_id,
                                                       manifest)) is ErrorCode.CHECKPOINT_STORAGE_INVALID
    assert not (tmp_path / "ckpt").exists()
