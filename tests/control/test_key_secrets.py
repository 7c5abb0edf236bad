"""An idempotency key never carries this API's own secrets: a key is echoed in every answer, the
audit trail and the Dagster run's tags. Identity tokens and confirmation references are refused
wherever they stand in the key, glued to anything; a key that only resembles them is accepted."""

from __future__ import annotations

import pytest

from ito_assets.control import ids
from ito_assets.control.fingerprint import validate_key
from ito_assets.errors import ErrorCode, ItoError

TOKENS = {role: ids.new_token(role) for role in ("desk", "account")}
REF = ids.new_confirmation_ref()


def refused(key: str) -> None:
    with pytest.raises(ItoError) as info:
        validate_key(key)
    assert info.value.code is ErrorCode.IDEMPOTENCY_KEY_INVALID
    assert info.value.message == "the idempotency key looks like a secret; use a random id"


@pytest.mark.parametrize("role", sorted(TOKENS))
@pytest.mark.parametrize("wrap", [
    "run1{}",            # a letter or digit right before the token
    "k:{}_2",            # a URL-safe character right after it
    "x.{}-retry2",
    "k:{}",
    "{}",
])
def test_a_token_glued_to_anything_is_refused(role, wrap) -> None:
    refused(wrap.format(TOKENS[role]))


@pytest.mark.parametrize("role", sorted(TOKENS))
@pytest.mark.parametrize("keep", [42, 41, 1, 0])  # characters of the 43-character body kept
def test_a_token_cut_short_is_refused(role, keep) -> None:
    # The body's last character holds 4 bits: 42 of 43 characters leave 16 guesses.
    refused("run1" + TOKENS[role][:len("ito_desk_") + keep])


@pytest.mark.parametrize("wrap", ["k:{}", "run1{}", "k:{}_2", "{}-retry2"])
def test_a_confirmation_reference_glued_to_anything_is_refused(wrap) -> None:
    refused(wrap.format(REF))
    refused(wrap.format(REF[:10]))


@pytest.mark.parametrize("key", [
    "ito-run-2026-12-01",          # "ito" without the underscore
    "run-ito_x-0001",              # "ito_" not followed by a token's role
    "k:ito_acct-0001",             # the role without its trailing underscore
    "k:ito_desks-0001",
    "run:ito_accounting-0001",
    "run-ITO_ACCT_0001",           # tokens are case-sensitive: this is no token's prefix
    "run-cfr-0001", "k:cfr.0001", "run-CFR_0001",
    "lab-run-2026-12-01",
])
def test_a_key_that_only_resembles_a_secret_is_accepted(key) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize("key", ["ito_run-0001", "ito_acct_0001", "cfr_run-0001"])
def test_a_key_that_starts_like_a_secret_is_refused(key) -> None:
    refused(key)


@pytest.mark.parametrize("key", ["nightly-cfr_2024-06-01", "run-ito_acct_x-0001"])
def test_a_key_an_older_release_stored_is_still_looked_up(key) -> None:
    # Looking a key up writes nothing: one stored before the prefixes were refused inside a key is
    # still found, so a client that lost its answer can recover it. A new request with it is refused.
    assert validate_key(key, lookup=True) == key
    refused(key)


@pytest.mark.parametrize("key", ["ito_acct_0123456789", "cfr_0123456789", "k:" + TOKENS["account"]],
                         ids=["token-prefix-first", "reference-prefix-first", "whole-token"])
def test_a_lookup_still_refuses_what_was_never_stored(key) -> None:
    with pytest.raises(ItoError) as info:
        validate_key(key, lookup=True)
    assert info.value.code is ErrorCode.IDEMPOTENCY_KEY_INVALID
