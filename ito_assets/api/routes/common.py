"""What every route shares: JSON envelopes (the one shape the client reads), one HTTP status per
error code, bearer authentication and bounded request bodies.

A request is authenticated from its headers before a byte of its body is read, so a caller
without a valid token costs one header parse and never a body buffer. Bodies are capped while
they stream, decoded by the manifest's strict JSON reader and validated by the route's model
(api/bodies.py). Handlers are plain functions run in the thread pool (the ledger is synchronous
SQLAlchemy); they raise ItoError and never build error responses themselves.
"""

from __future__ import annotations

import base64
import binascii
import logging
import sys
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import sqlalchemy as sa
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ito_assets.api import envelope
from ito_assets.api.bodies import MAX_BODY_BYTES, Strict, check_path_params, parse
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.control import identity
from ito_assets.control.identity import Identity
from ito_assets.control.ledger import Ledger
from ito_assets.control.policy import ServerPolicy
from ito_assets.control.states import Role
from ito_assets.manifest.strict_json import StrictJsonError, loads_strict

__all__ = ["MAX_BODY_BYTES", "Api", "decode_b64", "endpoint", "failed", "ok", "read_body", "respond"]

log = logging.getLogger("ito.api")

_STATUS = {
    ErrorCode.AUTH_REQUIRED: 401, ErrorCode.CREDENTIAL_REVOKED: 401, ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.ACCOUNT_NOT_FOUND: 404, ErrorCode.BOOKING_NOT_FOUND: 404, ErrorCode.RUN_NOT_FOUND: 404,
    ErrorCode.PROPOSAL_NOT_FOUND: 404,
    ErrorCode.PROPOSAL_ALREADY_DECIDED: 409,
    ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT: 409, ErrorCode.IDEMPOTENCY_KEY_REUSED: 409,
    ErrorCode.CONFIRMATION_CONSUMED: 409, ErrorCode.RUN_FINISHED: 409,
    ErrorCode.CONFIRMATION_INVALID: 403, ErrorCode.CONFIRMATION_NOT_APPROVED: 403,
    ErrorCode.CONFIRMATION_EXPIRED: 403, ErrorCode.CONFIRMATION_MISMATCH: 403,
    ErrorCode.BOOKING_EXPIRED: 403, ErrorCode.BOOKING_REVOKED: 403, ErrorCode.BOOKING_RELEASED: 403,
    ErrorCode.BOOKING_INCOMPLETE: 403, ErrorCode.BOOKING_MISMATCH: 403, ErrorCode.BOOKING_NOT_STARTED: 403,
    ErrorCode.BUDGET_EXCEEDED: 422, ErrorCode.CAPACITY_UNAVAILABLE: 422, ErrorCode.NETWORK_MISMATCH: 422,
    ErrorCode.DATA_POLICY_VIOLATION: 422, ErrorCode.CHECKPOINT_STORAGE_INVALID: 422,
    ErrorCode.PLAN_REFUSED: 422, ErrorCode.PROVENANCE_MISSING: 422,
    ErrorCode.MANIFEST_TOO_LARGE: 413, ErrorCode.REQUEST_TOO_LARGE: 413,
    ErrorCode.INTERNAL_ERROR: 500, ErrorCode.STORAGE_FULL: 503, ErrorCode.SERVER_BUSY: 503,
}

_SQLITE_FULL = 13  # sqlite3's SQLITE_FULL result code
_PG_DISK_FULL = "53100"  # SQLSTATE disk_full


@dataclass(frozen=True)
class Api:
    """What the routes need, built once by `ito serve`."""

    ledger: Ledger
    policy: ServerPolicy


def respond(document: dict, status: int = 200, *, close: bool = False) -> Response:
    headers = {"Cache-Control": "no-store"}
    if close:
        headers["Connection"] = "close"
    return Response(envelope.dumps(document), status_code=status, media_type="application/json", headers=headers)


def ok(data: dict) -> Response:
    return respond(envelope.success(data, live_api_contacted=True))


def failed(error: ItoError, *, close: bool = False) -> Response:
    return respond(envelope.failure(error, live_api_contacted=True), _STATUS.get(error.code, 400), close=close)


