"""Identity (authentication is identity, never workload authority) and the server's gate policy as
read from its environment: each value at its edge, each refusal with its code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from gate_world import T0
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import audit, identity
from ito_assets.control.ledger import tokens
from ito_assets.control.policy import DEFAULT_CONFIRMATION_TTL_S, DEFAULT_LICENSES, DEFAULT_MAX_CONCURRENT_RUNS, \
    ServerPolicy, load_policy
from ito_assets.control.states import Role
from ito_assets.settings import load_settings


def code_of(call) -> ErrorCode:
    with pytest.raises(ItoError) as info:
        call()
    return info.value.code


def events(world, kind: str) -> list[audit.AuditEvent]:
    return [e for e in audit.events(world.ledger, limit=10_000) if e.kind == kind]


def test_a_token_authenticates_as_exactly_its_role_and_account(world) -> None:
    issued = identity.issue_token(world.ledger, Role.ACCOUNT, account_id=world.account.account_id, label="ci",
                                  actor=world.desk.token_id)
    who = identity.authenticate(world.ledger, issued.secret)
    assert issued.token_id.startswith("tok_") and world.account.account_id.startswith("acc_")
    assert (issued.role, issued.account_id) == (Role.ACCOUNT, world.account.account_id)
    assert (who.token_id, who.role, who.account_id, who.tenant) == (
        issued.token_id, Role.ACCOUNT, world.account.account_id, world.account.account_id)
    assert issued.secret not in repr(issued) and issued.secret not in repr(who)
    with world.ledger.read() as conn:
        row = conn.execute(sa.select(tokens).where(tokens.c.token_id == issued.token_id)).mappings().one()
    assert (row["label"], row["created_at"], row["created_by"], row["role"]) == ("ci", T0, world.desk.token_id, "account")
    assert issued.secret not in str(dict(row))
    event = events(world, "token_issued")[-1]
    assert (event.actor, event.account_id, event.subject, event.detail) == (
        world.desk.token_id, world.account.account_id, issued.token_id, {"role": "account"})


@pytest.mark.parametrize("presented", [None, "", "not-a-token", "ito_account_" + "x" * 3])
def test_no_or_malformed_token_is_auth_required(world, presented) -> None:
    assert code_of(lambda: identity.authenticate(world.ledger, presented)) is ErrorCode.AUTH_REQUIRED


def test_an_unknown_well_formed_token_and_a_revoked_one_are_both_credential_revoked(world) -> None:
    issued = identity.issue_token(world.ledger, Role.ACCOUNT, account_id=world.account.account_id, label="x",
                                  actor=None)
    kept = identity.issue_token(world.ledger, Role.ACCOUNT, account_id=world.account.account_id, label="y",
                                actor=None)
    unknown = issued.secret[:-1] + ("A" if issued.secret[-1] != "A" else "B")
    assert code_of(lambda: identity.authenticate(world.ledger, unknown)) is ErrorCode.CREDENTIAL_REVOKED
    world.clock.now = T0 + 7
    assert identity.revoke_token(world.ledger, issued.token_id, actor=world.desk.token_id) is True
    assert identity.revoke_token(world.ledger, issued.token_id, actor=world.desk.token_id) is False
    assert code_of(lambda: identity.authenticate(world.ledger, issued.secret)) is ErrorCode.CREDENTIAL_REVOKED
    assert identity.authenticate(world.ledger, kept.secret).token_id == kept.token_id  # only that one
    [revoked] = events(world, "token_revoked")
    assert (revoked.actor, revoked.account_id, revoked.subject, revoked.at) == (
        world.desk.token_id, world.account.account_id, issued.token_id, T0 + 7)
    assert code_of(lambda: identity.revoke_token(world.ledger, "tok_" + "0" * 26, actor=None)) is ErrorCode.USAGE_ERROR


@pytest.mark.parametrize(("role", "account"), [(Role.ACCOUNT, None), (Role.DESK, "acct")])
def test_account_tokens_need_an_account_and_desk_tokens_have_none(world, role, account) -> None:
    account_id = world.account.account_id if account else None
    assert code_of(lambda: identity.issue_token(world.ledger, role, account_id=account_id, label="x",
                                                actor=None)) is ErrorCode.USAGE_ERROR


def test_a_token_for_no_account_is_refused(world) -> None:
    assert code_of(lambda: identity.issue_token(world.ledger, Role.ACCOUNT, account_id="acc_" + "0" * 26, label="x",
                                                actor=None)) is ErrorCode.USAGE_ERROR


def test_the_desk_has_no_tenant_and_an_account_is_no_desk(world) -> None:
    assert code_of(lambda: world.desk.tenant) is ErrorCode.PERMISSION_DENIED
    assert code_of(lambda: world.account.require_role(Role.DESK)) is ErrorCode.PERMISSION_DENIED
    world.desk.require_role(Role.DESK)
    world.account.require_role(Role.ACCOUNT)


def test_accounts_have_unique_names_and_list_in_creation_order_then_by_name(world) -> None:
    world.clock.now = T0 + 1
    later = identity.create_account(world.ledger, "zeta", actor=world.desk.token_id)
    world.clock.now = T0 + 2
    identity.create_account(world.ledger, "beta", actor=None)
    identity.create_account(world.ledger, "alpha", actor=None)
    assert code_of(lambda: identity.create_account(world.ledger, "zeta", actor=None)) is ErrorCode.USAGE_ERROR
    names = [a.name for a in identity.list_accounts(world.ledger)]
    assert names == ["lab", "rival", "zeta", "alpha", "beta"]
    assert identity.list_accounts(world.ledger)[2] == later and later.created_at == T0 + 1
    event = [e for e in events(world, "account_created") if e.subject == later.account_id][0]
    assert (event.actor, event.account_id, event.subject) == (world.desk.token_id, later.account_id, later.account_id)


# --- the gate policy from the server's environment --------------------------------------------------

@pytest.fixture
def settings(tmp_path: Path):
    return load_settings({"ITO_STATE_DIR": str(tmp_path / "state"), "ITO_DATA_ROOT": str(tmp_path / "data"),
                          "ITO_MAX_MANIFEST_BYTES": "12345"})


def test_the_default_policy(settings) -> None:
    policy = load_policy(settings, {})
    assert policy.allowed_data_roots == (settings.data_root,) and policy.data_root == settings.data_root
    assert policy.tenants_root == settings.state_dir / "tenants"
    assert policy.allowed_licenses == DEFAULT_LICENSES
    assert (policy.confirmation_ttl_s, policy.max_concurrent_runs_per_booking) == (
        DEFAULT_CONFIRMATION_TTL_S, DEFAULT_MAX_CONCURRENT_RUNS)
    assert policy.max_manifest_bytes == settings.max_manifest_bytes == 12345


def test_the_policy_reads_the_process_environment_by_default(settings, monkeypatch) -> None:
    monkeypatch.setenv("ITO_CONFIRMATION_TTL_S", "42")
    assert load_policy(settings).confirmation_ttl_s == 42


def test_every_policy_variable_is_read(settings, tmp_path: Path) -> None:
    roots = os.pathsep.join([str(tmp_path / "a"), "", str(tmp_path / "b")])
    policy = load_policy(settings, {
        "ITO_ALLOWED_DATA_ROOTS": roots, "ITO_ALLOWED_LICENSES": " MIT, ,CC0-1.0 ",
        "ITO_TENANTS_ROOT": str(tmp_path / "tenants"), "ITO_CONFIRMATION_TTL_S": "1",
        "ITO_MAX_CONCURRENT_RUNS_PER_BOOKING": "3"})
    assert policy.allowed_data_roots == ((tmp_path / "a").resolve(), (tmp_path / "b").resolve())
    assert policy.allowed_licenses == frozenset({"MIT", "CC0-1.0"})
    assert policy.tenants_root == (tmp_path / "tenants").resolve()
    assert (policy.confirmation_ttl_s, policy.max_concurrent_runs_per_booking) == (1, 3)
    assert policy.tenant_area("acc_x") == (tmp_path / "tenants").resolve() / "acc_x"


@pytest.mark.parametrize("name", ["ITO_CONFIRMATION_TTL_S", "ITO_MAX_CONCURRENT_RUNS_PER_BOOKING"])
@pytest.mark.parametrize("value", ["0", "-1", "1.5", "ten", "", " 5"])
def test_a_policy_count_must_be_a_positive_integer(settings, name, value) -> None:
    with pytest.raises(ItoError) as refused:
        load_policy(settings, {name: value})
    assert refused.value.code is ErrorCode.USAGE_ERROR and refused.value.message == f"{name} must be a positive integer"


@pytest.mark.parametrize("roots", [os.pathsep, os.pathsep * 3])
def test_allowed_data_roots_that_name_no_folder_are_refused(settings, roots) -> None:
    with pytest.raises(ItoError) as refused:
        load_policy(settings, {"ITO_ALLOWED_DATA_ROOTS": roots})
    assert refused.value.code is ErrorCode.USAGE_ERROR
    assert refused.value.message == "ITO_ALLOWED_DATA_ROOTS must name at least one folder"


@pytest.mark.parametrize(("field", "value", "variable"), [
    ("confirmation_ttl_s", 0, "ITO_CONFIRMATION_TTL_S"),
    ("max_concurrent_runs_per_booking", 0, "ITO_MAX_CONCURRENT_RUNS_PER_BOOKING"),
    ("allowed_data_roots", (), "ITO_ALLOWED_DATA_ROOTS")])
def test_a_policy_built_in_code_is_held_to_the_same_bounds(tmp_path: Path, field, value, variable) -> None:
    base = {"data_root": tmp_path, "allowed_data_roots": (tmp_path,), "tenants_root": tmp_path / "t"}
    ServerPolicy(**{**base, "confirmation_ttl_s": 1, "max_concurrent_runs_per_booking": 1})
    with pytest.raises(ItoError) as refused:
        ServerPolicy(**{**base, field: value})
    assert refused.value.code is ErrorCode.USAGE_ERROR and refused.value.message.startswith(variable)
