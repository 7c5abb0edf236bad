"""What the API reads from a request, and in which order: the token before the body, the body
capped while it streams, decoded by the manifest's strict JSON reader and validated by one strict
model per route (api/bodies.py), path and query parameters bounded before the ledger sees them.

Everything here drives the real Starlette application of `ito serve` in process (the ASGI call
uvicorn would make), so the test can count how many body chunks the application pulled.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import contextlib
import shutil
import tempfile
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import sqlalchemy as sa

from helpers import CANARIES, valid_manifest
from ito_assets.api import bodies
from ito_assets.api.bodies import MAX_BODY_BYTES
from ito_assets.api.routes.common import Api
from ito_assets.api.server import build_app
from ito_assets.control import bookings, confirm_request, confirmations, create_run, identity, intake
from ito_assets.control.bookings import AMENDABLE, BookingTerms
from ito_assets.control.ledger import accounts, audit_events, open_ledger
from ito_assets.control.policy import ServerPolicy
from ito_assets.control.states import Role

NOW = 1_800_000_000
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
SECRET = CANARIES["github"]


# --- the in-process world -------------------------------------------------------------------

@dataclass
class Reply:
    status: int
    document: dict
    headers: dict[str, str]
    num_receives: int  # body messages the application pulled
    text: str


def asgi(app, method: str, path: str, *, chunks: list[bytes] | None = None, token: str | None = None,
         query: str = "", content_length: int | str | None = "auto", headers: tuple = ()) -> Reply:
    """One request through `app`; `chunks` are the body's messages (one per receive call, None
    for the client disconnecting). content_length "auto" announces the chunks' total; None sends
    none (a chunked upload)."""
    chunks = [] if chunks is None else list(chunks)
    total = sum(len(c) for c in chunks if c is not None)
    sent_headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), *headers]
    if token is not None:
        sent_headers.append((b"authorization", f"Bearer {token}".encode("latin-1")))
    if content_length == "auto":
        content_length = total
    if content_length is not None:
        sent_headers.append((b"content-length", str(content_length).encode("latin-1")))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": urllib.parse.quote(path).encode(), "query_string": query.encode("latin-1"),
             "root_path": "", "headers": sent_headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    pending = list(chunks) or [b""]
    pulled = 0
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal pulled
        if pending:
            pulled += 1
            chunk = pending.pop(0)
            if chunk is None:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    text = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()
    answer_headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    return Reply(start["status"], json.loads(text), answer_headers, pulled if chunks else 0, text)


class World:
    """A ledger with the desk, one account with a completed booking and a queued run, and the app."""

    def __init__(self, root: Path, url: str | None = None, schema: str | None = None):
        self.root = root
        (root / "data").mkdir(parents=True, exist_ok=True)
        self.ledger = open_ledger(url or f"sqlite:///{root / 'ledger.db'}", schema=schema, clock=lambda: NOW)
        self.policy = ServerPolicy(data_root=root / "data", allowed_data_roots=(root / "data",),
                                 tenants_root=root / "tenants", max_concurrent_runs_per_booking=64)
        desk = identity.issue_token(self.ledger, Role.DESK, account_id=None, label="d", actor=None)
        self.desk = desk.secret
        self.account_id = identity.create_account(self.ledger, f"lab-{uuid.uuid4().hex[:8]}",
                                                  actor=None).account_id
        self.account = identity.issue_token(self.ledger, Role.ACCOUNT, account_id=self.account_id, label="a",
                                            actor=None).secret
        self.booking = self.new_booking()
        who = identity.authenticate(self.ledger, self.account)
        content = self.manifest_bytes("world-run")
        verified = intake.verify_submitted(content, self.digest(content), max_bytes=1 << 20)
        issued = confirm_request.request_train(self.ledger, self.policy, who, self.booking, verified)
        confirmations.approve(self.ledger, issued.ref, approver_token_id=desk.token_id,
                              expected_cost_cents=issued.confirmation.cost_cents)
        self.run_id = create_run.create_run(self.ledger, self.policy, who, create_run.TrainRequest(
            booking_id=self.booking, verified=verified, confirmation_ref=issued.ref,
            idempotency_key="world-run-key-0001")).run.run_id
        self.app = build_app(Api(ledger=self.ledger, policy=self.policy))

    def new_booking(self) -> str:
        terms = BookingTerms(gpu_type="H100", num_gpus=8, num_nodes=1, topology="t", region="r", network="ib-400g",
                             starts_at=NOW - 60, ends_at=NOW + 3600, price_per_gpu_hour_cents=1)
        booking = bookings.create(self.ledger, self.account_id, terms, actor=None).booking_id
        bookings.transition(self.ledger, booking, "complete", actor=None)
        return booking

    @staticmethod
    def manifest_bytes(name: str) -> bytes:
        document = valid_manifest()
        document["name"] = name
        return json.dumps(document).encode()

    @staticmethod
    def digest(content: bytes) -> str:
        return "sha256:" + hashlib.sha256(content).hexdigest()

    def token(self, who: str | None) -> str | None:
        return {"desk": self.desk, "account": self.account}.get(who, who) if who else None

    def call(self, method: str, path: str, body: Any = None, *, token: str | None = "desk", raw: bytes | None = None,
             **options) -> Reply:
        if raw is None and body is not None:
            raw = json.dumps(body).encode()
        chunks = options.pop("chunks", None)
        if chunks is None and raw is not None:
            chunks = [raw]
        return asgi(self.app, method, path, chunks=chunks, token=self.token(token), **options)

    def count(self, table: sa.Table) -> int:
        with self.ledger.read() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()

    def close(self) -> None:
        self.ledger.dispose()


@contextlib.contextmanager
def built_world(prefix: str) -> Iterator[World]:
    """A World in a fresh temporary folder, closed and removed afterwards (module fixtures)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    built = World(root)
    try:
        yield built
    finally:
        built.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def world():
    with built_world("ito-bodies-") as built:
        yield built