def _too_large() -> ItoError:
    return ItoError(ErrorCode.REQUEST_TOO_LARGE, f"the request body exceeds the {MAX_BODY_BYTES}-byte limit")


async def read_body(request: Request) -> bytes:
    """The body, refused as soon as it is announced or grows past MAX_BODY_BYTES."""
    announced = request.headers.get("content-length")
    if announced is not None:
        if not (announced.isascii() and announced.isdigit()):
            raise ItoError(ErrorCode.USAGE_ERROR, "the Content-Length header is not a number")
        # Length first: int() of a header of a million digits is itself work an attacker chooses.
        digits = announced.lstrip("0")
        if len(digits) > len(str(MAX_BODY_BYTES)) or int(digits or "0") > MAX_BODY_BYTES:
            raise _too_large()
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(raw: bytes) -> Any:
    """The manifest's strict reader: no duplicate keys, no NaN, bounded depth and digits."""
    if not raw:
        return {}
    try:
        return loads_strict(raw)
    except StrictJsonError as exc:  # its messages never carry the input
        raise ItoError(ErrorCode.USAGE_ERROR, f"the request body is not strict JSON: {exc}") from None


def decode_b64(value: str, name: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ItoError(ErrorCode.USAGE_ERROR, f"field '{name}' must be base64") from None


def require(body: Strict, name: str) -> Any:
    """An optional field of the model that this request needs (which depends on another field)."""
    value = getattr(body, name)
    if value is None:
        raise ItoError(ErrorCode.USAGE_ERROR, f"field '{name}' is missing or has the wrong type")
    return value


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def storage_full(exc: BaseException) -> bool:
    """SQLite's SQLITE_FULL ("database or disk is full") or PostgreSQL's disk_full (53100)."""
    orig = getattr(exc, "orig", None) or exc
    if _PG_DISK_FULL in (getattr(orig, "sqlstate", None), getattr(orig, "pgcode", None)):
        return True
    if getattr(orig, "sqlite_errorcode", None) == _SQLITE_FULL:
        return True
    return "database or disk is full" in str(orig).lower()


Handler = Callable[[Api, Identity | None, Request, Any], dict]


def endpoint(api: Api, handler: Handler, *, body: type[Strict] | None = None, public: bool = False,
             role: Role | None = None) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a synchronous handler: authenticate from the headers (and require `role`), bound the
    path parameters, read and validate the body (as `body`, when the route takes one), run the
    handler in the thread pool and turn its ItoError (or any other exception, as INTERNAL_ERROR)
    into the envelope. The handler receives the validated model, or None without a body."""

    async def route(request: Request) -> Response:
        # An answer given before the body was read closes the connection: draining an unread
        # body of a refused request would spend the server's time on the caller's bytes.
        unread = body is not None
        try:
            who = None if public else await run_in_threadpool(identity.authenticate, api.ledger, bearer(request))
            if role is not None:
                who.require_role(role)
            check_path_params(request.path_params)
            raw = await read_body(request) if body is not None else b""
            unread = False

            def call() -> dict:
                parsed = parse(body, decode_json(raw)) if body is not None else None
                return handler(api, who, request, parsed)

            return ok(await run_in_threadpool(call))
        except ItoError as error:
            return failed(error, close=unread)
        except ClientDisconnect:
            # The client went away (or its read deadline closed it): nobody reads this answer.
            return failed(ItoError(ErrorCode.USAGE_ERROR, "the client disconnected"), close=True)
        except sa.exc.OperationalError as exc:
            if storage_full(exc):
                return failed(ItoError(ErrorCode.STORAGE_FULL, "the ledger's storage is full; nothing was "
                                                               "written; retry once space is freed"), close=unread)
            return _internal(request, exc, unread)
        except Exception as exc:  # noqa: BLE001 - a safe code for the caller; the type for the operator
            return _internal(request, exc, unread)

    return route


def _internal(request: Request, exc: BaseException, unread: bool) -> Response:
    # The route's template, not the path: a path carries whatever the caller put in it.
    template = getattr(request.scope.get("route"), "path", "?")
    print(f"ito serve: internal error in {request.method} {template}: {type(exc).__name__}", file=sys.stderr)
    return failed(ItoError(ErrorCode.INTERNAL_ERROR, "an internal error occurred"), close=unread)
