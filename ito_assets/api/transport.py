"""The socket edge of `ito serve`: uvicorn's HTTP protocol with a deadline for reading each request
and a cap on concurrent connections per client address.

uvicorn closes idle keep-alive connections, but nothing bounds how long a request may take to
arrive: a client sending its headers a byte at a time (slowloris) holds a connection, and enough
of them hold every connection the process can have. Here each request must be read whole (request
line, headers and body) within `read_timeout_s` of its first byte, or of the connection opening;
on expiry it is answered 408 and the connection closed (only closed once an answer has begun, or
while an earlier pipelined request is still owed one). A client address holds at most
`max_connections_per_client` connections, so one client cannot take every slot. At that cap a new connection first reclaims
the address's oldest idle one (opened with no request yet, or kept alive between requests): every
local client shares 127.0.0.1, so without this one process holding idle sockets shut `ito` out of
a loopback server. Only when all of the address's connections are busy (a request being read,
or being answered) is the new one closed at once; a slow sender is busy until its read deadline.

httptools (uvicorn's default when installed) has no bound on the request head; it is bounded
here as h11 bounds it (h11_max_incomplete_event_size): MAX_HEAD_BYTES of request target plus
header names and values, exactly, and the raw bytes of an unfinished head to 8x that (a head
that never ends must not grow in memory until the deadline).

Every refusal made here is the API's JSON envelope with a stable code, as the app's are: a request
the parser cannot read is USAGE_ERROR (400), a head past its bound REQUEST_TOO_LARGE (431), a
request not read whole by its deadline TIMEOUT (408), and a request that finds the server at
`limit_concurrency` (connections, its own included, or requests in flight) SERVER_BUSY (503,
closed). That last check is uvicorn's own, made here instead, since uvicorn answers it in plain
text, which the client cannot tell from something other than the API.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Callable, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ito_assets.api import envelope
from ito_assets.errors import ErrorCode, ItoError

READ_TIMEOUT_S = 10.0
MAX_CONNECTIONS_PER_CLIENT = 32
# Connections (a request's own included), or requests in flight, at which a request is answered
# 503 SERVER_BUSY at once (uvicorn's limit_concurrency).
LIMIT_CONCURRENCY = 1024
BACKLOG = 2048
TIMEOUT_KEEP_ALIVE_S = 5
MAX_HEAD_BYTES = 16 * 1024  # h11's default; a request here carries one bearer token and a short URL
MAX_RAW_HEAD_BYTES = 8 * MAX_HEAD_BYTES  # also what h11 buffers of an incomplete head


def _refusal(error: ItoError) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The body and headers of a refusal made before the app holds the request, as the app
    would make it: the JSON envelope with its stable code (uvicorn's own are plain text or
    empty), then the close."""
    body = envelope.dumps(envelope.failure(error, live_api_contacted=True)).encode()
    return body, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                  (b"cache-control", b"no-store"), (b"connection", b"close")]


def edge_answer(status: int, error: ItoError) -> bytes:
    """A refusal written straight to the socket: the whole HTTP response."""
    body, headers = _refusal(error)
    head = "".join(f"{name.decode()}: {value.decode()}\r\n" for name, value in headers)
    return f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n{head}\r\n".encode() + body


_BUSY_BODY, _BUSY_HEADERS = _refusal(ItoError(
    ErrorCode.SERVER_BUSY, "the API server holds as many connections and requests as it takes; nothing of "
    "this request was done: retry"))


async def _server_busy(scope: Any, receive: Any, send: Any) -> None:
    """The ASGI app that answers a request past `limit_concurrency` in place of the API's."""
    await send({"type": "http.response.start", "status": 503, "headers": [*_BUSY_HEADERS, (b"retry-after", b"1")]})
    await send({"type": "http.response.body", "body": _BUSY_BODY, "more_body": False})


_TIMEOUT_RESPONSE = edge_answer(408, ItoError(
    ErrorCode.TIMEOUT, "the request did not arrive whole within the server's read deadline"))
_MALFORMED_RESPONSE = edge_answer(400, ItoError(ErrorCode.USAGE_ERROR, "the request could not be read as HTTP"))
_HEAD_TOO_LARGE_RESPONSE = edge_answer(431, ItoError(
    ErrorCode.REQUEST_TOO_LARGE, f"the request line and headers exceed the {MAX_HEAD_BYTES}-byte limit"))