def booking_body(world: World, **changes) -> dict:
    body = {"account_id": world.account_id, "gpu_type": "H100", "num_gpus": 8, "num_nodes": 1, "topology": "t",
            "region": "r", "network": "ib-400g", "starts_at": NOW - 60, "ends_at": NOW + 3600,
            "price_per_gpu_hour_cents": 1}
    return {**body, **changes}


def assert_usage(reply: Reply, field: str | None = None) -> None:
    assert reply.status == 400, reply
    assert reply.document["ok"] is False and reply.document["error"]["code"] == "USAGE_ERROR", reply.document
    if field is not None:
        assert f"'{field}'" in reply.document["error"]["message"], reply.document


# Every route that takes a body, with a body it accepts from the desk (or the account).
def body_routes(world: World) -> list[tuple[str, str]]:
    return [
        ("/v1/runs", "account"), (f"/v1/runs/{world.run_id}/cancel", "account"), ("/v1/cleanup", "account"),
        ("/v1/confirmations", "account"), ("/v1/desk/accounts", "desk"), ("/v1/desk/tokens", "desk"),
        ("/v1/desk/tokens/revoke", "desk"), ("/v1/desk/bookings", "desk"),
        (f"/v1/desk/bookings/{world.booking}/complete", "desk"), (f"/v1/desk/bookings/{world.booking}/revoke", "desk"),
        (f"/v1/desk/bookings/{world.booking}/release", "desk"), (f"/v1/desk/bookings/{world.booking}/amend", "desk"),
        ("/v1/desk/confirmations/show", "desk"), ("/v1/desk/confirmations/approve", "desk"),
        (f"/v1/desk/runs/{world.run_id}/proposals/spk_0000000000000000", "desk"),
    ]


# --- authentication comes before the body ---------------------------------------------------

HOSTILE_BODIES = {
    "announced_2_mib": dict(chunks=[b"{}"], content_length=2 * MAX_BODY_BYTES),
    "deeply_nested": dict(chunks=[b"[" * 200_000]),
    "not_json": dict(chunks=[b"\xff\xfe garbage"]),
    "chunked_forever": dict(chunks=[b" " * 65536] * 64, content_length=None),
}


@pytest.mark.parametrize("hostile", sorted(HOSTILE_BODIES))
@pytest.mark.parametrize("presented, code", [
    (None, "AUTH_REQUIRED"),
    ("not-a-token", "AUTH_REQUIRED"),
    ("ito_acct_" + "A" * 43, "CREDENTIAL_REVOKED"),  # well formed, unknown to the ledger
])
def test_a_request_without_a_valid_token_is_answered_401_before_its_body_is_read(world, hostile, presented,
                                                                                  code) -> None:
    for path, _who in body_routes(world):
        reply = asgi(world.app, "POST", path, token=presented, **HOSTILE_BODIES[hostile])
        assert reply.status == 401, (path, reply)
        assert reply.document["error"]["code"] == code
        assert reply.num_receives == 0, f"{path} read the body of an unauthenticated request"
        assert reply.headers.get("connection") == "close"  # the unread body is not drained


