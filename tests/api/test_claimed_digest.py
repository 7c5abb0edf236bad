"""Gate 2 on the wire: every route that takes manifest bytes hashes them again and refuses a claimed
digest that differs, before anything is written. The `ito` client always claims the right digest,
so these requests are sent by hand with the account's own token."""

from __future__ import annotations

import base64
import hashlib
import sqlite3
from pathlib import Path

import pytest

from ito_assets.api.client import Endpoint, HttpTransport

ROUTES = ("/v1/confirmations", "/v1/runs")


def transport(api, token: str = "account") -> HttpTransport:
    host, port = api.server.url.removeprefix("http://").split(":")
    secret = Path(api.tokens[token]).read_text().strip()
    return HttpTransport(Endpoint("http", host, int(port)), secret, connect_timeout_s=5, total_timeout_s=30)


def ledger_counts(api) -> dict[str, int]:
    with sqlite3.connect(f"file:{api.server.ledger_path}?mode=ro", uri=True) as db:
        return {table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("manifests", "confirmations", "runs", "idempotency_keys")}


def body_for(route: str, booking: str, content: bytes, digest: str, ref: str, key: str) -> dict:
    body = {"booking_id": booking, "manifest_digest": digest, "manifest_b64": base64.b64encode(content).decode()}
    if route == "/v1/confirmations":
        return {**body, "action": "train"}
    return {**body, "confirmation_ref": ref, "idempotency_key": key}


def sha256(content: bytes) -> str:
    return "sha256:" + hashlib.sha256(content).hexdigest()


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("claim", ["other_bytes", "one_hex_digit_off"])
def test_a_wrong_claimed_digest_is_refused_and_writes_nothing(api, route, claim) -> None:
    booking = api.booking()
    path = api.manifest()
    ref = api.confirm_train(booking, path)  # approved: the digest is the only gate left to fail
    content = Path(path).read_bytes()
    right = sha256(content)
    wrong = sha256(content + b"\n") if claim == "other_bytes" else right[:-1] + ("0" if right[-1] != "0" else "1")
    key = api.unique("key")
    before = ledger_counts(api)

    reply = transport(api).request("POST", route, body_for(route, booking, content, wrong, ref, key))

    assert reply.status == 400, reply
    assert reply.document["ok"] is False
    assert reply.document["error"]["code"] == "MANIFEST_DIGEST_MISMATCH"
    assert wrong not in str(reply.document) and right not in str(reply.document)
    assert ledger_counts(api) == before
    # The same request with the right digest still goes through: nothing was consumed or reserved.
    again = transport(api).request("POST", route, body_for(route, booking, content, right, ref, key))
    assert again.document["ok"] is True, again.document


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("digest", ["", "sha256:" + "A" * 64, "sha256:" + "0" * 63, "md5:" + "0" * 32, 12])
def test_a_malformed_claimed_digest_is_a_usage_error(api, route, digest) -> None:
    booking = api.booking()
    content = Path(api.manifest()).read_bytes()
    before = ledger_counts(api)
    reply = transport(api).request("POST", route, body_for(route, booking, content, digest, "cfr_" + "0" * 26,
                                                           api.unique("key")))
    assert reply.document["error"]["code"] == "USAGE_ERROR", reply.document
    assert ledger_counts(api) == before


def test_the_desk_approves_only_the_digest_it_was_shown(api) -> None:
    booking = api.booking()
    path = api.manifest()
    issued = api.ok("confirm", "request", "--action", "train", "--booking", booking, "--manifest", path)
    binding = issued["binding"]
    wrong = sha256(Path(path).read_bytes() + b" ")
    refused = api.ito("desk", "approve", issued["confirmation_ref"], "--cost-cents", str(binding["cost_cents"]),
                      "--manifest-digest", wrong, token="desk")
    assert refused["error"]["code"] == "CONFIRMATION_MISMATCH", refused
    approved = api.ok("desk", "approve", issued["confirmation_ref"], "--cost-cents", str(binding["cost_cents"]),
                      "--manifest-digest", binding["manifest_digest"], token="desk")
    assert approved["manifest_digest"] == binding["manifest_digest"]