# Bounds on the settings read from the environment (server.load_config).
READ_TIMEOUT_RANGE_S = (0.1, 3600.0)
CONNECTIONS_PER_CLIENT_RANGE = (1, 65536)


@dataclass(frozen=True)
class EdgeLimits:
    read_timeout_s: float = READ_TIMEOUT_S
    max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT
    max_head_bytes: int = MAX_HEAD_BYTES
    max_raw_head_bytes: int = MAX_RAW_HEAD_BYTES
    limit_concurrency: int = LIMIT_CONCURRENCY


class HeadTooLarge(Exception):
    """Raised from a parser callback; uvicorn takes it for an invalid request and calls
    send_400_response, which answers REQUEST_TOO_LARGE (431, closed)."""


class _Guard:
    """The deadline and the per-address count, shared by the httptools and h11 protocols.

    Everything runs on the event loop thread, so the counter needs no lock."""

    limits: ClassVar[EdgeLimits]
    open_per_client: ClassVar[collections.Counter]
    held_per_client: ClassVar[dict[str, list["_Guard"]]]  # by address, oldest first
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    client: tuple[str, int] | None
    cycle: Any
    app: Any
    limit_concurrency: int | None
    connections: set
    tasks: set
    logger: Any

    def _guard_open(self) -> bool:
        """Count the connection, reclaiming its address's oldest idle one at the cap; False (and
        closed) when every connection of the address is busy."""
        # uvicorn's own concurrency check would answer in plain text: _choose_app makes it instead.
        self._app, self._concurrency_cap = self.app, self.limit_concurrency
        self.limit_concurrency = None
        self._deadline: asyncio.TimerHandle | None = None
        self._in_request = False
        self._head_too_large = False
        self._peer = self.client[0] if self.client else None
        if self._peer is None:  # a Unix socket: no address to count
            self._arm()
            return True
        held = self.held_per_client.setdefault(self._peer, [])
        if len(held) >= self.limits.max_connections_per_client:
            idle = next((connection for connection in held if connection._idle()), None)
            if idle is None:
                self._peer = None  # never counted: connection_lost has nothing to give back
                self.transport.close()
                return False
            idle._reclaim()
        held.append(self)
        self.open_per_client[self._peer] += 1
        self._arm()
        return True

    def _choose_app(self) -> None:
        """Called as a request's head is read, before uvicorn picks the app that answers it: past
        the cap (uvicorn's test, the same numbers) the envelope's SERVER_BUSY answers instead."""
        cap = self._concurrency_cap
        if cap is not None and (len(self.connections) >= cap or len(self.tasks) >= cap):
            self.app = _server_busy
            self.logger.warning("Exceeded concurrency limit.")
        else:
            self.app = self._app

    def _idle(self) -> bool:
        """No request being read and none being answered: closing it loses nothing."""
        return (not self._in_request and (self.cycle is None or self.cycle.response_complete)
                and not self.transport.is_closing())

    def _reclaim(self) -> None:
        self._guard_close()  # uncounted now, so the new connection fits; connection_lost follows
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        # First in the method order of both protocols: uncount, then uvicorn's own cleanup.
        self._guard_close()
        super().connection_lost(exc)  # type: ignore[misc]

    def _guard_close(self) -> None:
        self._disarm()
        peer, self._peer = self._peer, None
        if peer is not None:
            self.open_per_client[peer] -= 1
            if self.open_per_client[peer] <= 0:
                del self.open_per_client[peer]
            held = self.held_per_client.get(peer, [])
            if self in held:
                held.remove(self)
            if not held:
                self.held_per_client.pop(peer, None)

    def _arm(self) -> None:
        if self._deadline is None and not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.limits.read_timeout_s, self._read_expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot parse, or whose head is past the bounds here."""
        self.transport.write(_HEAD_TOO_LARGE_RESPONSE if self._head_too_large else _MALFORMED_RESPONSE)
        self.transport.close()

    def _read_expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._timeout_is_next_answer():
            self.transport.write(_TIMEOUT_RESPONSE)
        # The app, if it holds the request, learns of the close from its receive(); what it
        # answers then is dropped (uvicorn writes nothing to a closed connection).
        self.transport.close()

    def _timeout_is_next_answer(self) -> bool:
        """Whether a 408 is the answer the client reads next: no answer begun, none owed to an
        earlier request. The request being read is not whole, so no route acted on it: each route
        reads its whole body before it changes anything (routes.common.endpoint), and one without
        a body only reads. A TIMEOUT therefore means nothing was done, a mutation included."""
        return self.cycle is None or self.cycle.response_complete or not self.cycle.response_started


def _httptools_class() -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpTools(_Guard, HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_pending = True
            self._head_bytes = 0
            self._raw_head_bytes = 0
            self._guard_open()

        def data_received(self, data: bytes) -> None:
            if self.transport.is_closing():
                return  # refused or expired: nothing more is parsed
            if self._head_pending:
                self._raw_head_bytes += len(data)
            self._in_request = True  # until on_message_complete: a byte of a request is not idle
            super().data_received(data)
            if (self._head_pending and self._raw_head_bytes > self.limits.max_raw_head_bytes
                    and not self.transport.is_closing()):
                self._head_too_large = True
                self.send_400_response("Request head too large.")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_pending = True
            self._head_bytes = 0
            self._raw_head_bytes = 0
            self._in_request = True
            self._arm()

        def on_url(self, url: bytes) -> None:
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_head(len(name) + len(value))
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._head_pending = False
            self._choose_app()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_request = False  # read whole; busy still until its response completes (cycle)
            self._disarm()

        def _timeout_is_next_answer(self) -> bool:
            # httptools parses a pipelined request while an earlier one is still being answered:
            # until its head is whole, `cycle` is the earlier request's; after it, an earlier one
            # still unanswered leaves this one queued in `pipeline`.
            if self._head_pending:
                return self.cycle is None or self.cycle.response_complete
            return not self.pipeline and super()._timeout_is_next_answer()

        def _count_head(self, num_bytes: int) -> None:
            self._head_bytes += num_bytes
            if self._head_bytes > self.limits.max_head_bytes:
                self._head_too_large = True
                raise HeadTooLarge()

    return GuardedHttpTools


class _CheckedConnection:
    """h11's connection with the exact head bound: the Request event is refused past it, and
    `on_request` runs before one is handed on. `too_large`: the last refusal was for size (this
    bound's, or h11's on an unfinished head)."""

    def __init__(self, conn: h11.Connection, max_head_bytes: int, on_request: Callable[[], None]):
        self._conn = conn
        self._max = max_head_bytes
        self._on_request = on_request
        self.too_large = False

    def next_event(self) -> Any:
        try:
            event = self._conn.next_event()
        except h11.RemoteProtocolError as error:
            self.too_large = error.error_status_hint == 431
            raise
        if isinstance(event, h11.Request):
            size = len(event.target) + sum(len(k) + len(v) for k, v in event.headers.raw_items())
            if size > self._max:
                self.too_large = True
                raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
            self._on_request()
        return event

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class GuardedH11(_Guard, H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _CheckedConnection(self.conn, self.limits.max_head_bytes,  # type: ignore[assignment]
                                       self._choose_app)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._guard_open()

    def send_400_response(self, msg: str) -> None:
        self._head_too_large = self.conn.too_large
        super().send_400_response(msg)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        self._arm()  # the first byte of a request (or more of one) starts or keeps its deadline
        self._in_request = True
        super().data_received(data)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            self._in_request = False
            self._disarm()


def _has_httptools() -> bool:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return False
    return True


def protocol_class(limits: EdgeLimits, http: str = "auto") -> type[asyncio.Protocol]:
    """A protocol class for uvicorn.Config(http=...) with its own per-address counter (one per
    server). `http`: "httptools", "h11" or "auto" (httptools when installed, as uvicorn does)."""
    if http == "auto":
        http = "httptools" if _has_httptools() else "h11"
    if http not in ("httptools", "h11"):
        raise ValueError("http must be auto, httptools or h11")
    base = _httptools_class() if http == "httptools" else GuardedH11
    return type(base.__name__, (base,), {"limits": limits, "open_per_client": collections.Counter(),
                                         "held_per_client": {}})


def uvicorn_config(app: Any, limits: EdgeLimits, *, http: str = "auto") -> Any:
    """uvicorn's settings for `ito serve`, its own limits included."""
    import uvicorn

    # No access log: paths and headers may carry secrets, so they stay out of logs.
    return uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", server_header=False,
                          http=protocol_class(limits, http), timeout_keep_alive=TIMEOUT_KEEP_ALIVE_S,
                          limit_concurrency=limits.limit_concurrency, backlog=BACKLOG,
                          h11_max_incomplete_event_size=limits.max_raw_head_bytes)
