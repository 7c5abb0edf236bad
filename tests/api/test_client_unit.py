"""The client's retry rules on a scripted transport: what is retried, what is looked up by key,
and what is reported, for each kind of transport failure."""

from __future__ import annotations

import socket
import threading

import pytest

from api_harness import read_request
from ito_assets.api import envelope
from ito_assets.api import transport
from ito_assets.api.client import ApiClient, Endpoint, HttpTransport, NoAnswer, NotDelivered, Reply
from ito_assets.errors import ErrorCode, ItoError

RUN = {"run_id": "run_" + "1" * 26, "state": "queued"}


class Script:
    def __init__(self, *steps):
        self.steps = list(steps)
        self.calls: list[tuple[str, str]] = []

    def request(self, method, path, body):
        self.calls.append((method, path.split("/")[2]))
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


def ok(data: dict) -> Reply:
    return Reply(200, envelope.success(data, live_api_contacted=True))


def failed(code: ErrorCode) -> Reply:
    return Reply(400, envelope.failure(ItoError(code, "x"), live_api_contacted=True))


def client(script: Script) -> ApiClient:
    return ApiClient(script, sleep=lambda _s: None)


def code_of(call) -> tuple[ErrorCode, bool]:
    with pytest.raises(ItoError) as info:
        call()
    return info.value.code, info.value.live_api_contacted


def test_lost_answer_is_recovered_by_key_without_a_second_post() -> None:
    script = Script(NoAnswer(), ok({"action": "train", "fingerprint": "f", "result": {**RUN, "replayed": True}}))
    assert client(script).post_idempotent("/v1/runs", {}, key="k", action="train", fingerprint="f")["replayed"]
    assert script.calls == [("POST", "runs"), ("GET", "idempotency-keys")]


def test_nothing_under_the_key_means_retry_the_post() -> None:
    script = Script(NoAnswer(), failed(ErrorCode.RUN_NOT_FOUND), ok(RUN))
    assert client(script).post_idempotent("/v1/runs", {}, key="k", action="train")["run_id"] == RUN["run_id"]
    assert script.calls == [("POST", "runs"), ("GET", "idempotency-keys"), ("POST", "runs")]


def test_an_answer_for_another_request_is_never_taken_as_ours() -> None:
    script = Script(NoAnswer(), ok({"action": "train", "fingerprint": "other", "result": RUN}))
    call = lambda: client(script).post_idempotent("/v1/runs", {}, key="k", action="train", fingerprint="f")  # noqa: E731
    assert code_of(call) == (ErrorCode.IDEMPOTENCY_KEY_REUSED, True)


def test_failed_lookup_is_outcome_unknown() -> None:
    script = Script(NoAnswer(), NoAnswer(), NoAnswer(), NoAnswer())
    call = lambda: client(script).post_idempotent("/v1/runs", {}, key="k", action="train")  # noqa: E731
    assert code_of(call) == (ErrorCode.OUTCOME_UNKNOWN, True)
    assert script.calls[0] == ("POST", "runs") and ("POST", "runs") not in script.calls[1:]


def test_revoked_during_lookup_stops_at_once() -> None:
    script = Script(NoAnswer(), failed(ErrorCode.CREDENTIAL_REVOKED))
    call = lambda: client(script).post_idempotent("/v1/runs", {}, key="k", action="train")  # noqa: E731
    assert code_of(call) == (ErrorCode.CREDENTIAL_REVOKED, True) and len(script.calls) == 2


def test_undelivered_requests_are_retried_then_unreachable() -> None:
    script = Script(NotDelivered(), NotDelivered(), NotDelivered())
    assert code_of(lambda: client(script).get("/v1/runs/x")) == (ErrorCode.API_UNREACHABLE, False)
    assert len(script.calls) == 3


def test_a_mutation_without_a_key_is_never_retried_after_an_ambiguous_failure() -> None:
    script = Script(NoAnswer())
    assert code_of(lambda: client(script).post("/v1/desk/accounts", {})) == (ErrorCode.OUTCOME_UNKNOWN, True)
    assert len(script.calls) == 1


def test_in_flight_is_retried_with_the_same_key() -> None:
    script = Script(failed(ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT), ok(RUN))
    assert client(script).post_idempotent("/v1/runs", {}, key="k", action="train")["run_id"] == RUN["run_id"]


def test_reads_are_retried_after_a_lost_answer() -> None:
    script = Script(NoAnswer(timed_out=True), ok(RUN))
    assert client(script).get("/v1/runs/x") == RUN


# --- a 408: the request was never read -------------------------------------------------------

def _answering(*answers: bytes):
    """A loopback listener that answers its connections with `answers` in turn; -> (url, request lines)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    lines: list[str] = []

    def serve() -> None:
        for answer in answers:
            conn, _ = listener.accept()
            with conn:
                lines.append(read_request(conn).split(b"\r\n")[0].decode())
                conn.sendall(answer)
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], lines


def _answer(document: dict) -> bytes:
    body = envelope.dumps(document).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)


BUSY = transport.edge_answer(503, ItoError(ErrorCode.SERVER_BUSY, "busy"))


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("refusal", [transport._TIMEOUT_RESPONSE, BUSY], ids=["408", "503 SERVER_BUSY"])
def test_a_request_the_server_never_took_is_sent_again(method, refusal) -> None:
    """The server answers 408 only before it holds a request, and SERVER_BUSY before any route
    reads one (api/transport.py), so even a mutation is sent again, with no lookup by key first;
    before, a GET met a TIMEOUT at once, and a busy server's plain text read as no API at all."""
    port, lines = _answering(refusal, _answer(envelope.success(RUN, live_api_contacted=True)))
    http = HttpTransport(Endpoint(scheme="http", host="127.0.0.1", port=port), None, connect_timeout_s=5, total_timeout_s=5)
    api = ApiClient(http, sleep=lambda _s: None)
    if method == "GET":
        assert api.get("/v1/runs/x") == RUN
    else:
        assert api.post_idempotent("/v1/runs", {}, key="k" * 8, action="train", fingerprint="f") == RUN
    assert [line.split()[0] for line in lines] == [method, method]


@pytest.mark.parametrize("method", ["GET", "POST", "keyed POST"])
def test_busy_on_every_attempt_is_server_busy_not_an_unreachable_api(method) -> None:
    port, lines = _answering(BUSY, BUSY, BUSY)
    http = HttpTransport(Endpoint(scheme="http", host="127.0.0.1", port=port), None, connect_timeout_s=5, total_timeout_s=5)
    api = ApiClient(http, sleep=lambda _s: None)
    calls = {"GET": lambda: api.get("/v1/runs/x"), "POST": lambda: api.post("/v1/runs", {}),
             "keyed POST": lambda: api.post_idempotent("/v1/runs", {}, key="k" * 8, action="train")}
    assert code_of(calls[method]) == (ErrorCode.SERVER_BUSY, True)
    assert len(lines) == 3


@pytest.mark.parametrize("answer, code", [
    # A proxy's own 503 is no envelope: not the API speaking.
    (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 19\r\n"
     b"connection: close\r\n\r\nService Unavailable", ErrorCode.API_UNREACHABLE),
    # A route's 503 is the app's answer to a request it read: raised as it is.
    (transport.edge_answer(503, ItoError(ErrorCode.STORAGE_FULL, "full")), ErrorCode.STORAGE_FULL),
])
def test_other_503s_are_not_taken_for_a_busy_server(answer, code) -> None:
    port, lines = _answering(*[answer] * 3)
    http = HttpTransport(Endpoint(scheme="http", host="127.0.0.1", port=port), None, connect_timeout_s=5, total_timeout_s=5)
    api = ApiClient(http, sleep=lambda _s: None)
    assert code_of(lambda: api.get("/v1/runs/x"))[0] is code
    assert len(lines) == (3 if code is ErrorCode.API_UNREACHABLE else 1)
