"""A desk listing filtered by an account id that names no account answers ACCOUNT_NOT_FOUND, not
an empty list that reads as an account with no booking and no budget; a real account with none
still answers an empty list."""

from __future__ import annotations

import pytest

from ito_assets.control import identity
from test_bodies import built_world

MISSING = "acc_" + "0" * 26  # in the ledger's form, no account's


@pytest.fixture(scope="module")
def world():
    with built_world("ito-account-not-found-") as built:
        yield built


@pytest.mark.parametrize("listing", ["bookings", "budgets"])
def test_an_unknown_account_is_not_found(world, listing):
    path, query = (("/v1/desk/bookings", f"account_id={MISSING}") if listing == "bookings"
                   else (f"/v1/desk/accounts/{MISSING}/budgets", ""))
    reply = world.call("GET", path, query=query)
    assert reply.document["ok"] is False and reply.document["error"]["code"] == "ACCOUNT_NOT_FOUND", reply.document
    assert reply.status == 404 and MISSING not in reply.text  # the id is not echoed


@pytest.mark.parametrize("listing", ["bookings", "budgets"])
def test_an_account_with_nothing_lists_nothing(world, listing):
    empty = identity.create_account(world.ledger, f"empty-{listing}", actor=None).account_id
    path, query = (("/v1/desk/bookings", f"account_id={empty}") if listing == "bookings"
                   else (f"/v1/desk/accounts/{empty}/budgets", ""))
    reply = world.call("GET", path, query=query)
    assert reply.status == 200, reply.document
    assert reply.document["data"][listing] == []


def test_an_accounts_own_budgets_and_the_unfiltered_listing_still_answer(world):
    assert world.call("GET", "/v1/budgets", token="account").status == 200
    listed = world.call("GET", "/v1/desk/bookings")
    assert listed.status == 200 and listed.document["data"]["bookings"]
