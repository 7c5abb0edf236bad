"""Races and lost answers against real servers: 64 client processes under one key, 64 keys under
one confirmation, a key still in flight, and an answer dropped after the commit."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import threading
from pathlib import Path

import pytest

from api_harness import Client, Server, environment, map_in_forked_callers, read_request
from ito_assets.api import cli
from ito_assets.control.fingerprint import request_fingerprint

NUM_CALLERS = 64


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A server whose bookings hold many runs, so 64 keys race for the confirmation alone."""
    root = Path(os.path.realpath(tmp_path_factory.mktemp("wide")))
    server = Server(root, ITO_MAX_CONCURRENT_RUNS_PER_BOOKING=str(NUM_CALLERS))
    yield Client(server, root / "client")
    server.stop()


def _call(job: tuple[dict, list[str]]) -> dict:
    env, argv = job
    with environment(env):
        document, _status = cli.run(argv)
    document.pop("_text", None)
    return document


def _race(client: Client, booking: str, manifest: str, ref: str, keys: list[str]) -> list[dict]:
    env = client.env("account", ITO_TIMEOUT_S="60")
    jobs = [(env, ["train", "--booking", booking, "--manifest", manifest, "--confirmation-ref", ref,
                   "--idempotency-key", key, "--json"]) for key in keys]
    return map_in_forked_callers(_call, jobs, NUM_CALLERS)


def _count(server: Server, sql: str, *args) -> int:
    with sqlite3.connect(server.ledger_path, timeout=30) as db:
        return db.execute(sql, args).fetchone()[0]


@pytest.mark.slow
def test_64_processes_one_key_one_run(wide) -> None:
    booking, manifest = wide.booking(), wide.manifest()
    ref = wide.confirm_train(booking, manifest)
    results = _race(wide, booking, manifest, ref, ["race-same-key-01"] * NUM_CALLERS)
    assert all(r["ok"] for r in results), [r["error"] for r in results if not r["ok"]][:3]
    assert len({r["data"]["run_id"] for r in results}) == 1
    assert sum(not r["data"]["replayed"] for r in results) == 1
    assert _count(wide.server, "SELECT count(*) FROM runs WHERE booking_id = ?", booking) == 1


@pytest.mark.slow
def test_64_keys_one_confirmation_consumed_once(wide) -> None:
    booking, manifest = wide.booking(), wide.manifest()
    ref = wide.confirm_train(booking, manifest)
    results = _race(wide, booking, manifest, ref, [f"race-key-{i:04d}" for i in range(NUM_CALLERS)])
    assert sum(r["ok"] for r in results) == 1
    assert {r["error"]["code"] for r in results if not r["ok"]} == {"CONFIRMATION_CONSUMED"}
    assert _count(wide.server, "SELECT count(*) FROM runs WHERE booking_id = ?", booking) == 1
    assert _count(wide.server, "SELECT count(*) FROM confirmations WHERE booking_id = ? "
                               "AND consumed_at IS NOT NULL", booking) == 1


def test_key_in_flight_is_reported_and_never_doubles(tmp_path) -> None:
    root = Path(os.path.realpath(tmp_path))
    server = Server(root, ITO_LEDGER_LOCK_TIMEOUT_S="0.3")
    try:
        client = Client(server, root / "client")
        booking, manifest = client.booking(), client.manifest()
        ref = client.confirm_train(booking, manifest)
        holder = sqlite3.connect(server.ledger_path, timeout=30, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the ledger longer than the lock timeout
        try:
            document = client.train(booking, manifest, ref, "in-flight-key-01")
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert document["error"]["code"] == "IDEMPOTENCY_KEY_IN_FLIGHT" and document["error"]["retryable"]
        retried = client.train(booking, manifest, ref, "in-flight-key-01")
        assert retried["ok"] and not retried["data"]["replayed"]
        assert _count(server, "SELECT count(*) FROM runs") == 1
    finally:
        server.stop()


class DroppingProxy:
    """Forwards HTTP/1.1 exchanges (Connection: close) to the server, but swallows the answer to
    the first request to `dropped` (`POST /v1/runs` by default) after the server has sent it: the
    run is committed, the client sees the connection close without a byte."""

    def __init__(self, upstream: str, dropped: str = "POST /v1/runs"):
        self.dropped = dropped + " "
        host, port = upstream.split("//")[1].split(":")
        self.upstream = (host, int(port))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.num_dropped = 0
        self.requests: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            request = read_request(conn)
            line = request.split(b"\r\n", 1)[0].decode()
            self.requests.append(line)
            with socket.create_connection(self.upstream) as up:
                up.sendall(request)
                answer = b""
                while chunk := up.recv(65536):
                    answer += chunk
            if line.startswith(self.dropped) and self.num_dropped == 0:
                self.num_dropped += 1
                return  # the server committed and answered; the client never hears it
            conn.sendall(answer)

    def close(self) -> None:
        self.listener.close()


def test_answer_dropped_after_commit_is_recovered_by_key(api) -> None:
    booking, manifest = api.booking(), api.manifest()
    ref = api.confirm_train(booking, manifest)
    proxy = DroppingProxy(api.server.url)
    try:
        document = api.train(booking, manifest, ref, "dropped-answer-01", ITO_API_URL=proxy.url)
    finally:
        proxy.close()
    assert proxy.num_dropped == 1
    assert document["ok"], document
    assert document["data"]["replayed"] is True  # found by key, not created again
    assert [r.split()[0] + " " + r.split()[1].split("/")[2] for r in proxy.requests] == [
        "POST runs", "GET idempotency-keys"]
    assert _count(api.server, "SELECT count(*) FROM runs WHERE booking_id = ?", booking) == 1


def test_a_lost_answer_is_never_another_cleanups_report(api) -> None:
    """A cleanup that would release a booking, under a key a plain cleanup used: the server refuses
    it, and with that answer lost, the lookup by key finds the plain cleanup's report, which is not
    this request's outcome (the booking was never released)."""
    booking, key = api.booking(), api.unique("clean-key")

    def approved(*argv: str) -> str:
        ref = api.ok("confirm", "request", "--action", *argv)["confirmation_ref"]
        api.approve(ref)
        return ref

    plain = api.ok("cleanup", "--confirmation-ref", approved("cleanup"), "--idempotency-key", key)
    assert plain["bookings_changed"] == []
    proxy = DroppingProxy(api.server.url, "POST /v1/cleanup")
    try:
        document = api.ito("cleanup", "--confirmation-ref", approved("cleanup"), "--idempotency-key", key,
                           "--release-booking", booking, "--release-confirmation-ref",
                           approved("release", "--booking", booking), ITO_API_URL=proxy.url)
        assert proxy.num_dropped == 1
        assert document["error"]["code"] == "IDEMPOTENCY_KEY_REUSED", document
        # The same plain cleanup again, its answer lost too, is recovered as the plain one's replay,
        # also where the key was recorded with the fingerprint that bound the account.
        for recorded in ("as now", "account-bound"):
            if recorded == "account-bound":
                with sqlite3.connect(api.server.ledger_path, timeout=30) as db:
                    db.execute("UPDATE idempotency_keys SET fingerprint = ? WHERE key = ?", (request_fingerprint(
                        "cleanup", account_id=plain["account_id"], release_booking_id=None), key))
            proxy.num_dropped = 0
            again = api.ito("cleanup", "--confirmation-ref", approved("cleanup"), "--idempotency-key", key,
                            ITO_API_URL=proxy.url)
            assert proxy.num_dropped == 1
            assert again["ok"] and again["data"] == {**plain, "replayed": True}, (recorded, again)
    finally:
        proxy.close()
    listed = api.ok("desk", "bookings", "list", token="desk")["bookings"]
    assert next(b for b in listed if b["booking_id"] == booking)["state"] != "released"


def _termination_is_default(_job) -> bool:
    return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_forked_callers_die_on_sigterm_even_after_dagster_remapped_it() -> None:
    # What Dagster's in-process execution leaves in a test worker: SIGTERM raises KeyboardInterrupt.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        assert map_in_forked_callers(_termination_is_default, range(4), 2) == [True] * 4
    finally:
        signal.signal(signal.SIGTERM, previous)