def test_a_revoked_token_is_answered_401_before_the_body_is_read(world) -> None:
    issued = identity.issue_token(world.ledger, Role.ACCOUNT, account_id=world.account_id, label="r", actor=None)
    identity.revoke_token(world.ledger, issued.token_id, actor=None)
    reply = asgi(world.app, "POST", "/v1/confirmations", token=issued.secret, chunks=[b"[" * 200_000])
    assert (reply.status, reply.document["error"]["code"], reply.num_receives) == (401, "CREDENTIAL_REVOKED", 0)


def test_an_account_token_on_a_desk_route_is_refused_before_the_body_is_read(world) -> None:
    reply = world.call("POST", "/v1/desk/accounts", token="account", chunks=[b"[" * 200_000])
    assert (reply.status, reply.document["error"]["code"], reply.num_receives) == (403, "PERMISSION_DENIED", 0)


def test_public_routes_answer_without_a_token(world) -> None:
    health = world.call("GET", "/v1/health", token=None)
    assert health.status == 200 and health.document["data"] == {"status": "ok"}
    readiness = world.call("GET", "/v1/readiness", token=None)
    assert readiness.status == 200 and all(c["available"] for c in readiness.document["data"]["capabilities"])


def test_deep_nesting_with_a_valid_token_is_a_usage_error_not_a_recursion_error(world) -> None:
    for depth in (33, 1_000, 150_000):
        for raw in (b"[" * depth, b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth):
            reply = world.call("POST", "/v1/desk/accounts", raw=raw)
            assert_usage(reply)
            assert "Traceback" not in reply.text and "Recursion" not in reply.text


# --- the body limit -------------------------------------------------------------------------

def padded_account_body(size: int) -> bytes:
    """A valid account-creation body of exactly `size` bytes (JSON allows trailing whitespace)."""
    core = json.dumps({"name": f"pad-{uuid.uuid4().hex[:12]}"}).encode()
    return core + b" " * (size - len(core))


@pytest.mark.parametrize("size, status", [(MAX_BODY_BYTES - 1, 200), (MAX_BODY_BYTES, 200),
                                          (MAX_BODY_BYTES + 1, 413)])
def test_an_announced_body_is_refused_past_the_limit_before_it_is_read(world, size, status) -> None:
    before = world.count(accounts)
    raw = padded_account_body(size)
    reply = world.call("POST", "/v1/desk/accounts", chunks=[raw])
    assert reply.status == status, reply
    if status == 413:
        assert reply.document["error"]["code"] == "REQUEST_TOO_LARGE"
        assert reply.num_receives == 0 and reply.headers.get("connection") == "close"
        assert world.count(accounts) == before
    else:
        assert world.count(accounts) == before + 1


@pytest.mark.parametrize("size, status", [(MAX_BODY_BYTES - 1, 200), (MAX_BODY_BYTES, 200),
                                          (MAX_BODY_BYTES + 1, 413)])
def test_a_streamed_body_is_refused_as_soon_as_it_passes_the_limit(world, size, status) -> None:
    raw = padded_account_body(size)
    step = 64 * 1024
    chunks = [raw[i:i + step] for i in range(0, len(raw), step)] + [b"", b"", b""]  # the stream goes on
    reply = world.call("POST", "/v1/desk/accounts", chunks=chunks, content_length=None)
    assert reply.status == status, reply
    if status == 413:
        assert reply.document["error"]["code"] == "REQUEST_TOO_LARGE"
        assert reply.num_receives == len(raw) // step + 1 < len(chunks)  # stopped at the chunk that passed it


def test_a_client_that_leaves_mid_body_is_not_an_internal_error(world, capfd) -> None:
    before = world.count(accounts)
    reply = world.call("POST", "/v1/desk/accounts", chunks=[b'{"name": "gone', None], content_length=None)
    assert reply.status == 400 and reply.num_receives == 2
    assert world.count(accounts) == before
    assert "internal error" not in capfd.readouterr().err


def test_a_stray_trailing_slash_is_no_route_not_a_bare_redirect(world) -> None:
    for method, path in (("GET", "/v1/runs/"), ("POST", f"/v1/desk/runs/{world.run_id}/proposals/"),
                         ("GET", "/v1/health/")):
        reply = world.call(method, path, {} if method == "POST" else None)
        assert reply.status == 404 and reply.document["error"]["message"] == "no such API route", reply


