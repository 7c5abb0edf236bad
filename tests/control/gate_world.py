"""Builders for the core gate tests: ledgers on both backends, a settable clock, manifests and a
small world (desk, account, completed booking). Imported by conftest.py and the tests."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import valid_manifest
from ito_assets.control import bookings, confirmations, confirm_request, identity, intake
from ito_assets.control.bookings import BookingTerms
from ito_assets.control.identity import Identity
from ito_assets.control.ledger import Ledger, open_ledger
from ito_assets.control.policy import ServerPolicy
from ito_assets.control.states import Role

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
T0 = 1_800_000_000  # a fixed "now" for the settable clock


def postgres_reason() -> str | None:
    """Why PostgreSQL tests cannot run here, or None when the server answers."""
    try:
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", connect_timeout=2):
            return None
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
        return f"PostgreSQL on 127.0.0.1:5432 is not reachable ({type(exc).__name__}); Postgres ledger tests skipped"


_PG_REASON = postgres_reason()


class Clock:
    def __init__(self, now: int = T0):
        self.now = now

    def __call__(self) -> int:
        return self.now


def make_ledger(backend: str, tmp_path: Path, clock: Clock):
    """A fresh ledger; the PostgreSQL one lives in a schema of its own, dropped afterwards."""
    if backend == "sqlite":
        ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}", clock=clock)
        return ledger, lambda: ledger.dispose()
    if _PG_REASON:
        pytest.skip(_PG_REASON)
    schema = f"t_{uuid.uuid4().hex[:16]}"
    ledger = open_ledger(PG_URL, schema=schema, clock=clock)

    def drop() -> None:
        ledger.dispose()
        admin = open_ledger(PG_URL, create=False)
        with admin.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.dispose()
    return ledger, drop


def make_policy(tmp_path: Path, **changes) -> ServerPolicy:
    data_root = tmp_path / "data"
    data_root.mkdir(exist_ok=True)
    return ServerPolicy(**{"data_root": data_root, "allowed_data_roots": (data_root,),
                         "tenants_root": tmp_path / "tenants", **changes})


TERMS = dict(gpu_type="H100", num_gpus=8, num_nodes=1, topology="1x8-nvlink", region="eu-west",
             network="ib-400g", starts_at=T0 - 3600, ends_at=T0 + 3600, price_per_gpu_hour_cents=100)
COST = 100 * 8 * 2  # price x GPUs x the two booked hours, in cents


def manifest_bytes(**changes) -> bytes:
    document = valid_manifest()
    for dotted, value in changes.items():
        target, *path = dotted.split("__")
        node = document
        keys = [target, *path]
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        last = keys[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return json.dumps(document, indent=2).encode()


def verified(content: bytes | None = None):
    import hashlib

    content = manifest_bytes() if content is None else content
    return intake.verify_submitted(content, "sha256:" + hashlib.sha256(content).hexdigest(), max_bytes=1 << 20)


@dataclass
class World:
    ledger: Ledger
    policy: ServerPolicy
    clock: Clock
    desk: Identity
    account: Identity
    other: Identity
    booking_id: str

    def booking(self, account: Identity | None = None, complete: bool = True, **terms) -> str:
        owner = (account or self.account).account_id
        made = bookings.create(self.ledger, owner, BookingTerms(**{**TERMS, **terms}), actor=self.desk.token_id)
        if complete:
            bookings.transition(self.ledger, made.booking_id, "complete", actor=self.desk.token_id)
        return made.booking_id

    def confirm_train(self, booking_id: str | None = None, manifest=None, *, approve: bool = True,
                      account: Identity | None = None) -> str:
        issued = confirm_request.request_train(self.ledger, self.policy, account or self.account,
                                               booking_id or self.booking_id, manifest or verified())
        if approve:
            confirmations.approve(self.ledger, issued.ref, approver_token_id=self.desk.token_id,
                                  expected_cost_cents=issued.confirmation.cost_cents)
        return issued.ref

    def approve(self, ref: str, cost: int = 0) -> None:
        confirmations.approve(self.ledger, ref, approver_token_id=self.desk.token_id, expected_cost_cents=cost)


def new_run(world: World, *, booking_id: str | None = None, account: Identity | None = None,
            content: bytes | None = None, key: str | None = None):
    """A run created through every gate, on the world's booking unless another is named."""
    from ito_assets.control import create_run

    account = account or world.account
    booking_id = booking_id or world.booking_id
    manifest = verified(content)
    ref = world.confirm_train(booking_id, manifest, account=account)
    request = create_run.TrainRequest(booking_id=booking_id, verified=manifest, confirmation_ref=ref,
                                      idempotency_key=key or f"train-{uuid.uuid4().hex[:12]}")
    return create_run.create_run(world.ledger, world.policy, account, request).run


def make_identity(ledger: Ledger, role: Role, account_id: str | None) -> Identity:
    issued = identity.issue_token(ledger, role, account_id=account_id, label="test", actor=None)
    return identity.authenticate(ledger, issued.secret)


def make_world(ledger: Ledger, policy: ServerPolicy, clock: Clock) -> World:
    desk = make_identity(ledger, Role.DESK, None)
    acct = identity.create_account(ledger, "lab", actor=desk.token_id)
    other = identity.create_account(ledger, "rival", actor=desk.token_id)
    w = World(ledger, policy, clock, desk, make_identity(ledger, Role.ACCOUNT, acct.account_id),
              make_identity(ledger, Role.ACCOUNT, other.account_id), booking_id="")
    w.booking_id = w.booking()
    return w


def at_once(*calls) -> list:
    """Each call on its own thread, started together; what each returned, or the exception it raised."""
    import threading

    answers: list = [None] * len(calls)

    def one(index: int) -> None:
        try:
            answers[index] = calls[index]()
        except Exception as error:  # noqa: BLE001 - the test reports what it got
            answers[index] = error
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers
