"""A Hypothesis state machine over the client's retry logic: requests lost before
they arrive, answers lost after the server committed, lookups that fail, and revocation.
Whatever happens, a key never has more than one run, every success names that run, and a
revoked credential ends the call without another request.

The server side is the real application of `ito serve` (its routes over a SQLite ledger), called
in process by a transport that injects the faults; the client is the real `ApiClient`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import sqlalchemy as sa
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ito_assets.api.routes.common import Api
from ito_assets.api.server import build_app
from ito_assets.api.client import ApiClient, NoAnswer, NotDelivered, Reply
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import bookings, confirm_request, confirmations, identity, intake
from ito_assets.control.bookings import BookingTerms
from ito_assets.control.fingerprint import request_fingerprint
from ito_assets.control.ledger import open_ledger, runs as runs_table
from ito_assets.control.policy import ServerPolicy
from ito_assets.control.states import Role

from helpers import valid_manifest

FAULTS = ("deliver", "lose_request", "lose_answer", "lose_before_processing")
KEYS = ("retry-key-0001", "retry-key-0002", "retry-key-0003")
NOW = 1_800_000_000


class FaultyTransport:
    """Dispatches to the core like `ito serve` would, failing as the fault plan says."""

    def __init__(self, machine: "RetryMachine"):
        self.m = machine
        self.plan: list[str] = []
        self.num_calls = 0
        self.revoked_answer_at = -1  # the call number of the last revoked answer that arrived

    def request(self, method: str, path: str, body: dict | None) -> Reply:
        self.num_calls += 1
        fault = self.plan.pop(0) if self.plan else "deliver"
        if fault == "lose_request":
            raise NotDelivered()
        if fault == "lose_before_processing":
            raise NoAnswer()
        reply = self._dispatch(method, path, body)
        if fault == "lose_answer":
            raise NoAnswer()  # the server did the work; the answer never arrives
        if (reply.document.get("error") or {}).get("code") == "CREDENTIAL_REVOKED":
            self.revoked_answer_at = self.num_calls
        return reply

    def _dispatch(self, method: str, path: str, body: dict | None) -> Reply:
        status, document = asgi_request(self.m.app, method, path, body, token=self.m.token)
        return Reply(status, document)


def asgi_request(app, method: str, path: str, body: dict | None, *, token: str) -> tuple[int, dict]:
    """One request through the real application of `ito serve` (its routes, authentication and
    envelope), in process: the ASGI call that uvicorn would make, without a socket."""
    payload = b"" if body is None else json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {token}".encode()),
                         (b"content-type", b"application/json"),
                         (b"content-length", str(len(payload)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    incoming = [{"type": "http.request", "body": payload, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))


class RetryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ito-retry-"))
        self.ledger = open_ledger(f"sqlite:///{self.dir / 'ledger.db'}", clock=lambda: NOW)
        (self.dir / "data").mkdir()
        self.policy = ServerPolicy(data_root=self.dir / "data", allowed_data_roots=(self.dir / "data",),
                                 tenants_root=self.dir / "tenants", max_concurrent_runs_per_booking=len(KEYS))
        desk = identity.issue_token(self.ledger, Role.DESK, account_id=None, label="d", actor=None)
        account = identity.create_account(self.ledger, "lab", actor=None)
        self.token = identity.issue_token(self.ledger, Role.ACCOUNT, account_id=account.account_id, label="a",
                                          actor=None).secret
        who = identity.authenticate(self.ledger, self.token)
        terms = BookingTerms(gpu_type="H100", num_gpus=8, num_nodes=1, topology="t", region="r", network="ib-400g",
                             starts_at=NOW - 60, ends_at=NOW + 3600, price_per_gpu_hour_cents=1)
        self.booking = bookings.create(self.ledger, account.account_id, terms, actor=None).booking_id
        bookings.transition(self.ledger, self.booking, "complete", actor=None)
        self.bodies = {}
        for index, key in enumerate(KEYS):
            document = valid_manifest()
            document["name"] = f"retry-{index}"
            content = json.dumps(document).encode()
            verified = intake.verify_submitted(content, "sha256:" + hashlib.sha256(content).hexdigest(),
                                               max_bytes=1 << 20)
            issued = confirm_request.request_train(self.ledger, self.policy, who, self.booking, verified)
            confirmations.approve(self.ledger, issued.ref, approver_token_id=desk.token_id,
                                  expected_cost_cents=issued.confirmation.cost_cents)
            self.bodies[key] = {"booking_id": self.booking, "manifest_digest": verified.digest,
                                "manifest_b64": base64.b64encode(content).decode(),
                                "confirmation_ref": issued.ref, "idempotency_key": key}
        self.revoked = False
        self.app = build_app(Api(ledger=self.ledger, policy=self.policy))
        self.transport = FaultyTransport(self)
        self.seen: dict[str, set[str]] = {key: set() for key in KEYS}

    @rule(key=st.sampled_from(KEYS), plan=st.lists(st.sampled_from(FAULTS), max_size=6))
    def train(self, key: str, plan: list[str]) -> None:
        self.transport.plan = list(plan)
        client = ApiClient(self.transport, sleep=lambda _s: None)
        calls_before = self.transport.num_calls
        try:
            body = self.bodies[key]
            data = client.post_idempotent("/v1/runs", body, key=key, action="train", fingerprint=request_fingerprint(
                "train", booking_id=body["booking_id"], manifest_digest=body["manifest_digest"]))
        except ItoError as error:
            allowed = {ErrorCode.OUTCOME_UNKNOWN, ErrorCode.API_UNREACHABLE}
            if self.revoked:
                allowed = {ErrorCode.CREDENTIAL_REVOKED, *allowed}
            assert error.code in allowed, error.code
            if error.code is ErrorCode.CREDENTIAL_REVOKED:
                # Stopped at the revoked answer: no request after it, and no login attempt.
                assert self.transport.revoked_answer_at == self.transport.num_calls > calls_before
            return
        assert not self.revoked, "a revoked token never yields a run"
        self.seen[key].add(data["run_id"])

    @precondition(lambda self: not self.revoked)
    @rule()
    def revoke(self) -> None:
        who = identity.authenticate(self.ledger, self.token)
        identity.revoke_token(self.ledger, who.token_id, actor=None)
        self.revoked = True

    @invariant()
    def at_most_one_run_per_key(self) -> None:
        with self.ledger.read() as conn:
            rows = conn.execute(sa.select(runs_table.c.idempotency_key, runs_table.c.run_id)).all()
        per_key: dict[str, list[str]] = {}
        for key, run_id in rows:
            per_key.setdefault(key, []).append(run_id)
        assert all(len(ids) == 1 for ids in per_key.values())
        for key, seen in self.seen.items():
            assert seen <= set(per_key.get(key, [])) and len(seen) <= 1

    def teardown(self) -> None:
        self.ledger.dispose()
        shutil.rmtree(self.dir, ignore_errors=True)


RetryMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=12, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
TestRetryMachine = RetryMachine.TestCase