def test_content_length_that_is_not_a_number_is_a_usage_error(world) -> None:
    for announced in ("-1", "1e3", "0x10", " 5", "\u00b2"):  # the last is a superscript two: isdigit() says yes
        reply = world.call("POST", "/v1/desk/accounts", chunks=[b"{}"], content_length=announced)
        assert_usage(reply)
        assert reply.num_receives == 0


def test_a_content_length_of_a_million_digits_is_refused_without_parsing_it(world) -> None:
    reply = world.call("POST", "/v1/desk/accounts", chunks=[b"{}"], content_length="9" * 1_000_000)
    assert reply.status == 413 and reply.document["error"]["code"] == "REQUEST_TOO_LARGE"
    padded = world.call("POST", "/v1/desk/accounts", raw=padded_account_body(100),
                        content_length="0" * 50 + "100")
    assert padded.status == 200, padded


# --- strict JSON ----------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    b'{"name": "a", "name": "b"}',  # duplicate keys: two readers could see two names
    b'{"name": NaN}', b'{"name": Infinity}', b'{"name": -Infinity}',
    b'{"name": ' + b"1" * 5000 + b"}",  # past Python's int digit limit
    b'\xef\xbb\xbf{"name": "bom"}',
    b'{"name": "a"} {"name": "b"}',
    b'{"name": "\xff"}',
    b"[]", b'"name"', b"7", b"null",
])
def test_bodies_are_read_by_the_strict_json_reader(world, raw) -> None:
    before = world.count(accounts)
    reply = world.call("POST", "/v1/desk/accounts", raw=raw)
    assert_usage(reply)
    assert world.count(accounts) == before


def test_an_empty_body_is_an_empty_object(world) -> None:
    assert_usage(world.call("POST", "/v1/desk/accounts", raw=b""), "name")
    terms = BookingTerms(gpu_type="H100", num_gpus=8, num_nodes=1, topology="t", region="r", network="ib-400g",
                         starts_at=NOW - 60, ends_at=NOW + 3600, price_per_gpu_hour_cents=1)
    pending = bookings.create(world.ledger, world.account_id, terms, actor=None).booking_id
    completed = world.call("POST", f"/v1/desk/bookings/{pending}/complete", raw=b"")
    assert completed.status == 200 and completed.document["data"]["state"] == "completed", completed


# --- the models -----------------------------------------------------------------------------

INT_BOUNDS = {
    (bodies.BookingBody, "num_gpus"): (1, 65536), (bodies.BookingBody, "num_nodes"): (1, 65536),
    (bodies.BookingBody, "starts_at"): (0, 2**53), (bodies.BookingBody, "ends_at"): (0, 2**53),
    (bodies.BookingBody, "price_per_gpu_hour_cents"): (1, 10**15),
    (bodies.AmendBody, "starts_at"): (0, 2**53), (bodies.AmendBody, "ends_at"): (0, 2**53),
    (bodies.AmendBody, "price_per_gpu_hour_cents"): (1, 10**15),
    (bodies.ApproveBody, "cost_cents"): (0, 10**15),
    (bodies.PageQuery, "after"): (0, 2**63 - 1), (bodies.PageQuery, "limit"): (1, 500),
    (bodies.RunsQuery, "limit"): (1, 500),
}
ID, NAME, LABEL, DIGEST, CHOICE = 256, 128, 64, 128, 16
STR_MAX = {
    bodies.TrainBody: {"booking_id": ID, "manifest_digest": DIGEST, "manifest_b64": MAX_BODY_BYTES,
                       "confirmation_ref": ID, "idempotency_key": ID},
    bodies.CancelBody: {"confirmation_ref": ID, "idempotency_key": ID},
    bodies.CleanupBody: {"confirmation_ref": ID, "idempotency_key": ID, "release_booking_id": ID,
                         "release_confirmation_ref": ID},
    bodies.ConfirmationBody: {"action": CHOICE, "booking_id": ID, "run_id": ID, "manifest_digest": DIGEST,
                              "manifest_b64": MAX_BODY_BYTES},
    bodies.AccountBody: {"name": NAME},
    bodies.TokenBody: {"role": CHOICE, "account_id": ID, "label": NAME},
    bodies.RevokeBody: {"token_id": ID},
    bodies.BookingBody: {"account_id": ID, "gpu_type": LABEL, "topology": LABEL, "region": LABEL, "network": LABEL},
    bodies.AmendBody: {"region": LABEL, "network": LABEL, "topology": LABEL},
    bodies.EmptyBody: {},
    bodies.ConfirmationRefBody: {"confirmation_ref": ID},
    bodies.ApproveBody: {"confirmation_ref": ID, "manifest_digest": DIGEST},
    bodies.DecisionBody: {"decision": CHOICE},
    bodies.PageQuery: {},
    bodies.BookingsQuery: {"account_id": ID},
    bodies.QuoteBody: {"booking_id": ID, "manifest_digest": DIGEST, "manifest_b64": MAX_BODY_BYTES},
    bodies.RunsQuery: {"manifest_digest": DIGEST, "booking_id": ID, "state": CHOICE, "after": ID},
    bodies.BudgetsQuery: {"manifest_digest": DIGEST},
}
MODELS = sorted(STR_MAX, key=lambda m: m.__name__)


