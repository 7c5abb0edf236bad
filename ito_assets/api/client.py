"""The `ito` client's transport and retry logic.

Every request has a bounded connect timeout and a bounded total time, and one Deadline bounds
the whole operation: all attempts, the backoff pauses between them and the lookup by
idempotency key share it, and each request's socket timeouts are cut to the time it leaves.
Failures are told apart by what may have reached the server:
  - NotDelivered: no connection, nothing sent -> retrying is always safe (API_UNREACHABLE).
    So are the server's own refusals made before any route read the request: a 408 (not read
    whole in time) and a 503 SERVER_BUSY (past its concurrency limit; SERVER_BUSY when every
    attempt met it).
  - NoAnswer: the request may have arrived, no complete answer came back -> ambiguous. A
    mutation with an idempotency key first asks the server what happened under that key and
    only retries when nothing did; when that lookup fails too the answer is OUTCOME_UNKNOWN.
    A mutation without a key is never retried after an ambiguous failure.
When the deadline runs out the answer is TIMEOUT, or OUTCOME_UNKNOWN once a mutation may have
been delivered. A revoked or missing credential ends the call at once: no retry, no login.
Errors carry safe messages: never the token, the URL's credentials, or a server's raw text.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import socket
import time
from dataclasses import dataclass
from typing import Callable, Protocol
from urllib.parse import quote

from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.strict_json import StrictJsonError, loads_strict

MAX_RESPONSE_BYTES = 8 * 1024 * 1024
_STOP_CODES = frozenset({ErrorCode.AUTH_REQUIRED, ErrorCode.CREDENTIAL_REVOKED, ErrorCode.PERMISSION_DENIED})
_REVOKED = {"ok": False, "error": {"code": ErrorCode.CREDENTIAL_REVOKED.value, "retryable": False,
                                   "message": "the API refused the credential (HTTP 401/403)"}}


class Deadline:
    """The end of one whole operation on a monotonic clock (injectable for tests)."""

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._end = clock() + seconds

    def left(self) -> float:
        return self._end - self._clock()

    def restart(self, seconds: float) -> None:
        self._end = self._clock() + seconds


class NotDelivered(Exception):
    """Nothing reached the server (connection refused, DNS, connect timeout)."""

    def __init__(self, timed_out: bool = False):
        super().__init__("not delivered")
        self.timed_out = timed_out


class ServerBusy(NotDelivered):
    """The server answered SERVER_BUSY before any route read the request: nothing was done."""


class NoAnswer(Exception):
    """The request may have reached the server, but no complete answer came back."""

    def __init__(self, timed_out: bool = False):
        super().__init__("no answer")
        self.timed_out = timed_out


class NotAnEnvelope(NoAnswer):
    """An answer came back whole, but it is no strict JSON envelope: not the API speaking."""


@dataclass(frozen=True)
class Reply:
    status: int
    document: dict


class Transport(Protocol):
    def request(self, method: str, path: str, body: dict | None) -> Reply: ...


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int

    @property
    def url(self) -> str:
        """scheme://host:port: ITO_API_URL refuses credentials, so this is safe to print."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def unreachable_message(endpoint: Endpoint | None) -> str:
    """API_UNREACHABLE's message: the URL tried, and how to start the API there."""
    if endpoint is None:
        return "the API could not be reached"
    from ito_assets.api.client_config import is_loopback

    if not is_loopback(endpoint.host):
        return (f"no API answers at {endpoint.url}: check that `ito serve` runs there, or set ITO_API_URL "
                "to the API's address")
    # `ito serve`'s defaults (server.DEFAULT_HOST and DEFAULT_PORT; server imports too much for here).
    flags = "" if endpoint.host == "127.0.0.1" else f" --host {endpoint.host}"
    flags += "" if endpoint.port == 8765 else f" --port {endpoint.port}"
    return (f"no API answers at {endpoint.url}: start it on this machine with `ito serve{flags}`, "
            "or set ITO_API_URL to the API's address")


