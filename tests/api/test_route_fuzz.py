"""Property: whatever a client sends to whichever route, with or without a valid token, the
answer is a JSON envelope with a stable error code, never a 500 and never a traceback.

Bodies are arbitrary JSON-ish values (nested objects and lists, huge integers, floats, NUL
strings, unknown fields), the route's own fields filled with hostile or plausible values, or raw
bytes (NaN, duplicate keys, deep nesting, invalid UTF-8); path parameters and query strings are
arbitrary text. Each request goes through the real application of `ito serve` in process.
"""

from __future__ import annotations

import json
import re
import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from starlette.routing import Route

from ito_assets.api import bodies
from ito_assets.errors import ErrorCode
from helpers import examples
from test_bodies import World, asgi, built_world

# The model each body route validates against (checked complete against the app below).
BODY_MODELS = {
    ("POST", "/v1/runs"): bodies.TrainBody,
    ("POST", "/v1/runs/{run_id}/cancel"): bodies.CancelBody,
    ("POST", "/v1/cleanup"): bodies.CleanupBody,
    ("POST", "/v1/confirmations"): bodies.ConfirmationBody,
    ("POST", "/v1/quotes"): bodies.QuoteBody,
    ("POST", "/v1/desk/accounts"): bodies.AccountBody,
    ("POST", "/v1/desk/tokens"): bodies.TokenBody,
    ("POST", "/v1/desk/tokens/revoke"): bodies.RevokeBody,
    ("POST", "/v1/desk/bookings"): bodies.BookingBody,
    ("POST", "/v1/desk/bookings/{booking_id}/complete"): bodies.EmptyBody,
    ("POST", "/v1/desk/bookings/{booking_id}/revoke"): bodies.EmptyBody,
    ("POST", "/v1/desk/bookings/{booking_id}/release"): bodies.EmptyBody,
    ("POST", "/v1/desk/bookings/{booking_id}/amend"): bodies.AmendBody,
    ("POST", "/v1/desk/confirmations/show"): bodies.ConfirmationRefBody,
    ("POST", "/v1/desk/confirmations/approve"): bodies.ApproveBody,
    ("POST", "/v1/desk/runs/{run_id}/proposals/{proposal_id}"): bodies.DecisionBody,
}
CODES = {code.value for code in ErrorCode}


@pytest.fixture(scope="module")
def world():
    with built_world("ito-fuzz-") as built:
        yield built


def app_routes() -> list[tuple[str, str]]:
    from ito_assets.api.routes.common import Api
    from ito_assets.api.server import build_app

    app = build_app(Api(ledger=None, policy=None))  # type: ignore[arg-type] - routes only, no request
    return sorted((method, r.path) for r in app.routes if isinstance(r, Route) for method in r.methods
                  if method != "HEAD")


ROUTES = app_routes()


def test_every_body_route_has_its_model_listed() -> None:
    assert {(m, p) for m, p in ROUTES if m == "POST"} == set(BODY_MODELS)


# --- strategies -----------------------------------------------------------------------------

HUGE = st.sampled_from([10**23, -(10**23), 2**53, 2**53 + 1, 2**63, 2**64, 10**15 + 1, 65537, 10**4000, -1, 0])
TEXT = st.text(max_size=40) | st.sampled_from(["\x00", "a\x00b", "NaN", "Infinity", "-Infinity", "null", "x" * 300,
                                               "ito_acct_" + "A" * 43, "cfr_" + "0" * 26, "../../etc/passwd"])
SCALARS = st.none() | st.booleans() | st.integers() | HUGE | st.floats(allow_nan=False) | TEXT
JSONISH = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                       max_leaves=16)
RAW = st.sampled_from([
    b'{"a": NaN}', b'{"a": Infinity}', b'{"a": -Infinity}', b'{"a": 1, "a": 2}', b"[" * 5000, b'{"a":' * 3000,
    b'{"n": 1' + b"0" * 5000 + b"}", b"\xef\xbb\xbf{}", b'{"a": "\xff"}', b"{} {}", b"", b"   ", b"null",
]) | st.binary(max_size=64)
PATH_ID = st.text(max_size=20) | st.sampled_from(["\x00", "x" * 257, "x" * 256, "run_" + "0" * 26, "%00", "..",
                                                  "spk_0000000000000000", "bkg_" + "0" * 26])
QUERY = st.lists(st.tuples(st.sampled_from(["after", "limit", "account_id", "x", ""]), TEXT | st.integers().map(str)),
                 max_size=3).map(lambda items: urllib.parse.urlencode(items))


def field_values(world: World):
    plausible = st.sampled_from([world.booking, world.run_id, world.account_id, "train", "cancel", "cleanup",
                                 "release", "desk", "account", "approve", "reject", "sha256:" + "0" * 64, "e30="])
    return JSONISH | plausible | HUGE


def bodies_for(model: type[bodies.Strict], world: World):
    fields = {name: field_values(world) for name in model.model_fields}
    shaped = st.fixed_dictionaries({}, optional=fields)
    with_unknown = st.tuples(shaped, st.dictionaries(TEXT, JSONISH, min_size=1, max_size=2)).map(
        lambda pair: {**pair[1], **pair[0]})
    as_json = (shaped | with_unknown | JSONISH).map(lambda value: json.dumps(value).encode())
    return as_json | RAW


def tokens(world: World):
    return st.sampled_from([None, world.desk, world.account, "garbage", "ito_desk_" + "A" * 43])


def fill(template: str, ids: list[str]) -> str:
    names = re.findall(r"{(\w+)}", template)
    path = template
    for name, value in zip(names, ids):
        path = path.replace("{" + name + "}", value, 1)
    return path


def check(reply) -> None:
    assert reply.status != 500, reply
    assert "Traceback" not in reply.text and "File \"" not in reply.text
    document = reply.document
    assert isinstance(document.get("ok"), bool), document
    if document["ok"]:
        assert reply.status == 200 and isinstance(document["data"], dict)
    else:
        assert set(document["error"]) == {"code", "message", "retryable"}
        assert document["error"]["code"] in CODES
        assert reply.status >= 400


FUZZ = settings(max_examples=examples(20, 400), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@pytest.mark.fuzz
@pytest.mark.parametrize("method, template", ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
@FUZZ
@given(data=st.data())
def test_any_request_gets_an_envelope_never_a_500(world, method, template, data) -> None:
    ids = data.draw(st.lists(PATH_ID, min_size=3, max_size=3), label="path ids")
    path = fill(template, ids)
    token = data.draw(tokens(world), label="token")
    query = data.draw(QUERY, label="query")
    if method == "POST":
        raw = data.draw(bodies_for(BODY_MODELS[(method, template)], world), label="body")
        reply = asgi(world.app, method, path, chunks=[raw], token=token, query=query)
    else:
        reply = asgi(world.app, method, path, token=token, query=query)
    check(reply)
    if token is None and not template.endswith(("/health", "/readiness")):
        # No token: refused before anything else is looked at, unless no route matched at all.
        assert reply.status in (401, 404), reply
        assert reply.status == 401 or reply.document["error"]["message"] == "no such API route"