def base(model) -> dict:
    """The smallest valid instance of `model`, every field given."""
    values: dict[str, Any] = {name: "a" for name in STR_MAX[model]}
    values.update({name: low for (m, name), (low, _high) in INT_BOUNDS.items() if m is model})
    return values


def test_every_model_field_has_a_tested_bound() -> None:
    declared = {m for m in vars(bodies).values() if isinstance(m, type) and issubclass(m, bodies.Strict)}
    assert declared - {bodies.Strict} == set(MODELS)
    for model in MODELS:
        ints = {name for (m, name) in INT_BOUNDS if m is model}
        assert set(model.model_fields) == set(STR_MAX[model]) | ints, model.__name__
        assert model.model_config["extra"] == "forbid" and model.model_config["strict"] is True
        bodies.parse(model, base(model))


def test_the_amend_model_takes_exactly_the_amendable_terms() -> None:
    assert set(bodies.AmendBody.model_fields) == set(AMENDABLE)


@pytest.mark.parametrize("model, name", sorted(INT_BOUNDS, key=lambda k: (k[0].__name__, k[1])),
                         ids=lambda v: getattr(v, "__name__", v))
def test_integer_fields_are_bounded_at_both_ends(model, name) -> None:
    low, high = INT_BOUNDS[(model, name)]
    for value in (low, low + 1, high - 1, high):
        assert getattr(bodies.parse(model, {**base(model), name: value}), name) == value
    for value in (low - 1, high + 1, 10**23, -(10**23)):
        with pytest.raises(bodies.ItoError) as refused:
            bodies.parse(model, {**base(model), name: value})
        assert refused.value.code.value == "USAGE_ERROR"
        assert refused.value.message == f"field '{name}' is out of range"
        assert str(value) not in refused.value.message
    for wrong in (True, float(low), str(low), [low], {"v": low}):
        with pytest.raises(bodies.ItoError) as refused:
            bodies.parse(model, {**base(model), name: wrong})
        assert refused.value.message == f"field '{name}' is missing or has the wrong type"


@pytest.mark.parametrize("model, name", [(m, n) for m in MODELS for n in STR_MAX[m]],
                         ids=lambda v: getattr(v, "__name__", v))
def test_string_fields_are_bounded_and_refuse_nul(model, name) -> None:
    limit = STR_MAX[model][name]
    for value in ("", "x", "x" * (limit - 1), "x" * limit):
        assert getattr(bodies.parse(model, {**base(model), name: value}), name) == value
    too_long = SECRET + "x" * (limit + 1 - len(SECRET))
    cases = {too_long: "is too long", "a\x00b": "contains a NUL character", "\x00": "contains a NUL character",
             SECRET[:limit - 1] + "\x00": "contains a NUL character"}
    for value, rule in cases.items():
        with pytest.raises(bodies.ItoError) as refused:
            bodies.parse(model, {**base(model), name: value})
        assert refused.value.message == f"field '{name}' {rule}"
        assert SECRET not in refused.value.message
    for wrong in (7, True, [SECRET], {"s": SECRET}, 1.5):
        with pytest.raises(bodies.ItoError) as refused:
            bodies.parse(model, {**base(model), name: wrong})
        assert refused.value.message == f"field '{name}' is missing or has the wrong type"
        assert SECRET not in refused.value.message


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_an_unknown_field_is_refused_without_echoing_its_name(model) -> None:
    with pytest.raises(bodies.ItoError) as refused:
        bodies.parse(model, {**base(model), SECRET: 1})
    assert refused.value.code.value == "USAGE_ERROR"
    assert SECRET not in refused.value.message
    assert refused.value.message.endswith(f"(it takes: {', '.join(model.model_fields) or 'none'})")


