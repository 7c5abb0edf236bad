"""The server's edge against hostile or unlucky clients: a deadline for reading each request, a
cap on connections per client address, a bound on the request head, answers given before an
unwanted body is sent, and a full disk answered as a retryable STORAGE_FULL.

The socket tests run the real application under uvicorn with the protocol classes of
api/transport.py (httptools and h11 both), on 127.0.0.1 port 0 in a thread; one runs the real
`ito serve` subprocess to show the environment reaches the edge. 127.0.0.2 is a second client
address (all of 127/8 is loopback on Linux).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import sqlalchemy as sa
import uvicorn
from sqlalchemy import event

from api_harness import Client, Server, read_request
from helpers import CANARIES
from ito_assets.api import server as api_server
from ito_assets.api import transport
from ito_assets.api.routes.common import storage_full
from ito_assets.api.transport import EdgeLimits, uvicorn_config
from ito_assets.errors import ItoError
from ito_assets.control.ledger import accounts, audit_events
from test_bodies import World, built_world

PROTOCOLS = ("httptools", "h11")
SECRET = CANARIES["github"]


@pytest.fixture(scope="module")
def world():
    with built_world("ito-transport-") as built:
        yield built


@contextlib.contextmanager
def edge(app, http: str, **limits) -> Iterator[tuple[int, uvicorn.Server]]:
    """uvicorn with `ito serve`'s configuration (transport.uvicorn_config) in a thread."""
    server = uvicorn.Server(uvicorn_config(app, EdgeLimits(**limits), http=http))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(transport.BACKLOG)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1], server
    finally:
        server.should_exit = True
        thread.join(5)
        if thread.is_alive():
            server.force_exit = True
            thread.join(10)
        sock.close()


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


def until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, bool]:
    """Everything the server sends until it closes (True) or `limit_s` passes (False)."""
    received, deadline = b"", time.monotonic() + limit_s
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([sock], [], [], left)[0]:
            break
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received, True
        if not chunk:
            return received, True
        received += chunk
    return received, False


def trickle(sock: socket.socket, data: bytes, interval_s: float) -> tuple[float | None, bytes]:
    """Send `data` a byte per `interval_s`: (seconds until the server closed or None, what it sent)."""
    start = time.monotonic()
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return time.monotonic() - start, b""
        if select.select([sock], [], [], interval_s)[0]:
            received, closed = until_closed(sock, 5)
            return (time.monotonic() - start if closed else None), received
    return None, b""


def get(path: str = "/v1/health", *, close: bool = True, extra: str = "") -> bytes:
    connection = "Connection: close\r\n" if close else ""
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}{connection}\r\n".encode()


def one_response(sock: socket.socket) -> tuple[int, bytes]:
    """Read one HTTP response (Content-Length framed) from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "closed before a response"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split(b" ", 2)[1]), rest[:length]


def refused_with(received: bytes, status: int, code: str) -> bool:
    """Whether `received` is one closing answer of `status` carrying the API's envelope with `code`."""
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode().lower().split("\r\n")
    length = next(int(line.split(":")[1]) for line in lines if line.startswith("content-length:"))
    document = json.loads(body)
    return (lines[0].startswith(f"http/1.1 {status} ") and "content-type: application/json" in lines
            and "connection: close" in lines and length == len(body) and document["ok"] is False
            and document["error"]["code"] == code)


def served(port: int, source: str = "127.0.0.1") -> int:
    with contextlib.closing(connect(port, source)) as sock:
        sock.sendall(get())
        received, closed = until_closed(sock, 5)
    assert closed
    return int(received.split(b" ", 2)[1])


# --- the read deadline ----------------------------------------------------------------------

@pytest.mark.parametrize("http", PROTOCOLS)
def test_headers_sent_a_byte_at_a_time_are_cut_off_at_the_deadline(world, http) -> None:
    with edge(world.app, http, read_timeout_s=1.0) as (port, _server):
        with contextlib.closing(connect(port)) as slow:
            elapsed, received = trickle(slow, get(), 0.2)
        assert elapsed is not None and 0.8 <= elapsed <= 3.0, elapsed
        assert refused_with(received, 408, "TIMEOUT"), received
        assert served(port) == 200  # the server itself is fine


