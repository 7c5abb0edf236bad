"""What every route shares: JSON envelopes (DESIGN.md, client contract), one HTTP status per
error code, bearer authentication and bounded request bodies.

Handlers are plain functions run in the thread pool (the ledger is synchronous SQLAlchemy);
they raise ItoError and never build error responses themselves.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import sys
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ito_assets.api import envelope
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.gates import identity
from ito_assets.gates.identity import Identity
from ito_assets.gates.ledger import Ledger
from ito_assets.gates.policy import GatePolicy

log = logging.getLogger("ito.api")

# A base64 manifest at the 256 KiB read limit is ~342 KiB; 1 MiB leaves room and bounds memory.
MAX_BODY_BYTES = 1024 * 1024

_STATUS = {
    ErrorCode.AUTH_REQUIRED: 401, ErrorCode.CREDENTIAL_REVOKED: 401, ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.BOOKING_NOT_FOUND: 404, ErrorCode.RUN_NOT_FOUND: 404, ErrorCode.PROPOSAL_NOT_FOUND: 404,
    ErrorCode.PROPOSAL_ALREADY_DECIDED: 409,
    ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT: 409, ErrorCode.IDEMPOTENCY_KEY_REUSED: 409,
    ErrorCode.CONFIRMATION_CONSUMED: 409, ErrorCode.RUN_FINISHED: 409,
    ErrorCode.CONFIRMATION_INVALID: 403, ErrorCode.CONFIRMATION_NOT_APPROVED: 403,
    ErrorCode.CONFIRMATION_EXPIRED: 403, ErrorCode.CONFIRMATION_MISMATCH: 403,
    ErrorCode.BOOKING_EXPIRED: 403, ErrorCode.BOOKING_REVOKED: 403, ErrorCode.BOOKING_RELEASED: 403,
    ErrorCode.BOOKING_INCOMPLETE: 403, ErrorCode.BOOKING_MISMATCH: 403,
    ErrorCode.BUDGET_EXCEEDED: 422, ErrorCode.CAPACITY_UNAVAILABLE: 422, ErrorCode.NETWORK_MISMATCH: 422,
    ErrorCode.DATA_POLICY_VIOLATION: 422, ErrorCode.CHECKPOINT_STORAGE_INVALID: 422,
    ErrorCode.PLAN_REFUSED: 422, ErrorCode.PROVENANCE_MISSING: 422,
    ErrorCode.MANIFEST_TOO_LARGE: 413, ErrorCode.INTERNAL_ERROR: 500,
}


@dataclass(frozen=True)
class Api:
    """What the routes need, built once by `ito serve`."""

    ledger: Ledger
    policy: GatePolicy


def respond(document: dict, status: int = 200) -> Response:
    return Response(envelope.dumps(document), status_code=status, media_type="application/json",
                    headers={"Cache-Control": "no-store"})


def ok(data: dict) -> Response:
    return respond(envelope.success(data, live_api_contacted=True))


def failed(error: ItoError) -> Response:
    return respond(envelope.failure(error, live_api_contacted=True), _STATUS.get(error.code, 400))


async def read_json(request: Request) -> dict:
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > MAX_BODY_BYTES:
            raise ItoError(ErrorCode.MANIFEST_TOO_LARGE, "the request body exceeds the size limit")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks) or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ItoError(ErrorCode.USAGE_ERROR, "the request body is not JSON") from None
    if not isinstance(body, dict):
        raise ItoError(ErrorCode.USAGE_ERROR, "the request body must be a JSON object")
    return body


def field(body: dict, name: str, kind: type = str, *, required: bool = True) -> Any:
    """A typed field of the body; the message names the field, never its value."""
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ItoError(ErrorCode.USAGE_ERROR, f"field '{name}' is missing or has the wrong type")
    return value


def decode_b64(body: dict, name: str) -> bytes:
    try:
        return base64.b64decode(field(body, name), validate=True)
    except (binascii.Error, ValueError):
        raise ItoError(ErrorCode.USAGE_ERROR, f"field '{name}' must be base64") from None


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


Handler = Callable[[Api, Identity, Request, dict], dict]


def endpoint(api: Api, handler: Handler, *, with_body: bool = False,
             public: bool = False) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a synchronous handler: authenticate, read the body, run it in the thread pool and
    turn its ItoError (or any other exception, as INTERNAL_ERROR) into the envelope."""

    async def route(request: Request) -> Response:
        try:
            body = await read_json(request) if with_body else {}
            token = bearer(request)

            def call() -> dict:
                who = None if public else identity.authenticate(api.ledger, token)
                return handler(api, who, request, body)

            return ok(await run_in_threadpool(call))
        except ItoError as error:
            return failed(error)
        except Exception as exc:  # noqa: BLE001 - a safe code for the caller; the type for the operator
            print(f"ito serve: internal error in {request.method} {request.url.path}: {type(exc).__name__}",
                  file=sys.stderr)
            return failed(ItoError(ErrorCode.INTERNAL_ERROR, "an internal error occurred"))

    return route