@pytest.mark.parametrize("model", [m for m in MODELS if any(f.is_required() for f in m.model_fields.values())],
                         ids=lambda m: m.__name__)
def test_a_missing_or_null_required_field_is_named(model) -> None:
    for name, info in model.model_fields.items():
        if not info.is_required():
            continue
        for values in ({k: v for k, v in base(model).items() if k != name}, {**base(model), name: None}):
            with pytest.raises(bodies.ItoError) as refused:
                bodies.parse(model, values)
            assert refused.value.message == f"field '{name}' is missing or has the wrong type"


# --- the models on the routes ---------------------------------------------------------------

def test_a_huge_gpu_count_is_a_usage_error_where_the_ledger_would_fail(world) -> None:
    terms = {k: v for k, v in booking_body(world, num_gpus=10**23).items() if k != "account_id"}
    with pytest.raises(OverflowError):  # what used to answer 500: SQLite cannot store the number
        bookings.create(world.ledger, world.account_id, BookingTerms(**terms), actor=None)
    reply = world.call("POST", "/v1/desk/bookings", booking_body(world, num_gpus=10**23))
    assert_usage(reply, "num_gpus")
    assert str(10**23) not in reply.text


@pytest.mark.parametrize("changes, status, field", [
    ({"num_gpus": 65536}, 200, None), ({"num_gpus": 65537}, 400, "num_gpus"), ({"num_gpus": 0}, 400, "num_gpus"),
    ({"num_gpus": 1}, 200, None),
    ({"num_nodes": 65536, "num_gpus": 65536}, 200, None), ({"num_nodes": 65537}, 400, "num_nodes"),
    ({"price_per_gpu_hour_cents": 10**15}, 200, None), ({"price_per_gpu_hour_cents": 10**15 + 1}, 400,
                                                        "price_per_gpu_hour_cents"),
    ({"price_per_gpu_hour_cents": 1}, 200, None), ({"price_per_gpu_hour_cents": 0}, 400, "price_per_gpu_hour_cents"),
    ({"ends_at": 2**53}, 200, None), ({"ends_at": 2**53 + 1}, 400, "ends_at"),
    ({"starts_at": -1}, 400, "starts_at"),
    ({"num_gpus": "8"}, 400, "num_gpus"), ({"num_gpus": 8.0}, 400, "num_gpus"), ({"num_gpus": True}, 400, "num_gpus"),
    ({"region": "r" * 64}, 200, None), ({"region": "r" * 65}, 400, "region"), ({"region": "r\x00"}, 400, "region"),
    ({"account_id": "acc\x00"}, 400, "account_id"), ({"extra": 1}, 400, None),
])
def test_booking_terms_on_the_route(world, changes, status, field) -> None:
    reply = world.call("POST", "/v1/desk/bookings", booking_body(world, **changes))
    if status == 200:
        assert reply.status == 200, reply
        assert all(reply.document["data"][k] == v for k, v in changes.items())
    else:
        assert_usage(reply, field)


def test_the_approved_cost_is_bounded_on_the_route(world) -> None:
    ref = "cfr_" + "0" * 26
    at_limit = world.call("POST", "/v1/desk/confirmations/approve", {"confirmation_ref": ref, "cost_cents": 10**15})
    assert at_limit.document["error"]["code"] == "CONFIRMATION_INVALID"  # past the model, to the gate
    for cost in (10**15 + 1, -1, 10**23):
        body = {"confirmation_ref": ref, "cost_cents": cost}
        assert_usage(world.call("POST", "/v1/desk/confirmations/approve", body), "cost_cents")


def test_names_are_bounded_by_the_ledger_column(world) -> None:
    name = f"n-{uuid.uuid4().hex}".ljust(128, "n")
    assert world.call("POST", "/v1/desk/accounts", {"name": name}).status == 200
    assert_usage(world.call("POST", "/v1/desk/accounts", {"name": name + "n"}), "name")
    label = world.call("POST", "/v1/desk/tokens", {"role": "desk", "label": "l" * 129})
    assert_usage(label, "label")