@pytest.mark.parametrize("http", PROTOCOLS)
def test_a_connection_that_sends_nothing_is_closed_at_the_deadline(world, http) -> None:
    with edge(world.app, http, read_timeout_s=1.0) as (port, _server):
        with contextlib.closing(connect(port)) as idle:
            start = time.monotonic()
            received, closed = until_closed(idle, 5)
        assert closed and 0.8 <= time.monotonic() - start <= 3.0
        assert refused_with(received, 408, "TIMEOUT"), received


def account_post(world, name: str) -> tuple[bytes, bytes]:
    """(head, body) of the desk's POST /v1/desk/accounts: a mutation without a key."""
    body = json.dumps({"name": name}).encode()
    head = (f"POST /v1/desk/accounts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {world.desk}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return head, body


@pytest.mark.parametrize("stall", ["a byte at a time", "one byte short"])
@pytest.mark.parametrize("http", PROTOCOLS)
def test_a_body_not_read_by_the_deadline_is_answered_408_and_nothing_is_written(world, http, stall) -> None:
    # The route holds the request (its head was read, authenticated): the 408 is still its answer,
    # and the same request sent whole afterwards is served once.
    head, body = account_post(world, f"stall-{uuid.uuid4().hex[:8]}")
    before = world.count(accounts)
    with edge(world.app, http, read_timeout_s=1.0) as (port, _server):
        with contextlib.closing(connect(port)) as stalled:
            if stall == "a byte at a time":
                stalled.sendall(head)
                elapsed, received = trickle(stalled, body, 0.2)
                assert elapsed is not None and 0.6 <= elapsed <= 3.0, elapsed
            else:
                stalled.sendall(head + body[:-1])
                received, closed = until_closed(stalled, 5)
                assert closed
        assert refused_with(received, 408, "TIMEOUT"), received
        time.sleep(0.2)
        assert world.count(accounts) == before
        with contextlib.closing(connect(port)) as whole:
            whole.sendall(head + body)
            received, _closed = until_closed(whole, 3)
        assert received.startswith(b"HTTP/1.1 200 ")
        assert world.count(accounts) == before + 1


@contextlib.contextmanager
def stalling_relay(port: int) -> Iterator[tuple[int, list[bytes]]]:
    """A loopback relay to the server for two requests: the first loses its last byte (so the
    server's read deadline passes), the second passes whole; -> (its port, the answers relayed)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(2)
    answers: list[bytes] = []

    def relay() -> None:
        for attempt in range(2):
            client, _ = listener.accept()
            with client, contextlib.closing(connect(port)) as upstream:
                request = read_request(client)
                upstream.sendall(request if attempt else request[:-1])
                answers.append(read_request(upstream))  # Content-Length framed, as a request
                client.sendall(answers[-1])
    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], answers
    finally:
        thread.join(10)
        listener.close()


@pytest.mark.parametrize("http", PROTOCOLS)
def test_ito_sends_a_mutation_again_after_a_408_and_it_is_done_once(world, http) -> None:
    from ito_assets.api.client import ApiClient, Endpoint, HttpTransport

    name = f"retried-{uuid.uuid4().hex[:8]}"
    before = world.count(accounts)
    with edge(world.app, http, read_timeout_s=1.0) as (port, _server), stalling_relay(port) as (relay, answers):
        endpoint = Endpoint(scheme="http", host="127.0.0.1", port=relay)
        api = ApiClient(HttpTransport(endpoint, world.desk, connect_timeout_s=5, total_timeout_s=5),
                        sleep=lambda _s: None)
        created = api.post("/v1/desk/accounts", {"name": name})
    assert created["name"] == name and world.count(accounts) == before + 1
    assert refused_with(answers[0], 408, "TIMEOUT") and answers[1].startswith(b"HTTP/1.1 200 ")


async def _slow_app(scope, receive, send) -> None:
    """Reads each request whole, then takes 2 s to answer it."""
    while (await receive()).get("more_body"):
        pass
    await asyncio.sleep(2.0)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("http", PROTOCOLS)
@pytest.mark.parametrize("cut", ["head", "body"])
def test_no_408_goes_out_while_an_earlier_pipelined_request_is_unanswered(http, cut) -> None:
    """A 408 written then would be read as the earlier request's answer: a mutation done, told
    as not done."""
    first = b"POST /first HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    second = b"POST /second HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{"
    second = second[:20] if cut == "head" else second
    with edge(_slow_app, http, read_timeout_s=1.0) as (port, _server):
        with contextlib.closing(connect(port)) as sock:
            sock.sendall(first + second)
            received, _closed = until_closed(sock, 4)
    assert not received.startswith(b"HTTP/1.1 408"), received


@pytest.mark.parametrize("http", PROTOCOLS)
def test_each_request_on_a_kept_alive_connection_gets_its_own_deadline(world, http) -> None:
    with edge(world.app, http, read_timeout_s=1.0) as (port, _server):
        with contextlib.closing(connect(port)) as sock:
            sock.sendall(get(close=False))
            assert one_response(sock)[0] == 200
            time.sleep(0.5)  # idle between requests is uvicorn's keep-alive timeout (5 s), not the deadline
            elapsed, received = trickle(sock, get(), 0.2)
        assert elapsed is not None and 0.8 <= elapsed <= 3.0, elapsed
        assert received.startswith(b"HTTP/1.1 408 ")


@pytest.mark.parametrize("http", PROTOCOLS)
def test_a_normal_or_merely_slowish_client_is_unaffected(world, http) -> None:
    with edge(world.app, http, read_timeout_s=1.5) as (port, _server):
        attackers = [connect(port, "127.0.0.3") for _ in range(3)]
        threads = [threading.Thread(target=trickle, args=(s, get(), 0.2), daemon=True) for s in attackers]
        for thread in threads:
            thread.start()
        try:
            start = time.monotonic()
            assert served(port) == 200
            assert time.monotonic() - start < 1.0
            with contextlib.closing(connect(port)) as slowish:  # well inside the deadline
                request = get()
                slowish.sendall(request[:10])
                time.sleep(0.4)
                slowish.sendall(request[10:])
                received, closed = until_closed(slowish, 5)
            assert closed and received.startswith(b"HTTP/1.1 200 ")
        finally:
            for thread in threads:
                thread.join(10)
            for sock in attackers:
                sock.close()


# --- connections per client address ---------------------------------------------------------

def wait_for(predicate, limit_s: float = 5.0) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


PARTIAL_HEAD = b"GET /v1/health HTTP/1.1\r\nHost: x\r\n"  # a request being read: busy until its deadline


def busy(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = connect(port, source)
    sock.sendall(PARTIAL_HEAD)
    return sock


def still_open(sock: socket.socket) -> bool:
    return until_closed(sock, 0.2) == (b"", False)


@pytest.mark.parametrize("http", PROTOCOLS)
def test_a_client_address_whose_connections_are_all_busy_is_closed_at_once_past_its_limit(world, http) -> None:
    with edge(world.app, http, read_timeout_s=10.0, max_connections_per_client=4) as (port, server):
        counter = server.config.http.open_per_client
        held = [busy(port) for _ in range(3)]
        try:
            wait_for(lambda: counter.get("127.0.0.1") == 3)
            held.append(connect(port))  # the fourth, at the limit, is served and nothing is reclaimed
            held[3].sendall(get(close=False))
            assert one_response(held[3])[0] == 200 and all(still_open(sock) for sock in held[:3])
            held[3].sendall(PARTIAL_HEAD)  # now every connection of the address is busy
            wait_for(lambda: counter.get("127.0.0.1") == 4)
            start = time.monotonic()
            with contextlib.closing(connect(port)) as fifth:
                with contextlib.suppress(OSError):
                    fifth.sendall(get())
                received, closed = until_closed(fifth, 5)
            assert closed and received == b"" and time.monotonic() - start < 2.0
            assert all(still_open(sock) for sock in held)  # a busy connection is never reclaimed
            assert served(port, "127.0.0.2") == 200  # another address has its own share
            for _ in range(10):  # refused connections give their count back
                with contextlib.closing(connect(port)) as refused:
                    assert until_closed(refused, 5) == (b"", True)
            held.pop(0).close()
            wait_for(lambda: counter.get("127.0.0.1") == 3)
            assert served(port) == 200  # back under the limit: served again
        finally:
            for sock in held:
                sock.close()
        wait_for(lambda: not counter)


@pytest.mark.parametrize("http", PROTOCOLS)
@pytest.mark.parametrize("idle_kind", ["never sent a byte", "kept alive after a response"])
def test_at_its_limit_an_address_reclaims_its_oldest_idle_connection(world, http, idle_kind) -> None:
    """Every local client shares 127.0.0.1: idle sockets one process holds must not shut `ito` out."""
    with edge(world.app, http, read_timeout_s=10.0, max_connections_per_client=4) as (port, server):
        counter = server.config.http.open_per_client
        held = [busy(port)]
        try:
            for _ in range(2):
                held.append(connect(port))
                if idle_kind == "kept alive after a response":
                    held[-1].sendall(get(close=False))
                    assert one_response(held[-1])[0] == 200
            held.append(busy(port))  # busy, idle, idle, busy: at the limit
            wait_for(lambda: counter.get("127.0.0.1") == 4)
            for reclaimed in (held[1], held[2]):  # oldest idle first, each newcomer served
                newcomer = connect(port)
                held.append(newcomer)
                newcomer.sendall(get(close=False))
                assert one_response(newcomer)[0] == 200
                assert until_closed(reclaimed, 5) == (b"", True)
                assert still_open(held[0]) and still_open(held[3])  # busy ones stay
                assert counter.get("127.0.0.1") == 4
        finally:
            for sock in held:
                sock.close()
        wait_for(lambda: not counter)


@pytest.mark.parametrize("http", PROTOCOLS)
def test_idle_sockets_at_the_default_limit_do_not_shut_a_local_client_out(world, http) -> None:
    """The reviewer's case: one local process holds 32 idle sockets on 127.0.0.1."""
    with edge(world.app, http) as (port, server):
        counter = server.config.http.open_per_client
        held = [connect(port) for _ in range(transport.MAX_CONNECTIONS_PER_CLIENT)]
        try:
            wait_for(lambda: counter.get("127.0.0.1") == transport.MAX_CONNECTIONS_PER_CLIENT)
            assert served(port) == 200
            assert until_closed(held[0], 5) == (b"", True) and still_open(held[1])
        finally:
            for sock in held:
                sock.close()
        wait_for(lambda: not counter)


# --- the server's concurrency limit ---------------------------------------------------------

@pytest.mark.parametrize("http", PROTOCOLS)
def test_past_the_concurrency_limit_a_request_is_a_retryable_server_busy_envelope(world, http) -> None:
    """uvicorn's own answer there is plain text, which `ito` took for something other than the API.
    The cap counts the request's own connection: at 3, two others are one too many."""
    name = f"busy-{uuid.uuid4().hex[:8]}"
    body = json.dumps({"name": name}).encode()
    post = (f"POST /v1/desk/accounts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {world.desk}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    with edge(world.app, http, read_timeout_s=10.0, limit_concurrency=3) as (port, server):
        connections = server.server_state.connections
        others = [connect(port, "127.0.0.2")]
        try:
            wait_for(lambda: len(connections) == 1)
            assert served(port) == 200  # 2 connections with its own: under the cap
            others.append(connect(port, "127.0.0.3"))
            wait_for(lambda: len(connections) == 2)
            before = world.count(accounts)
            with contextlib.closing(connect(port)) as sock:  # 3 with its own: at the cap
                sock.sendall(post)
                received, closed = until_closed(sock, 5)
            assert closed and refused_with(received, 503, "SERVER_BUSY"), received[:300]
            head, _, answer = received.partition(b"\r\n\r\n")
            assert b"\r\nretry-after: 1" in head.lower() and json.loads(answer)["error"]["retryable"] is True
            assert world.count(accounts) == before  # no route saw it
            others.pop().close()
            wait_for(lambda: len(connections) == 1)
            with contextlib.closing(connect(port)) as sock:
                sock.sendall(post)
                received, closed = until_closed(sock, 5)
            assert closed and received.startswith(b"HTTP/1.1 200 "), received[:200]
            assert world.count(accounts) == before + 1
        finally:
            for sock in others:
                sock.close()


@pytest.mark.parametrize("http", PROTOCOLS)
def test_ito_reports_a_busy_server_as_server_busy_and_recovers_when_it_frees(world, http) -> None:
    from ito_assets.api.client import ApiClient, Endpoint, HttpTransport

    with edge(world.app, http, read_timeout_s=10.0, limit_concurrency=2) as (port, server):
        endpoint = Endpoint(scheme="http", host="127.0.0.1", port=port)
        api = ApiClient(HttpTransport(endpoint, None, connect_timeout_s=5, total_timeout_s=5), sleep=lambda _s: None)
        other = connect(port, "127.0.0.2")
        try:
            wait_for(lambda: len(server.server_state.connections) == 1)
            with pytest.raises(ItoError) as refused:
                api.get("/v1/health")
            assert refused.value.code.value == "SERVER_BUSY" and refused.value.retryable
            assert refused.value.live_api_contacted is True
        finally:
            other.close()
        wait_for(lambda: not server.server_state.connections)
        assert api.get("/v1/health")["status"]


# --- the request head -----------------------------------------------------------------------

def padded_get(head_bytes: int) -> bytes:
    """A GET whose target plus header names and values come to exactly `head_bytes`."""
    fixed = len("/v1/health") + len("Host") + len("x") + len("Connection") + len("close") + len("X-Pad")
    return get(extra=f"X-Pad: {'p' * (head_bytes - fixed)}\r\n")


@pytest.mark.parametrize("http", PROTOCOLS)
@pytest.mark.parametrize("size, status", [(transport.MAX_HEAD_BYTES - 1, 200), (transport.MAX_HEAD_BYTES, 200),
                                          (transport.MAX_HEAD_BYTES + 1, 431)])
def test_the_request_head_is_bounded_exactly(world, http, size, status) -> None:
    with edge(world.app, http) as (port, _server):
        with contextlib.closing(connect(port)) as sock:
            sock.sendall(padded_get(size))
            received, closed = until_closed(sock, 5)
        assert closed and received.startswith(f"HTTP/1.1 {status} ".encode()), received[:80]
        if status != 200:
            assert refused_with(received, 431, "REQUEST_TOO_LARGE"), received[:200]


MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"GET /v1/health HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n",
    b"POST /v1/desk/accounts HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}",
    b"GET /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
]


@pytest.mark.parametrize("http", PROTOCOLS)
@pytest.mark.parametrize("request_bytes", MALFORMED, ids=["not-http", "header-line", "length-and-chunked", "length"])
def test_a_request_that_is_not_http_gets_the_envelope_not_plain_text(world, http, request_bytes) -> None:
    with edge(world.app, http) as (port, _server):
        with contextlib.closing(connect(port)) as sock:
            sock.sendall(request_bytes)
            received, closed = until_closed(sock, 5)
        if http == "h11" and b"chunked" in request_bytes:  # h11 reads the chunks (RFC 9112 6.3): the app answers
            assert closed and refused_with(received, 401, "AUTH_REQUIRED"), received[:200]
        else:
            assert closed and refused_with(received, 400, "USAGE_ERROR"), received[:200]
        assert served(port) == 200


@pytest.mark.parametrize("http", PROTOCOLS)
def test_a_head_that_never_ends_is_refused_long_before_the_deadline(world, http) -> None:
    with edge(world.app, http, read_timeout_s=30.0) as (port, _server):
        with contextlib.closing(connect(port)) as sock:
            start = time.monotonic()
            with contextlib.suppress(OSError):
                sock.sendall(b"GET /v1/health HTTP/1.1\r\nX-Pad: " + b"p" * (transport.MAX_RAW_HEAD_BYTES * 2))
            received, closed = until_closed(sock, 10)
        assert closed and time.monotonic() - start < 10
        # The answer may be cut by the reset of a socket closed with unread bytes.
        assert received == b"" or received.startswith(b"HTTP/1.1 431 ")
        assert served(port) == 200


# --- answers before the body ----------------------------------------------------------------

@pytest.mark.parametrize("http", PROTOCOLS)
def test_refusals_arrive_without_the_client_sending_its_body(world, http) -> None:
    with edge(world.app, http, read_timeout_s=30.0) as (port, _server):
        for token, announced, status, code in [(None, 1024 * 1024, 401, "AUTH_REQUIRED"),
                                               ("ito_desk_" + "A" * 43, 1024 * 1024, 401, "CREDENTIAL_REVOKED"),
                                               (world.desk, 2 * 1024 * 1024, 413, "REQUEST_TOO_LARGE")]:
            auth = f"Authorization: Bearer {token}\r\n" if token else ""
            with contextlib.closing(connect(port)) as sock:
                start = time.monotonic()
                sock.sendall(f"POST /v1/desk/accounts HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json"
                             f"\r\nContent-Length: {announced}\r\n\r\n".encode())
                received, closed = until_closed(sock, 5)
            assert closed and time.monotonic() - start < 3, (token, received)
            head, _, body = received.partition(b"\r\n\r\n")
            assert head.startswith(f"HTTP/1.1 {status} ".encode())
            assert json.loads(body)["error"]["code"] == code


# --- `ito serve` reads the limits from its environment --------------------------------------

def test_ito_serve_applies_the_environment_at_its_edge(tmp_path) -> None:
    running = Server(Path(os.path.realpath(tmp_path)), ITO_API_READ_TIMEOUT_S="1",
                     ITO_API_MAX_CONNECTIONS_PER_CLIENT="3")
    try:
        port = int(running.url.rsplit(":", 1)[1])
        with contextlib.closing(connect(port)) as slow:
            elapsed, received = trickle(slow, get(), 0.2)
        assert elapsed is not None and 0.8 <= elapsed <= 3.0 and received.startswith(b"HTTP/1.1 408 ")
        held = [busy(port) for _ in range(3)]  # busy: idle ones would be reclaimed for the fourth
        try:
            with contextlib.closing(connect(port)) as fourth:
                assert until_closed(fourth, 0.8) == (b"", True)  # closed at once, not at the 1 s deadline
            assert served(port, "127.0.0.2") == 200
        finally:
            for sock in held:
                sock.close()
        client = Client(running, Path(os.path.realpath(tmp_path)) / "client")  # the real client still works
        assert client.ok("readiness")["ready"]
    finally:
        running.stop()


@pytest.mark.parametrize("name, value", [("ITO_API_READ_TIMEOUT_S", SECRET), ("ITO_API_MAX_CONNECTIONS_PER_CLIENT",
                                                                              "0")])
def test_ito_serve_refuses_a_bad_edge_setting(tmp_path, name, value) -> None:
    env = {**os.environ, "ITO_STATE_DIR": str(tmp_path / "state"), name: value}
    done = subprocess.run([sys.executable, "-m", "ito_assets.api.cli", "serve", "--port", "0", "--json"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert json.loads(done.stdout)["error"]["code"] == "USAGE_ERROR"
    assert name in done.stdout and SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize("value, expected", [
    (None, 10.0), ("", 10.0), ("0.1", 0.1), ("3600", 3600.0), ("2.5", 2.5),
    ("0.09", None), ("3600.01", None), ("0", None), ("-1", None), ("nan", None), ("inf", None), ("1e400", None),
    ("abc", None), (SECRET, None),
])
def test_read_timeout_setting(tmp_path, value, expected) -> None:
    _expect_setting(tmp_path, "ITO_API_READ_TIMEOUT_S", "read_timeout_s", value, expected)


@pytest.mark.parametrize("value, expected", [
    (None, 32), ("", 32), ("1", 1), ("2", 2), ("65535", 65535), ("65536", 65536),
    ("0", None), ("65537", None), ("-1", None), ("+5", None), (" 5", None), ("5.0", None), ("1_0", None),
    ("9" * 50, None), ("\u00b2", None), (SECRET, None),
])
def test_connections_per_client_setting(tmp_path, value, expected) -> None:
    _expect_setting(tmp_path, "ITO_API_MAX_CONNECTIONS_PER_CLIENT", "max_connections_per_client", value, expected)


def _expect_setting(tmp_path, variable: str, attribute: str, value, expected) -> None:
    """`variable` set to `value` (unset for None) gives `expected`, or USAGE_ERROR for None,
    without echoing the value."""
    env = {"ITO_STATE_DIR": str(tmp_path)}
    if value is not None:
        env[variable] = value
    if expected is None:
        with pytest.raises(ItoError) as refused:
            api_server.load_config("127.0.0.1", 0, env)
        assert refused.value.code.value == "USAGE_ERROR" and SECRET not in refused.value.message
    else:
        assert getattr(api_server.load_config("127.0.0.1", 0, env), attribute) == expected


def test_the_defaults_agree_and_uvicorn_gets_its_own_limits() -> None:
    config = api_server.ServerConfig(ledger_url="sqlite://")
    defaults = (transport.READ_TIMEOUT_S, transport.MAX_CONNECTIONS_PER_CLIENT)
    assert (config.read_timeout_s, config.max_connections_per_client) == defaults == (10.0, 32)
    uv = uvicorn_config(lambda *_: None, EdgeLimits())
    assert uv.limit_concurrency == transport.LIMIT_CONCURRENCY == 1024 and uv.backlog == transport.BACKLOG
    assert uv.timeout_keep_alive == transport.TIMEOUT_KEEP_ALIVE_S
    assert uv.h11_max_incomplete_event_size == transport.MAX_RAW_HEAD_BYTES
    assert uv.access_log is False and uv.server_header is False
    assert issubclass(uv.http, transport._Guard)


# --- a full disk ----------------------------------------------------------------------------

@contextlib.contextmanager
def page_limit(world: World) -> Iterator[dict]:
    """SQLite's max_page_count, applied at each checkout: at the current page count, the next
    write that needs a page fails with SQLITE_FULL ("database or disk is full"), as on a full disk."""
    state: dict = {"limit": None}

    def apply(dbapi_conn, _record, _proxy) -> None:
        cursor = dbapi_conn.cursor()
        if state["limit"] is None:
            cursor.execute("PRAGMA max_page_count = 1073741823")
        else:
            cursor.execute(f"PRAGMA max_page_count = {int(state['limit'])}")
        cursor.close()

    event.listen(world.ledger.engine, "checkout", apply)
    try:
        yield state
    finally:
        event.remove(world.ledger.engine, "checkout", apply)


def current_pages(world: World) -> int:
    with world.ledger.read() as conn:
        return conn.exec_driver_sql("PRAGMA page_count").scalar_one()


def test_a_full_sqlite_disk_is_a_retryable_storage_full_and_nothing_is_written(tmp_path) -> None:
    world = World(tmp_path)
    try:
        with page_limit(world) as disk:
            disk["limit"] = current_pages(world)
            for attempt in range(500):
                name = f"full-{attempt:04d}-{'x' * 100}"
                before = (world.count(accounts), world.count(audit_events))
                reply = world.call("POST", "/v1/desk/accounts", {"name": name})
                if reply.status != 200:
                    break
            else:
                pytest.fail("the ledger never filled up")
            assert reply.status == 503, reply
            assert reply.document["error"] == {"code": "STORAGE_FULL", "retryable": True,
                                               "message": reply.document["error"]["message"]}
            disk_full = (world.count(accounts), world.count(audit_events))
            assert disk_full == before  # the transaction rolled back: no account, no audit event
            again = world.call("POST", "/v1/desk/accounts", {"name": name})
            assert again.status == 503 and again.document["error"]["retryable"] is True
            disk["limit"] = None  # space returns
            retried = world.call("POST", "/v1/desk/accounts", {"name": name})
            assert retried.status == 200 and retried.document["data"]["name"] == name, retried
            assert world.count(accounts) == before[0] + 1
    finally:
        world.close()


def _inject(engine: sa.Engine, error_factory, verb: str = "INSERT") -> tuple:
    """Make every `verb` statement on `engine` fail inside the driver call, where SQLAlchemy wraps it."""
    def do_execute(cursor, statement, parameters, context):
        if statement.lstrip().upper().startswith(verb):
            raise error_factory()

    def do_executemany(cursor, statement, parameters, context):
        return do_execute(cursor, statement, parameters, context)

    event.listen(engine, "do_execute", do_execute)
    event.listen(engine, "do_executemany", do_executemany)
    return do_execute, do_executemany


def _remove(engine: sa.Engine, hooks: tuple) -> None:
    event.remove(engine, "do_execute", hooks[0])
    event.remove(engine, "do_executemany", hooks[1])


def test_an_operational_error_that_is_not_a_full_disk_stays_an_internal_error(tmp_path, capfd) -> None:
    world = World(tmp_path)
    try:
        hooks = _inject(world.ledger.engine, lambda: sqlite3.OperationalError("disk I/O error"))
        try:
            reply = world.call("POST", "/v1/desk/accounts", {"name": f"io-{SECRET}"})
        finally:
            _remove(world.ledger.engine, hooks)
        assert reply.status == 500 and reply.document["error"]["code"] == "INTERNAL_ERROR"
        assert reply.document["error"]["retryable"] is False
        logged = capfd.readouterr().err
        assert "internal error in POST /v1/desk/accounts: OperationalError" in logged and SECRET not in logged
        hooks = _inject(world.ledger.engine, lambda: sqlite3.OperationalError("disk I/O error"), "UPDATE")
        try:
            booking = world.call("POST", f"/v1/desk/bookings/{world.booking}/revoke", {})
        finally:
            _remove(world.ledger.engine, hooks)
        assert booking.status == 500
        logged = capfd.readouterr().err  # the route's template, never the caller's path
        assert "POST /v1/desk/bookings/{booking_id}/revoke" in logged and world.booking not in logged
        hooks = _inject(world.ledger.engine, lambda: sqlite3.OperationalError("database or disk is full"))
        try:
            full = world.call("POST", "/v1/desk/accounts", {"name": f"full-{uuid.uuid4().hex[:8]}"})
        finally:
            _remove(world.ledger.engine, hooks)
        assert full.status == 503 and full.document["error"]["code"] == "STORAGE_FULL"
    finally:
        world.close()


def test_storage_full_recognises_each_driver_form() -> None:
    class Pg2(Exception):
        pgcode = "53100"

    class Pg3(Exception):
        sqlstate = "53100"

    class Locked(Exception):
        sqlstate = "55P03"

    full = sqlite3.OperationalError("database or disk is full")
    assert all(storage_full(sa.exc.OperationalError("INSERT", {}, orig)) for orig in (Pg2(), Pg3(), full))
    assert not storage_full(sa.exc.OperationalError("INSERT", {}, Locked()))
    assert not storage_full(sa.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked")))


@pytest.mark.postgres
def test_a_full_postgresql_disk_is_a_retryable_storage_full(tmp_path) -> None:
    psycopg = pytest.importorskip("psycopg")
    from test_bodies import PG_URL, _pg_available

    if not _pg_available():
        pytest.skip("PostgreSQL on 127.0.0.1:5432 is not reachable")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    world = World(tmp_path, PG_URL, schema)
    try:
        name = f"pg-full-{uuid.uuid4().hex[:8]}"
        before = (world.count(accounts), world.count(audit_events))
        hooks = _inject(world.ledger.engine, lambda: psycopg.errors.DiskFull("could not extend file"))
        try:
            reply = world.call("POST", "/v1/desk/accounts", {"name": name})
        finally:
            _remove(world.ledger.engine, hooks)
        assert reply.status == 503 and reply.document["error"]["code"] == "STORAGE_FULL", reply
        assert reply.document["error"]["retryable"] is True
        assert (world.count(accounts), world.count(audit_events)) == before
        retried = world.call("POST", "/v1/desk/accounts", {"name": name})
        assert retried.status == 200, retried
    finally:
        world.close()
        engine = sa.create_engine(PG_URL)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        engine.dispose()