class HttpTransport:
    """One HTTP/1.1 request per call over http.client, with a connect timeout and a deadline
    for the whole exchange (the socket timeout is re-armed with the time left before each read).
    With an operation `deadline`, both are cut to the time it leaves."""

    def __init__(self, endpoint: Endpoint, token: str | None, *, connect_timeout_s: float, total_timeout_s: float,
                 deadline: Deadline | None = None):
        self._endpoint = endpoint
        self._token = token
        self._connect_timeout_s = connect_timeout_s
        self._total_timeout_s = total_timeout_s
        self._deadline = deadline

    def __repr__(self) -> str:  # the token stays out of reprs and tracebacks
        return f"HttpTransport({self._endpoint.scheme}://{self._endpoint.host}:{self._endpoint.port})"

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint

    def _connection(self, connect_timeout_s: float) -> http.client.HTTPConnection:
        if self._endpoint.scheme == "https":
            import ssl

            return http.client.HTTPSConnection(self._endpoint.host, self._endpoint.port,
                                               timeout=connect_timeout_s, context=ssl.create_default_context())
        return http.client.HTTPConnection(self._endpoint.host, self._endpoint.port, timeout=connect_timeout_s)

    def request(self, method: str, path: str, body: dict | None) -> Reply:
        connect_s, total_s = self._connect_timeout_s, self._total_timeout_s
        if self._deadline is not None:
            left = self._deadline.left()
            if left <= 0:
                raise NotDelivered(timed_out=True)
            connect_s, total_s = min(connect_s, left), min(total_s, left)
        deadline = time.monotonic() + total_s
        conn = self._connection(connect_s)
        try:
            try:
                conn.connect()
            except (OSError, http.client.HTTPException) as exc:
                raise NotDelivered(timed_out=isinstance(exc, (socket.timeout, TimeoutError))) from None
            return self._exchange(conn, method, path, body, deadline)
        finally:
            conn.close()

    def _exchange(self, conn, method: str, path: str, body: dict | None, deadline: float) -> Reply:
        headers = {"Accept": "application/json", "Connection": "close"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        sock = conn.sock  # http.client drops conn.sock once a closing response is read; keep ours
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            chunks, total = [], 0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoAnswer(timed_out=True)
                sock.settimeout(left)
                chunk = response.read1(64 * 1024) if hasattr(response, "read1") else response.read(64 * 1024)
                if not chunk:
                    break
                total += len(chunk)
                if total > MAX_RESPONSE_BYTES:
                    raise NoAnswer()
                chunks.append(chunk)
        except (socket.timeout, TimeoutError):
            raise NoAnswer(timed_out=True) from None
        except (OSError, http.client.HTTPException):
            raise NoAnswer() from None
        if response.status == 408:  # the server (or a proxy) never read the whole request: nothing was done
            raise NotDelivered(timed_out=True)
        try:
            # Strict: json.loads takes NaN and Infinity, which the envelope printed with --json
            # cannot carry, and fails past its digit or nesting limits with errors of its own.
            document = loads_strict(b"".join(chunks))
        except StrictJsonError:
            document = None
        if response.status == 503 and _code_of(document) == ErrorCode.SERVER_BUSY.value:
            raise ServerBusy()
        if not isinstance(document, dict) or "ok" not in document:
            if response.status in (401, 403):
                # A bare refusal (say, from a proxy in front of the API) still means: this
                # credential is not accepted. Stop, never retry, never start a login.
                return Reply(status=response.status, document=_REVOKED)
            raise NotAnEnvelope()
        return Reply(status=response.status, document=document)


def _code_of(document: object) -> object:
    error = document.get("error") if isinstance(document, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def client_error(code: ErrorCode, message: str, *, contacted: bool, retryable: bool | None = None) -> ItoError:
    error = ItoError(code, message, retryable=retryable)
    error.live_api_contacted = contacted  # read by cli.run for the envelope
    return error


def _server_error(document: dict) -> ItoError:
    raw = document.get("error") or {}
    try:
        code = ErrorCode(raw.get("code"))
    except ValueError:
        code = ErrorCode.INTERNAL_ERROR
    message = raw.get("message") if isinstance(raw.get("message"), str) else "the API refused the request"
    return client_error(code, message[:500], contacted=True, retryable=bool(raw.get("retryable", False)))


class ApiClient:
    """Calls with bounded retries under one deadline. `contacted` turns true once any byte may
    have reached the API."""

    def __init__(self, transport: Transport, *, max_attempts: int = 3, backoff_s: float = 0.25,
                 backoff_cap_s: float = 4.0, sleep: Callable[[float], None] = time.sleep,
                 deadline: Deadline | None = None, rng: random.Random | None = None):
        self._transport = transport
        self._max_attempts = max_attempts
        self._backoff_s = backoff_s
        self._backoff_cap_s = backoff_cap_s
        self._sleep = sleep
        # Without a deadline only the attempt count bounds a call (library use; the CLI passes one).
        self.deadline = deadline if deadline is not None else Deadline(math.inf)
        self._rng = rng if rng is not None else random.Random()
        self.contacted = False
        self._not_the_api = False  # something answered, but never with an envelope
        self._busy = False  # the latest attempt found the server at its concurrency limit

    def _ready_for(self, attempt: int) -> bool:
        """Before attempt `attempt` (from 0): the pause after the failed one before it, then
        whether the deadline leaves time to try. Full jitter (AWS Architecture Blog, "Exponential
        Backoff And Jitter", 2015): a uniform draw up to the capped exponential, so clients that
        failed together do not retry together."""
        if attempt > 0:
            pause = self._rng.uniform(0.0, min(self._backoff_cap_s, self._backoff_s * 2 ** (attempt - 1)))
            if pause >= self.deadline.left():
                return False  # the pause alone would use up the deadline: no attempt could follow
            self._sleep(pause)
        return self.deadline.left() > 0

    def _send(self, method: str, path: str, body: dict | None) -> Reply:
        self._busy = False
        try:
            return self._transport.request(method, path, body)
        except ServerBusy:
            self.contacted = self._busy = True
            raise
        except NoAnswer as exc:
            self.contacted = True
            self._not_the_api = self._not_the_api or isinstance(exc, NotAnEnvelope)
            raise

    def _unwrap(self, reply: Reply) -> dict:
        self.contacted = True
        if reply.document.get("ok") is True and isinstance(reply.document.get("data"), dict):
            return reply.document["data"]
        raise _server_error(reply.document)

    def get(self, path: str) -> dict:
        """A read: retried on any transport failure, since reading twice changes nothing."""
        timed_out = False
        for attempt in range(self._max_attempts):
            if not self._ready_for(attempt):
                timed_out = True
                break
            try:
                reply = self._send("GET", path, None)
            except (NotDelivered, NoAnswer) as exc:
                timed_out = timed_out or exc.timed_out
                continue
            return self._unwrap(reply)
        raise self._transport_error(timed_out or self.deadline.left() <= 0)

    def post(self, path: str, body: dict) -> dict:
        """A mutation without an idempotency key: retried only when nothing was delivered."""
        expired = False
        for attempt in range(self._max_attempts):
            if not self._ready_for(attempt):
                expired = True
                break
            try:
                reply = self._send("POST", path, body)
            except NotDelivered:
                continue
            except NoAnswer:
                raise client_error(ErrorCode.OUTCOME_UNKNOWN, "the API may have applied the request but its "
                                   "answer was lost; check before repeating it", contacted=True) from None
            return self._unwrap(reply)
        raise self._transport_error(expired or self.deadline.left() <= 0)

    def lookup(self, key: str, *, action: str | None = None, fingerprint: str | None = None) -> dict | None:
        """What the server did under `key`, or None when it did nothing (yet). With `action`
        (and `fingerprint`), an answer recorded for another request is IDEMPOTENCY_KEY_REUSED,
        never mistaken for this request's outcome."""
        try:
            data = self.get(f"/v1/idempotency-keys/{quote(key, safe='')}")
        except ItoError as error:
            if error.code is ErrorCode.RUN_NOT_FOUND:
                return None
            raise
        if (action is not None and data.get("action") != action) or (
                fingerprint is not None and data.get("fingerprint") != fingerprint):
            raise client_error(ErrorCode.IDEMPOTENCY_KEY_REUSED, "this idempotency key was already used for a "
                               "different request", contacted=True)
        return data.get("result")

    def post_idempotent(self, path: str, body: dict, *, key: str, action: str,
                        fingerprint: str | None = None) -> dict:
        """A mutation under an idempotency key: after an ambiguous failure, query by key before
        any retry; never a second workload because an answer was lost. `action` and
        `fingerprint` (gates.fingerprint) identify this request among answers under the key.
        The lookup shares the deadline: when it runs out there, the outcome is unknown."""
        ambiguous = False
        in_flight: ItoError | None = None  # the server's answer to the latest attempt, if "in flight"
        for attempt in range(self._max_attempts):
            if not self._ready_for(attempt):
                break
            in_flight = None
            try:
                reply = self._send("POST", path, body)
            except NotDelivered:
                continue
            except NoAnswer:
                ambiguous = True
                found = self._lookup_or_unknown(key, action, fingerprint)
                if found is not None:
                    return found
                continue
            try:
                return self._unwrap(reply)
            except ItoError as error:
                if error.code is ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT:
                    in_flight = error
                    continue
                raise
        if in_flight is not None:
            raise in_flight
        if ambiguous:
            raise client_error(ErrorCode.OUTCOME_UNKNOWN, "the outcome is unknown; retry with the same "
                               "idempotency key, which never creates a second run", contacted=True)
        raise self._transport_error(self.deadline.left() <= 0)

    def _lookup_or_unknown(self, key: str, action: str, fingerprint: str | None) -> dict | None:
        try:
            return self.lookup(key, action=action, fingerprint=fingerprint)
        except ItoError as error:
            if error.code in _STOP_CODES or error.code is ErrorCode.IDEMPOTENCY_KEY_REUSED:
                raise
            raise client_error(ErrorCode.OUTCOME_UNKNOWN, "the answer was lost and the lookup by idempotency "
                               "key failed; retry with the same key", contacted=True) from None

    def _transport_error(self, timed_out: bool) -> ItoError:
        if timed_out:
            return client_error(ErrorCode.TIMEOUT, "the API did not answer in time", contacted=self.contacted)
        if self._busy:
            return client_error(ErrorCode.SERVER_BUSY, "the API server was at its limit of concurrent connections "
                                "and requests on every attempt; nothing was done: retry later", contacted=True)
        endpoint = getattr(self._transport, "endpoint", None)
        if self._not_the_api:
            where = f" at {endpoint.url}" if endpoint is not None else ""
            return client_error(ErrorCode.API_UNREACHABLE, f"what answers{where} is not the ito API: its answers are "
                                "not strict JSON envelopes; check ITO_API_URL", contacted=self.contacted)
        return client_error(ErrorCode.API_UNREACHABLE, unreachable_message(endpoint), contacted=self.contacted)