def test_the_error_message_names_the_field_never_the_value(world) -> None:
    for body in ({"name": [SECRET]}, {"name": SECRET + "\x00"}, {"name": SECRET * 10}, {SECRET: "x", "name": "y"}):
        reply = world.call("POST", "/v1/desk/accounts", body)
        assert_usage(reply)
        assert SECRET not in reply.text


def test_an_unknown_field_on_a_route_is_refused(world) -> None:
    before = world.count(audit_events)
    reply = world.call("POST", "/v1/desk/tokens", {"role": "desk", "label": "x", "expires": 5})
    assert_usage(reply)
    assert world.count(audit_events) == before
    empty = world.call("POST", f"/v1/desk/bookings/{world.booking}/revoke", {"reason": "x"})
    assert_usage(empty)


def test_the_fields_an_action_needs_are_still_required(world) -> None:
    assert_usage(world.call("POST", "/v1/confirmations", {"action": "cancel"}, token="account"), "run_id")
    assert_usage(world.call("POST", "/v1/confirmations", {"action": "release"}, token="account"), "booking_id")
    train = world.call("POST", "/v1/confirmations", {"action": "train", "booking_id": world.booking}, token="account")
    assert_usage(train, "manifest_b64")
    cleanup = world.call("POST", "/v1/cleanup", {"confirmation_ref": "cfr_" + "0" * 26,
                                                 "idempotency_key": "cleanup-key-0001",
                                                 "release_booking_id": world.booking}, token="account")
    assert_usage(cleanup, "release_confirmation_ref")
    action = world.call("POST", "/v1/confirmations", {"action": "teleport"}, token="account")
    assert_usage(action, "action")


def test_a_valid_body_still_goes_through_every_gate(world) -> None:
    content = world.manifest_bytes(f"through-{uuid.uuid4().hex[:8]}")
    body = {"action": "train", "booking_id": world.booking, "manifest_digest": world.digest(content),
            "manifest_b64": base64.b64encode(content).decode()}
    issued = world.call("POST", "/v1/confirmations", body, token="account")
    assert issued.status == 200, issued
    ref = issued.document["data"]["confirmation_ref"]
    cost = issued.document["data"]["binding"]["cost_cents"]
    assert world.call("POST", "/v1/desk/confirmations/approve", {"confirmation_ref": ref, "cost_cents": cost,
                                                                  "manifest_digest": None}).status == 200
    run = world.call("POST", "/v1/runs", {**{k: v for k, v in body.items() if k != "action"},
                                          "confirmation_ref": ref, "idempotency_key": f"k-{uuid.uuid4().hex}"},
                     token="account")
    assert run.status == 200 and run.document["data"]["replayed"] is False, run


# --- path and query parameters --------------------------------------------------------------

@pytest.mark.parametrize("template, method, who, found_code", [
    ("/v1/runs/{}", "GET", "account", "RUN_NOT_FOUND"),
    ("/v1/runs/{}/logs", "GET", "account", "RUN_NOT_FOUND"),
    ("/v1/runs/{}/cancel", "POST", "account", "RUN_NOT_FOUND"),
    ("/v1/idempotency-keys/{}", "GET", "account", "IDEMPOTENCY_KEY_INVALID"),
    ("/v1/desk/bookings/{}/complete", "POST", "desk", "BOOKING_NOT_FOUND"),
    ("/v1/desk/bookings/{}/amend", "POST", "desk", "BOOKING_NOT_FOUND"),
    ("/v1/desk/runs/{}/proposals", "GET", "desk", "RUN_NOT_FOUND"),
])
def test_path_parameters_are_bounded_before_the_ledger(world, template, method, who, found_code) -> None:
    body = {"confirmation_ref": "cfr_" + "0" * 26, "idempotency_key": "path-key-0001"} if "cancel" in template else (
        {"region": "r2"} if "amend" in template else {} if method == "POST" else None)
    at_limit = world.call(method, template.format("x" * 256), body, token=who)
    assert at_limit.document["error"]["code"] == found_code, at_limit  # the gate's own answer
    for value in ("x" * 257, "x\x00y", "\x00"):
        reply = world.call(method, template.format(value), body, token=who)
        assert_usage(reply)
        assert "path parameter" in reply.document["error"]["message"]


def test_a_proposal_id_is_bounded_like_any_path_parameter(world) -> None:
    path = f"/v1/desk/runs/{world.run_id}/proposals/"
    at_limit = world.call("POST", path + "s" * 256, {"decision": "approve"})
    assert at_limit.document["error"]["code"] == "PROPOSAL_NOT_FOUND", at_limit
    assert_usage(world.call("POST", path + "s" * 257, {"decision": "approve"}), "proposal_id")
    assert_usage(world.call("POST", path + "spk\x00", {"decision": "approve"}), "proposal_id")


@pytest.mark.parametrize("query, ok", [
    ("after=0&limit=1", True), ("after=9223372036854775807&limit=500", True), ("", True),
    ("limit=0", False), ("limit=501", False), ("after=-1", False), ("after=9223372036854775808", False),
    ("after=" + "9" * 40, False), ("limit=abc", False), ("limit=1&limit=2", False), ("colour=red", False),
    ("limit=%00", False),
])
def test_paging_parameters_are_bounded(world, query, ok) -> None:
    for kind in ("logs", "metrics", "checkpoints"):
        reply = world.call("GET", f"/v1/runs/{world.run_id}/{kind}", token="account", query=query)
        if ok:
            assert reply.status == 200, reply
        else:
            assert_usage(reply)


def test_the_bookings_filter_is_bounded(world) -> None:
    mine = world.call("GET", "/v1/desk/bookings", query=f"account_id={world.account_id}")
    assert mine.status == 200 and {b["account_id"] for b in mine.document["data"]["bookings"]} == {world.account_id}
    # 256 characters pass the bound and name no account.
    longest = world.call("GET", "/v1/desk/bookings", query="account_id=" + "a" * 256).document
    assert longest["error"]["code"] == "ACCOUNT_NOT_FOUND"
    assert_usage(world.call("GET", "/v1/desk/bookings", query="account_id=" + "a" * 257), "account_id")
    assert_usage(world.call("GET", "/v1/desk/bookings", query="account_id=acc%00"), "account_id")


# --- PostgreSQL: a NUL byte is a DataError there, so it must never reach it ------------------

def _pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", connect_timeout=2):
            return True
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture(scope="module")
def pg_world():
    if not _pg_available():
        pytest.skip("PostgreSQL on 127.0.0.1:5432 is not reachable")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    root = Path(tempfile.mkdtemp(prefix="ito-bodies-pg-"))
    built = World(root, PG_URL, schema)
    yield built
    built.close()
    engine = sa.create_engine(PG_URL)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    engine.dispose()
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.postgres
def test_nul_bytes_are_usage_errors_on_postgresql(pg_world) -> None:
    with pytest.raises(sa.exc.DataError):  # what used to answer 500
        identity.revoke_token(pg_world.ledger, "tok_\x00", actor=None)
    cases = [
        ("POST", "/v1/desk/tokens/revoke", {"token_id": "tok_\x00"}, "desk", None),
        ("POST", "/v1/desk/bookings", booking_body(pg_world, account_id="acc_\x00"), "desk", None),
        ("POST", "/v1/desk/accounts", {"name": "a\x00"}, "desk", None),
        ("POST", "/v1/desk/bookings/bkg_\x00/complete", {}, "desk", None),
        ("GET", "/v1/runs/run_\x00", None, "account", None),
        ("GET", "/v1/idempotency-keys/key\x00key\x00", None, "account", None),
        ("GET", "/v1/desk/bookings", None, "desk", "account_id=acc_%00"),
        ("POST", "/v1/confirmations", {"action": "release", "booking_id": "bkg\x00"}, "account", None),
    ]
    for method, path, body, who, query in cases:
        reply = pg_world.call(method, path, body, token=who, query=query or "")
        assert_usage(reply)
    long_name = pg_world.call("POST", "/v1/desk/accounts", {"name": "n" * 129})
    assert_usage(long_name, "name")  # varchar(128): a DataError on PostgreSQL too


@pytest.mark.postgres
def test_bounds_hold_on_postgresql(pg_world) -> None:
    top = pg_world.call("POST", "/v1/desk/bookings", booking_body(pg_world, num_gpus=65536, ends_at=2**53,
                                                                  price_per_gpu_hour_cents=10**15))
    assert top.status == 200, top
    name = f"pg-{uuid.uuid4().hex}".ljust(128, "n")
    assert pg_world.call("POST", "/v1/desk/accounts", {"name": name}).status == 200
    assert_usage(pg_world.call("POST", "/v1/desk/bookings", booking_body(pg_world, num_gpus=10**23)), "num_gpus")

